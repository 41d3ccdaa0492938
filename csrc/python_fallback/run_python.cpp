#include "python_fallback/run_python.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_turn.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "message/payload.h"

namespace py = pybind11;

namespace torchrpc::python_fallback {

std::shared_ptr<py::object> sharedPyObject(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* p) {
    if (Py_IsInitialized()) {
      Gil gil;
      delete p;
    } else {
      p->release();  // the interpreter is gone; nothing to drop
      delete p;
    }
  });
}

py::tuple callPythonHandler(const py::object& handler, Message& request, int callerRank) {
  py::list tensors;
  for (auto& t : request.tensors) tensors.append(py::cast(std::move(t)));
  auto view = py::memoryview::from_memory(request.payload.data(),
                                          static_cast<py::ssize_t>(request.payload.size()));
  return handler(view, tensors, callerRank);
}

RemoteException remoteExceptionFrom(const py::tuple& out, const std::string& worker) {
  return RemoteException{out[1].cast<std::string>(), out[2].cast<std::string>(),
                         out[3].cast<std::string>(), out[4].cast<std::string>(), worker};
}

std::shared_ptr<script_dispatch::Callee> calleeFromPython(const py::handle& scriptFunction) {
  if (py::hasattr(scriptFunction, "_c")) {  // a torch.jit.ScriptModule: its forward
    return script_dispatch::moduleMethodCallee(py::cast<torch::jit::Module>(scriptFunction.attr("_c")),
                                               "forward");
  }
  auto f = py::cast<torch::jit::StrongFunctionPtr>(scriptFunction);
  return script_dispatch::scriptFunctionCallee(f.cu_, f.function_);
}

namespace {

Message bridgeFailure(uint64_t id, const std::string& what, const std::string& worker) {
  // The handler reports user errors as ("err", ...); this is a bridge bug.
  return exceptionMessage(id, RemoteException{"RuntimeError", "torchrpc's Python handler failed: " + what,
                                              "", "<python call>", worker});
}

}  // namespace

Message pythonResponse(const py::handle& outcome, uint64_t id, const std::string& worker) {
  py::tuple out = py::reinterpret_borrow<py::tuple>(outcome);
  if (out[0].cast<std::string>() == "ok") {
    Message response;
    response.type = MessageType::kPythonRet;
    response.id = id;
    response.payload = out[1].cast<std::string>();
    for (auto t : out[2]) response.tensors.push_back(py::cast<at::Tensor>(t));
    return response;
  }
  return exceptionMessage(id, remoteExceptionFrom(out, worker));
}

void runAndRespond(uint64_t id, const std::string& worker, const Agent::Responder& respond,
                   const std::function<py::object()>& handler, const OutcomeResponse& other) {
  Message response;
  {
    PythonTurn turn;  // before the GIL: see python_turn.h
    Gil gil;
    try {
      py::tuple out = handler();
      const auto kind = out[0].cast<std::string>();
      if (kind == "async") {
        // @async_execution: respond when the function's future completes
        // (its value is already an outcome tuple); this thread is free now.
        auto future = py::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(out[1])->fut;
        future->addCallback([id, worker, respond](c10::ivalue::Future& done) {
          Message late;
          {
            Gil gil;
            try {
              late = done.hasError() ? bridgeFailure(id, done.tryRetrieveErrorMessage(), worker)
                                     : pythonResponse(torch::jit::toPyObject(done.value()), id, worker);
            } catch (const std::exception& e) {
              late = bridgeFailure(id, e.what(), worker);
            }
          }
          respond(std::move(late));
        });
        return;
      }
      if (kind == "ok" || kind == "err") {
        response = pythonResponse(out, id, worker);
      } else {
        TORCH_CHECK(other, "unknown outcome '", kind, "'");
        response = other(out);
      }
    } catch (const std::exception& e) {
      response = bridgeFailure(id, e.what(), worker);
    }
  }
  respond(std::move(response));
}

void installPythonHandler(Agent& agent, py::object handler) {
  auto fn = sharedPyObject(std::move(handler));
  const std::string worker = agent.options().name;
  agent.setHandler(MessageType::kPythonCall, [fn, worker](Message&& request, int callerRank,
                                                          Agent::Responder respond) {
    runAndRespond(request.id, worker, respond, [&] { return callPythonHandler(*fn, request, callerRank); });
  });
}

void installScriptResolver(Agent& agent, py::object resolver) {
  auto fn = sharedPyObject(std::move(resolver));
  agent.registry().setResolver(
      [fn](const std::string& name, const std::string& hint) -> std::shared_ptr<script_dispatch::Callee> {
        Gil gil;
        try {
          py::object found = (*fn)(name, hint);
          if (found.is_none()) return nullptr;
          return calleeFromPython(found);
        } catch (py::error_already_set& e) {
          // Resolution failed (e.g. the module hint does not import): the caller
          // gets "no TorchScript function named ..." with the hint in it.
          return nullptr;
        }
      });
}

}  // namespace torchrpc::python_fallback
