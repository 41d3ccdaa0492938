#include "python_fallback/run_python.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_turn.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "common/when_all.h"
#include "message/payload.h"
#include "message/plain_codec.h"
#include "python_fallback/python_rref.h"
#include "rref/rref.h"

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

namespace {

// A plain PYTHON_CALL (plainPythonCallMessage) as the handler's decoded call,
// (digest: bytes, None, name, args, kwargs); a peer's malformed one is refused.
py::tuple plainCall(message::Message& request) {
  const c10::IValue call = message::messageIValue(request);
  request.tensors.clear();  // `call` holds them, then Python's objects (as callPythonHandler's)
  const auto el = call.isTuple() ? call.toTupleRef().elements().asArrayRef() : c10::ArrayRef<c10::IValue>();
  TORCH_CHECK(el.size() == 4 && el[0].isString() && el[1].isString() && el[2].isTuple() && el[3].isGenericDict() &&
                  el[3].toGenericDict().keyType()->kind() == c10::TypeKind::StringType,
              "malformed PYTHON_CALL payload: expected (digest: str, name: str, args: tuple, kwargs: Dict[str, Any]),"
              " got ", call.type()->repr_str());
  return py::make_tuple(py::bytes(el[0].toStringRef()), py::none(), el[1].toStringRef(),
                        torch::jit::toPyObject(el[2]), torch::jit::toPyObject(el[3]));
}

}  // namespace

py::tuple callPythonHandler(const py::object& handler, message::Message& request, int callerRank) {
  if (message::isPlain(request.payload)) return handler(plainCall(request), py::none(), callerRank);
  py::list tensors;
  for (auto& t : request.tensors) tensors.append(py::cast(t));
  // Python's objects own them now: a reference left in the request would be
  // dropped later on the pool thread, and take the GIL to decref its object.
  request.tensors.clear();
  auto view = py::memoryview::from_memory(request.payload.data(),
                                          static_cast<py::ssize_t>(request.payload.size()));
  return handler(view, tensors, callerRank);
}

message::RemoteException remoteExceptionFrom(const py::tuple& out, const std::string& worker) {
  return message::RemoteException{out[1].cast<std::string>(), out[2].cast<std::string>(),
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

message::Message bridgeFailure(uint64_t id, const std::string& what, const std::string& worker) {
  // The handler reports user errors as ("err", ...); this is a bridge bug.
  return message::exceptionMessage(id, message::RemoteException{"RuntimeError", "torchrpc's Python handler failed: " + what,
                                              "", "<python call>", worker});
}

}  // namespace

message::Message pythonResponse(const py::handle& outcome, uint64_t id, const std::string& worker) {
  py::tuple out = py::reinterpret_borrow<py::tuple>(outcome);
  if (out[0].cast<std::string>() == "ok") {
    message::Message response;
    response.type = message::MessageType::kPythonRet;
    response.id = id;
    response.payload = out[1].cast<std::string>();
    // Detached here, under the GIL: the message then holds no tensor with a
    // Python object, whose last C++ reference would take the GIL again when
    // the response is sent (torch increfs/decrefs it on the 1->2 and 2->1
    // steps). One that requires grad stays as it is, for autograd.
    for (auto t : out[2]) {
      at::Tensor tensor = py::cast<at::Tensor>(t);
      response.tensors.push_back(tensor.requires_grad() ? tensor : tensor.detach());
    }
    return response;
  }
  return message::exceptionMessage(id, remoteExceptionFrom(out, worker));
}

message::Message valueResponse(const py::handle& value, const py::handle& label, const py::object& encoder,
                               uint64_t id, const std::string& worker) {
  if (auto plain = plainIValue(value, gradsRecorded())) {
    return message::ivalueMessage(message::MessageType::kScriptRet, id, c10::ivalue::Tuple::create({std::move(*plain)}));
  }
  return pythonResponse(encoder(value, label), id, worker);
}

void runAndRespond(const std::string& worker, const message::Reply& reply, const std::function<py::object()>& handler,
                   const py::object& encoder, const OnWait& onWait) {
  const uint64_t id = reply.id();
  message::Message response;
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
        future->addCallback([id, worker, reply](c10::ivalue::Future& done) {
          message::Message late;
          {
            Gil gil;
            try {
              late = done.hasError() ? bridgeFailure(id, done.tryRetrieveErrorMessage(), worker)
                                     : pythonResponse(torch::jit::toPyObject(done.value()), id, worker);
            } catch (const std::exception& e) {
              late = bridgeFailure(id, e.what(), worker);
            }
          }
          reply(std::move(late));
        });
        return;
      }
      if (kind == "wait" && onWait) {
        onWait(out);
        return;
      }
      if (kind == "value") {
        response = valueResponse(out[1], out[2], encoder, id, worker);
      } else {
        TORCH_CHECK(kind == "ok" || kind == "err", "unknown outcome '", kind, "'");
        response = pythonResponse(out, id, worker);
      }
    } catch (const std::exception& e) {
      response = bridgeFailure(id, e.what(), worker);
    }
  }
  reply(std::move(response));
}

