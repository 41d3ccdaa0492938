#include "python_fallback/python_rref.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_turn.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/core/GradMode.h>

#include <optional>

#include "autograd/context.h"
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

// The element type of a plain list or dict: that of its first element,
// which every other element must share exactly; null if it is not one.
c10::TypePtr elementType(PyObject* first) {
  if (THPVariable_CheckExact(first)) return c10::TensorType::get();
  if (PyBool_Check(first)) return c10::BoolType::get();
  if (PyLong_CheckExact(first)) return c10::IntType::get();
  if (PyFloat_CheckExact(first)) return c10::FloatType::get();
  if (PyUnicode_CheckExact(first)) return c10::StringType::get();
  return nullptr;
}

std::optional<std::string> plainString(PyObject* p) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(p, &size);
  if (data == nullptr) {  // e.g. lone surrogates: only a pickle carries them
    PyErr_Clear();
    return std::nullopt;
  }
  return std::string(data, size);
}

}  // namespace

bool gradsRecorded() {
  return c10::GradMode::is_enabled() && autograd::Container::currentId() != -1;
}

std::optional<c10::IValue> plainIValue(const py::handle& obj, bool grads, int depth) {
  // Deeper values are pickled: the pickler bounds its recursion, and the
  // compact form (message/plain_codec.h) has a like bound.
  if (depth > kMaxPlainDepth) return std::nullopt;
  PyObject* p = obj.ptr();
  if (THPVariable_CheckExact(p)) {
    const auto& t = THPVariable_Unpack(p);
    if (!t.is_cpu() || t.layout() != c10::kStrided || (t.requires_grad() && !grads)) return std::nullopt;
    return c10::IValue(t);
  }
  if (p == Py_None) return c10::IValue();
  if (PyBool_Check(p)) return c10::IValue(p == Py_True);
  if (PyLong_CheckExact(p)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
    if (overflow != 0) return std::nullopt;
    return c10::IValue(static_cast<int64_t>(v));
  }
  if (PyFloat_CheckExact(p)) return c10::IValue(PyFloat_AS_DOUBLE(p));
  if (PyUnicode_CheckExact(p)) {
    auto text = plainString(p);
    if (!text) return std::nullopt;
    return c10::IValue(std::move(*text));
  }
  if (PyTuple_CheckExact(p)) {
    std::vector<c10::IValue> items;
    items.reserve(PyTuple_GET_SIZE(p));
    for (auto item : py::reinterpret_borrow<py::tuple>(obj)) {
      auto v = plainIValue(item, grads, depth + 1);
      if (!v) return std::nullopt;
      items.push_back(std::move(*v));
    }
    return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
  }
  if (PyList_CheckExact(p)) {
    auto list = py::reinterpret_borrow<py::list>(obj);
    auto type = list.empty() ? nullptr : elementType(list[0].ptr());
    if (!type) return std::nullopt;
    c10::impl::GenericList out(type);
    out.reserve(list.size());
    for (auto item : list) {
      auto v = Py_TYPE(item.ptr()) == Py_TYPE(list[0].ptr()) ? plainIValue(item, grads, depth + 1) : std::nullopt;
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
    }
    return c10::IValue(std::move(out));
  }
  if (PyDict_CheckExact(p)) {
    auto dict = py::reinterpret_borrow<py::dict>(obj);
    auto type = dict.empty() ? nullptr : elementType(dict.begin()->second.ptr());
    if (!type) return std::nullopt;
    c10::impl::GenericDict out(c10::StringType::get(), type);
    PyTypeObject* kind = Py_TYPE(dict.begin()->second.ptr());
    for (auto item : dict) {
      if (!PyUnicode_CheckExact(item.first.ptr()) || Py_TYPE(item.second.ptr()) != kind) return std::nullopt;
      auto key = plainString(item.first.ptr());
      auto v = key ? plainIValue(item.second, grads, depth + 1) : std::nullopt;
      if (!v) return std::nullopt;
      out.insert(std::move(*key), std::move(*v));
    }
    return c10::IValue(std::move(out));
  }
  return std::nullopt;
}

c10::IValue pyObjectIValue(py::object obj) {
  c10::intrusive_ptr<c10::ivalue::PyObjectHolder> holder = c10::make_intrusive<PyValueHolder>(std::move(obj));
  return c10::IValue(std::move(holder));
}

void installRRefPython(rref::RRefContext& ctx, py::object encoder, py::object methodRunner) {
  auto encode = sharedPyObject(std::move(encoder));
  auto method = sharedPyObject(std::move(methodRunner));
  const std::string worker = ctx.workerName();
  ctx.setPythonEncoder([encode, worker](uint64_t id, const c10::IValue& value) {
    Gil gil;
    return valueResponse(py::handle(value.toPyObject()), py::str("<value>"), *encode, id, worker);
  });
  ctx.setPythonMethodRunner([method, encode, worker](uint64_t /*id*/, const c10::IValue& object,
                                                     const std::string& name, const c10::IValue& args,
                                                     const c10::IValue& kwargs, message::Reply reply) {
    runAndRespond(worker, reply, [&] {
      return (*method)(torch::jit::toPyObject(object), name, torch::jit::toPyObject(args),
                       torch::jit::toPyObject(kwargs));
    }, *encode);
  });
}

}  // namespace torchrpc::python_fallback
