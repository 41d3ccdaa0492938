#include "python_fallback/python_rref.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_turn.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "message/payload.h"
#include "python_fallback/run_python.h"

namespace py = pybind11;

namespace torchrpc::python_fallback {

namespace {

// A Python object inside an IValue. (torch's ConcretePyObjectHolder would do,
// but its type inference uses a symbol libtorch_python does not export.) The
// value only ever goes back to Python: it has no TorchScript type.
class PyValueHolder final : public c10::ivalue::PyObjectHolder {
 public:
  explicit PyValueHolder(py::object obj) : obj_(std::move(obj)) {}
  ~PyValueHolder() override {
    if (Py_IsInitialized()) {
      Gil gil;
      obj_ = py::object();
    } else {
      obj_.release();  // the interpreter is gone; nothing to drop
    }
  }
  PyObject* getPyObject() override { return obj_.ptr(); }
  c10::InferredType tryToInferType() override {
    return c10::InferredType("a Python value held by a torchrpc RRef has no TorchScript type");
  }
  c10::IValue toIValue(const c10::TypePtr& type, std::optional<int32_t>) override {
    TORCH_CHECK(false, "a Python value held by a torchrpc RRef cannot be used as TorchScript type ",
                type->repr_str());
  }
  std::string toStr() override {
    Gil gil;
    return py::str(obj_).cast<std::string>();
  }
  std::vector<at::Tensor> extractTensors() override { return {}; }  // CPU only: no streams to sync

 private:
  py::object obj_;
};

// What a remote() handler gave: the owner's value, or the error.
struct Outcome {
  c10::IValue value;
  std::optional<RemoteException> error;