namespace {

message::RemoteException handlerFailure(const std::string& why, const std::string& worker) {
  return message::RemoteException{"RuntimeError", "torchrpc's Python remote() handler failed: " + why, "",
                         "<python call>", worker};
}

// Answers a reply that wants the value with an ("ok", value) / ("err", ...)
// outcome tuple. Needs the GIL; `reply` is answered after it is released.
struct Outcome {
  c10::IValue value;
  std::optional<message::RemoteException> error;

  static Outcome of(const py::tuple& out, const std::string& worker) {
    Outcome o;
    if (out[0].cast<std::string>() == "ok") {
      o.value = pyObjectIValue(py::reinterpret_borrow<py::object>(out[1]));
    } else {
      o.error = remoteExceptionFrom(out, worker);
    }
    return o;
  }

  // Call without the GIL: completing a value runs fetch callbacks, which take it.
  void answer(const message::Reply& reply) {
    if (error) {
      reply.error(*error);
    } else {
      reply.value(std::move(value));
    }
  }
};

// The owner's run of a remote()'s Python call: the value stays a Python object.
void runForValue(const std::function<py::object()>& handler, const std::string& worker, const message::Reply& reply,
                 const OnWait& onWait) {
  Outcome now;
  c10::intrusive_ptr<c10::ivalue::Future> later;
  {
    PythonTurn turn;  // before the GIL: see python_turn.h
    Gil gil;
    try {
      py::tuple out = handler();
      if (out[0].cast<std::string>() == "wait") {
        onWait(out);
        return;
      }
      if (out[0].cast<std::string>() == "async") {
        // @async_execution (e.g. rref.remote().method()): the value is what
        // the function's future gives, as an outcome; no thread waits for it.
        later = py::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(out[1])->fut;
      } else {
        now = Outcome::of(out, worker);
      }
    } catch (const std::exception& e) {
      now.error = handlerFailure(e.what(), worker);
    }
  }
  if (!later) {
    now.answer(reply);
    return;
  }
  later->addCallback([reply, worker](c10::ivalue::Future& done) {
    Outcome late;
    {
      Gil gil;
      try {
        if (done.hasError()) {
          late.error = handlerFailure(done.tryRetrieveErrorMessage(), worker);
        } else {
          late = Outcome::of(torch::jit::toPyObject(done.value()), worker);
        }
      } catch (const std::exception& e) {
        late.error = handlerFailure(e.what(), worker);
      }
    }
    late.answer(reply);
  });
}

// Calls `then` (from any thread) once the owners of `rrefs` (a list of
// RRefHandle) have confirmed them, or failed to. Needs the GIL.
void whenConfirmed(const py::handle& rrefs, std::function<void()> then) {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> creations;
  for (const auto& r : py::cast<std::vector<std::shared_ptr<rref::RRef>>>(rrefs)) {
    if (auto user = std::dynamic_pointer_cast<rref::UserRRef>(r)) creations.push_back(user->creation());
  }
  common::whenAll(std::move(creations))->addCallback([then = std::move(then)](c10::ivalue::Future&) { then(); });
}

// Runs a PYTHON_CALL's handler, or a waiting call's continuation, and answers `reply`.
void runPythonCall(agent::Agent& agent, const std::string& worker, const message::Reply& reply,
                   const std::shared_ptr<py::object>& encoder, const std::function<py::object()>& handler) {
  OnWait onWait = [&agent, worker, reply, encoder](const py::tuple& out) {
    auto run = sharedPyObject(py::reinterpret_borrow<py::object>(out[2]));
    whenConfirmed(out[1], [&agent, worker, reply, encoder, run, scope = agent::CallScope::current()] {
      agent.continueOnPool(scope, [&agent, worker, reply, encoder, run] {
        runPythonCall(agent, worker, reply, encoder, [&] { return (*run)(); });
      });
    });
  };
  if (reply.wantsValue()) {
    runForValue(handler, worker, reply, onWait);
  } else {
    runAndRespond(worker, reply, handler, *encoder, onWait);
  }
}

}  // namespace

void installPythonHandler(agent::Agent& agent, py::object call, py::object remote, py::object encoder) {
  auto forCaller = sharedPyObject(std::move(call));
  auto forValue = sharedPyObject(std::move(remote));
  auto encode = sharedPyObject(std::move(encoder));
  const std::string worker = agent.options().name;
  agent.setHandler(message::MessageType::kPythonCall, [&agent, forCaller, forValue, encode, worker](
                                                          message::Message&& request, int callerRank,
                                                          message::Reply reply) {
    const auto& handler = reply.wantsValue() ? *forValue : *forCaller;
    runPythonCall(agent, worker, reply, encode, [&] { return callPythonHandler(handler, request, callerRank); });
  });
}

void installScriptResolver(agent::Agent& agent, py::object resolver) {
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
