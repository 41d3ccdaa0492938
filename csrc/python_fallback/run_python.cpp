#include "python_fallback/run_python.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/utils/pybind.h>

#include "message/payload.h"

namespace py = pybind11;

namespace torchrpc::python_fallback {

namespace {

// A py::object that may be destroyed on any thread: it takes the GIL to drop
// its reference.
std::shared_ptr<py::object> sharedPyObject(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* p) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete p;
    } else {
      p->release();  // the interpreter is gone; nothing to drop
      delete p;
    }
  });
}

}  // namespace

std::shared_ptr<script_dispatch::Callee> calleeFromPython(const py::handle& scriptFunction) {
  auto f = py::cast<torch::jit::StrongFunctionPtr>(scriptFunction);
  return script_dispatch::scriptFunctionCallee(f.cu_, f.function_);
}

void installPythonHandler(Agent& agent, py::object handler) {
  auto fn = sharedPyObject(std::move(handler));
  const std::string worker = agent.options().name;
  agent.setHandler(MessageType::kPythonCall, [fn, worker](Message&& request, int callerRank,
                                                          Agent::Responder respond) {
    Message response;
    response.id = request.id;
    {
      py::gil_scoped_acquire gil;
      try {
        py::list tensors;
        for (auto& t : request.tensors) tensors.append(py::cast(std::move(t)));
        auto view = py::memoryview::from_memory(request.payload.data(),
                                                static_cast<py::ssize_t>(request.payload.size()));
        py::tuple out = (*fn)(view, tensors, callerRank);
        if (out[0].cast<std::string>() == "ok") {
          response.type = MessageType::kPythonRet;
          response.payload = out[1].cast<std::string>();
          for (auto t : out[2]) response.tensors.push_back(py::cast<at::Tensor>(t));
        } else {
          response = exceptionMessage(
              request.id, RemoteException{out[1].cast<std::string>(), out[2].cast<std::string>(),
                                          out[3].cast<std::string>(), out[4].cast<std::string>(),
                                          worker});
        }
      } catch (py::error_already_set& e) {
        // The handler reports user errors as ("err", ...); this is a bridge bug.
        response = exceptionMessage(
            request.id, RemoteException{"RuntimeError", std::string("torchrpc's Python handler failed: ") +
                                                            e.what(),
                                        "", "<python call>", worker});
      } catch (const std::exception& e) {
        response = exceptionMessage(
            request.id, RemoteException{"RuntimeError", e.what(), "", "<python call>", worker});
      }
    }
    respond(std::move(response));
  });
}

void installScriptResolver(Agent& agent, py::object resolver) {
  auto fn = sharedPyObject(std::move(resolver));
  agent.registry().setResolver(
      [fn](const std::string& name, const std::string& hint) -> std::shared_ptr<script_dispatch::Callee> {
        py::gil_scoped_acquire gil;
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