  // Call without the GIL.
  void deliver(const std::function<void(c10::IValue)>& onValue,
               const std::function<void(const RemoteException&)>& onError) {
    if (error) {
      onError(*error);
    } else {
      onValue(std::move(value));
    }
  }
};

RemoteException handlerFailure(const std::string& why, const std::string& worker) {
  return RemoteException{"RuntimeError", "torchrpc's Python remote() handler failed: " + why, "",
                         "<python call>", worker};
}

// An ("ok", value) / ("err", ...) outcome tuple. Needs the GIL.
Outcome decodeOutcome(const py::tuple& out, const std::string& worker) {
  Outcome o;
  if (out[0].cast<std::string>() == "ok") {
    o.value = pyObjectIValue(py::reinterpret_borrow<py::object>(out[1]));
  } else {
    o.error = remoteExceptionFrom(out, worker);
  }
  return o;
}

// The element type of a plain list or dict value: that of its first element.
c10::TypePtr elementType(const py::handle& first) {
  if (THPVariable_Check(first.ptr())) return c10::TensorType::get();
  if (PyBool_Check(first.ptr())) return c10::BoolType::get();
  if (PyLong_Check(first.ptr())) return c10::IntType::get();
  if (PyFloat_Check(first.ptr())) return c10::FloatType::get();
  if (PyUnicode_Check(first.ptr())) return c10::StringType::get();
  TORCH_CHECK(false, "not a plain list element: ", py::str(first.get_type()).cast<std::string>());
}

}  // namespace

c10::IValue plainIValue(const py::handle& obj) {
  PyObject* p = obj.ptr();
  if (THPVariable_Check(p)) return THPVariable_Unpack(p);
  if (p == Py_None) return c10::IValue();
  if (PyBool_Check(p)) return p == Py_True;
  if (PyLong_Check(p)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
    TORCH_CHECK(overflow == 0, "an int beyond 64 bits is not a plain value");
    return static_cast<int64_t>(v);
  }
  if (PyFloat_Check(p)) return PyFloat_AS_DOUBLE(p);
  if (PyUnicode_Check(p)) return obj.cast<std::string>();
  if (PyTuple_Check(p)) {
    std::vector<c10::IValue> items;
    items.reserve(PyTuple_GET_SIZE(p));
    for (auto item : py::reinterpret_borrow<py::tuple>(obj)) items.push_back(plainIValue(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (PyList_Check(p)) {
    auto list = py::reinterpret_borrow<py::list>(obj);
    TORCH_CHECK(!list.empty(), "an empty list is not a plain value");
    c10::impl::GenericList out(elementType(list[0]));
    out.reserve(list.size());
    for (auto item : list) out.push_back(plainIValue(item));
    return out;
  }
  if (PyDict_Check(p)) {
    auto dict = py::reinterpret_borrow<py::dict>(obj);
    TORCH_CHECK(!dict.empty(), "an empty dict is not a plain value");
    c10::impl::GenericDict out(c10::StringType::get(), elementType(dict.begin()->second));
    for (auto item : dict) out.insert(item.first.cast<std::string>(), plainIValue(item.second));
    return out;
  }
  TORCH_CHECK(false, "not a plain value: ", py::str(obj.get_type()).cast<std::string>());
}

c10::IValue pyObjectIValue(py::object obj) {
  c10::intrusive_ptr<c10::ivalue::PyObjectHolder> holder = c10::make_intrusive<PyValueHolder>(std::move(obj));
  return c10::IValue(std::move(holder));
}

void installRRefPython(rref::RRefContext& ctx, py::object runner, py::object encoder,
                      py::object methodRunner) {
  auto run = sharedPyObject(std::move(runner));
  auto encode = sharedPyObject(std::move(encoder));
  auto method = sharedPyObject(std::move(methodRunner));
  const std::string worker = ctx.workerName();
  ctx.setPythonRunner([run, worker](Message&& call, int callerRank,
                                    std::function<void(c10::IValue)> onValue,
                                    std::function<void(const RemoteException&)> onError) {
    Outcome now;
    c10::intrusive_ptr<c10::ivalue::Future> later;
    {
      PythonTurn turn;  // before the GIL: see python_turn.h
      Gil gil;
      try {
        py::tuple out = callPythonHandler(*run, call, callerRank);
        if (out[0].cast<std::string>() == "async") {
          // @async_execution (e.g. rref.remote().method()): the value is what
          // the function's future gives, as an ("ok", value) / ("err", ...)
          // outcome; no thread waits for it.
          later = py::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(out[1])->fut;
        } else {
          now = decodeOutcome(out, worker);
        }
      } catch (const std::exception& e) {
        now.error = handlerFailure(e.what(), worker);
      }
    }
    // Outside the GIL: completing the value runs fetch callbacks, which take it.
    if (!later) {
      now.deliver(onValue, onError);
      return;
    }
    later->addCallback([onValue, onError, worker](c10::ivalue::Future& done) {
      Outcome late;
      {
        Gil gil;
        try {
          if (done.hasError()) {
            late.error = handlerFailure(done.tryRetrieveErrorMessage(), worker);
          } else {
            late = decodeOutcome(torch::jit::toPyObject(done.value()), worker);
          }
        } catch (const std::exception& e) {
          late.error = handlerFailure(e.what(), worker);
        }
      }
      late.deliver(onValue, onError);
    });
  });
  ctx.setPythonEncoder([encode, worker](uint64_t id, const c10::IValue& value) {
    Gil gil;
    return pythonResponse((*encode)(py::handle(value.toPyObject())), id, worker);
  });
  ctx.setPythonMethodRunner([method, encode, worker](uint64_t id, const c10::IValue& object,
                                                     const std::string& name, const c10::IValue& args,
                                                     const c10::IValue& kwargs, Agent::Responder respond) {
    runAndRespond(
        id, worker, respond,
        [&] {
          return (*method)(torch::jit::toPyObject(object), name, torch::jit::toPyObject(args),
                           torch::jit::toPyObject(kwargs));
        },
        [&](const py::tuple& out) {
          // ("value", result): a result of plain types, sent as an IValue
          // (a 1-tuple, as RREF_FETCH answers); pickled if it is not one.
          TORCH_CHECK(out[0].cast<std::string>() == "value", "unknown outcome");
          try {
            auto value = plainIValue(out[1]);
            return ivalueMessage(MessageType::kScriptRet, id, c10::ivalue::Tuple::create({std::move(value)}));
          } catch (const std::exception&) {
            return pythonResponse((*encode)(out[1], name), id, worker);
          }
        });
  });
}

}  // namespace torchrpc::python_fallback
