#pragma once

// Script and builtin calls: their wire format and how the callee runs them.
// Everything here is C++ only and never takes the GIL.
//
//   SCRIPT_CALL  payload = (name: str, module_hint: str, args: tuple, kwargs: Dict[str, Any],
//                           shipped: None or (format, sha1, code), see shipped_code.h)
//   BUILTIN_CALL payload = (schema_name: str, args: tuple)   e.g. "aten::add.Tensor"
//   response     SCRIPT_RET (the result IValue) or EXCEPTION
//
// A caller that holds the function (Python passing a ScriptFunction) matches
// the arguments to its schema itself and sends no kwargs; a caller that only
// names it (the TorchScript ops, eager calls by name) sends args and kwargs
// as given. Either way the callee checks them against the schema and fills in
// defaults, so a wrong or stale caller gets a TypeError naming the function
// and the argument, never a crash.

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/stack.h>

#include "message/message.h"
#include "message/reply.h"
#include "script_dispatch/callee_policy.h"
#include "script_dispatch/registry.h"

namespace torchrpc::script_dispatch {

// The remote exception type of a call whose function the callee cannot find
// (torchrpc.errors.UnknownFunctionError); a caller holding the function
// resends it with its code.
inline constexpr const char* kUnknownFunction = "torchrpc.errors.UnknownFunctionError";

// `asyncExecution`: the caller marked the function @async_execution, so the
// callee refuses a result that is not a Future (as upstream).
message::Message scriptCallMessage(const std::string& name, const std::string& moduleHint,
                          std::vector<c10::IValue> stack, c10::impl::GenericDict kwargs,
                          c10::IValue shipped = c10::IValue(), bool asyncExecution = false);
message::Message builtinCallMessage(const std::string& schemaName, std::vector<c10::IValue> stack);

// Runs a SCRIPT_CALL or BUILTIN_CALL and answers `reply` once with the result
// or the error, possibly later from another thread (async callee). `policy`
// decides which names may run, whether unregistered names are resolved and
// whether shipped code is compiled.
void run(message::Message&& request, Registry& registry, const CalleePolicy& policy, const TaskLauncher& launcher,
         const std::string& workerName, const message::Reply& reply);

// True on a thread that runs a TorchScript call run() started, or one of its
// continuations (through `launcher`): an interpreter of torchrpc's own, which
// Python never holds. jit_ops/rpc_ops.cpp completes the futures of other
// callers (Python, a C++ program) off the I/O thread.
bool inDispatch();

}  // namespace torchrpc::script_dispatch
