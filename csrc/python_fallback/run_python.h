#pragma once

// The Python bridge: the only C++ that takes the GIL. It installs, on an
// Agent, the handler for PYTHON_CALL (run a cloudpickled callable under the
// GIL, answer PYTHON_RET or EXCEPTION) and the resolver that finds a
// TorchScript function the first time a caller names it.

#include <pybind11/pybind11.h>

#include "agent/agent.h"
#include "message/payload.h"

namespace torchrpc::python_fallback {

// The PYTHON_CALL handler. Both Python functions are called as
// f(payload: memoryview, tensors: list[Tensor], caller_rank: int), or for a
// plain call as f((digest, None, name, args, kwargs), None, caller_rank)
// (callPythonHandler):
//   call    for a caller, returns ("value", result, label) (answered as
//           valueResponse does, with `encoder`), ("ok", payload: bytes,
//           tensors: list[Tensor]),
//           or ("err", type: str, message: str, traceback: str, function: str),
//           or ("async", future of an "ok" or "err" tuple);
//   remote  for an RRef's owner, which keeps the value (a reply that wants
//           it, see message/reply.h), returns ("ok", value) or the "err"
//           tuple, or ("async", future of such a tuple).
// Either may return ("wait", rrefs: list[RRefHandle], run): the call's
// arguments hold RRefs that their owners have not confirmed yet. As upstream,
// it runs once they have: run() then, on the pool and under the call's scope,
// returns one of the outcomes above (or "wait" again).
// encoder(value, label) pickles what is not plain: ("ok", payload, tensors) or the "err" tuple.
void installPythonHandler(agent::Agent& agent, pybind11::object call, pybind11::object remote,
                          pybind11::object encoder);

// resolver(name: str, module_hint: str) -> torch.jit.ScriptFunction | None
void installScriptResolver(agent::Agent& agent, pybind11::object resolver);

// A ScriptFunction, or a ScriptModule (its forward), as a GIL-free callee.
std::shared_ptr<script_dispatch::Callee> calleeFromPython(const pybind11::handle& scriptFunction);

// A py::object that may be destroyed on any thread: it takes the GIL to drop
// its reference.
std::shared_ptr<pybind11::object> sharedPyObject(pybind11::object obj);

// Calls handler(payload as memoryview, tensors, caller_rank), as every
// Python handler is called (the payload is viewed, not copied); a plain
// call (plainPythonCallMessage) as handler((digest, None, name, args,
// kwargs), None, caller_rank). Needs the GIL.
pybind11::tuple callPythonHandler(const pybind11::object& handler, message::Message& request, int callerRank);

// The exception of a handler's ("err", type, message, traceback, function).
message::RemoteException remoteExceptionFrom(const pybind11::tuple& outcome, const std::string& worker);

// The response for an ("ok", payload, tensors) or ("err", ...) outcome:
// PYTHON_RET or EXCEPTION. Needs the GIL.
message::Message pythonResponse(const pybind11::handle& outcome, uint64_t id, const std::string& worker);

// The response carrying a Python value: a plain one (plainIValue) as an
// IValue, a SCRIPT_RET 1-tuple, with no pickle either way; any other as
// pythonResponse(encoder(value, label)). Needs the GIL.
message::Message valueResponse(const pybind11::handle& value, const pybind11::handle& label,
                               const pybind11::object& encoder, uint64_t id, const std::string& worker);

// Runs `handler` in a Python turn under the GIL and answers `reply` once with
// its outcome: ("value", result, label) (valueResponse with `encoder`),
// ("ok", ...) and ("err", ...) at once, ("async", future) when the future (of
// an "ok" or "err" outcome) completes. `onWait`, if given, takes a ("wait",
// ...) outcome (see installPythonHandler) and answers later; an outcome none
// of them knows, or an exception, is answered as the bridge's failure.
using OnWait = std::function<void(const pybind11::tuple& outcome)>;
void runAndRespond(const std::string& worker, const message::Reply& reply, const std::function<pybind11::object()>& handler,
                   const pybind11::object& encoder, const OnWait& onWait = nullptr);

}  // namespace torchrpc::python_fallback
