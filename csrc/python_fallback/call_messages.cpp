#include "python_fallback/call_messages.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "jit_ops/rpc_ops.h"
#include "message/plain_codec.h"
#include "python_fallback/python_rref.h"
#include "rref/rref_messages.h"
#include "script_dispatch/run_script.h"

namespace py = pybind11;

namespace torchrpc::python_fallback {

namespace {

std::vector<c10::IValue> stackFor(const c10::FunctionSchema& schema, const py::tuple& args, const py::dict& kwargs) {
  return torch::jit::createStackForSchema(schema, torch::jit::tuple_slice(args),
                                          py::reinterpret_borrow<py::kwargs>(kwargs), std::nullopt);
}

// What decides which overload of a builtin accepts a call's arguments: each
// argument's Python type (for a tensor, its dtype and whether it has 0
// dimensions or one element: int and number parameters accept some such
// tensors), and the keyword names. Empty when an argument is of another kind
// (a list, a dtype, ...): those calls are matched from scratch every time.
std::string argumentKinds(const std::string& opName, const py::tuple& args, const py::dict& kwargs) {
  std::string key = opName;
  auto add = [&key](const py::handle& value) {
    PyObject* obj = value.ptr();
    if (THPVariable_Check(obj)) {
      const auto& t = THPVariable_Unpack(obj);
      key += t.dim() == 0 ? "|T0" : (t.numel() == 1 ? "|T1" : "|T");
      key += c10::toString(t.scalar_type());
    } else if (obj == Py_None || PyBool_Check(obj) || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) ||
               PyUnicode_CheckExact(obj)) {
      key += "|";
      key += Py_TYPE(obj)->tp_name;
    } else {
      return false;
    }
    return true;
  };
  for (const auto& arg : args) {
    if (!add(arg)) return "";
  }
  for (const auto& item : kwargs) {
    key += "|" + py::str(item.first).cast<std::string>() + "=";
    if (!add(item.second)) return "";
  }
  return key;
}

// The shipped tuple (format, sha1, uint8 tensor or None), field by field:
// toIValue would infer each element's type, about 12 µs a call.
c10::IValue shippedValue(const py::object& shipped) {
  if (shipped.is_none()) return c10::IValue();
  auto fields = py::cast<py::tuple>(shipped);
  if (fields.size() != 3) throw py::value_error("shipped code must be (format, sha1, code or None)");
  c10::IValue code = fields[2].is_none() ? c10::IValue() : c10::IValue(py::cast<at::Tensor>(fields[2]));
  return c10::ivalue::Tuple::create({py::cast<std::string>(fields[0]), py::cast<std::string>(fields[1]), std::move(code)});
}

c10::impl::GenericDict anyDict(const py::dict& kwargs) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (auto item : kwargs) {
    out.insert(py::cast<std::string>(item.first), torch::jit::toIValue(item.second, c10::AnyType::get()));
  }
  return out;
}

}  // namespace

message::Message scriptCallMessage(const std::string& name, const std::string& moduleHint, py::handle fn, const py::tuple& args,
                          const py::dict& kwargs, const py::object& shipped, bool asyncExecution) {
  auto f = py::cast<torch::jit::StrongFunctionPtr>(fn);
  const auto& schema = f.function_->getSchema();
  std::vector<c10::IValue> stack;
  try {
    stack = stackFor(schema, args, kwargs);
  } catch (const torch::jit::schema_match_error& e) {
    throw py::type_error("arguments do not match '" + schema.name() + "': " + e.what());
  }
  return script_dispatch::scriptCallMessage(name, moduleHint, std::move(stack),
                                            c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()),
                                            shippedValue(shipped), asyncExecution);
}

message::Message namedCallMessage(const std::string& name, const py::tuple& args, const py::dict& kwargs,
                         const std::string& callKind, const py::object& shipped) {
  std::vector<c10::IValue> stack;
  for (auto arg : args) stack.push_back(torch::jit::toIValue(arg, c10::AnyType::get()));
  return jit_ops::namedCallMessage(name, c10::ivalue::Tuple::create(std::move(stack)), anyDict(kwargs), callKind,
                                   shippedValue(shipped));
}

// Trying an overload that refuses the arguments costs an exception, so the
// overload found for the same kinds of arguments (argumentKinds) is
// remembered and tried alone.
message::Message builtinCallMessage(const std::string& opName, const py::tuple& args, const py::dict& kwargs,
                           std::string* schemaName) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<torch::jit::Operator>> matched;
  auto tryOverload = [&](const torch::jit::Operator& op, std::string* errors) -> std::optional<message::Message> {
    const auto& schema = op.schema();
    std::vector<c10::IValue> stack;
    try {
      stack = stackFor(schema, args, kwargs);
    } catch (const std::exception& e) {
      if (errors != nullptr) *errors += "\n  " + c10::toString(schema) + ": " + e.what();
      return std::nullopt;
    }
    *schemaName = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    return script_dispatch::builtinCallMessage(*schemaName, std::move(stack));
  };
  const std::string key = argumentKinds(opName, args, kwargs);
  std::shared_ptr<torch::jit::Operator> known;
  if (!key.empty()) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = matched.find(key);
    if (it != matched.end()) known = it->second;
  }
  if (known) {
    if (auto message = tryOverload(*known, nullptr)) return std::move(*message);
  }
  std::string errors;
  for (const auto& op : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(opName))) {
    if (auto message = tryOverload(*op, &errors)) {
      if (!key.empty()) {
        std::lock_guard<std::mutex> lock(mutex);
        matched[key] = op;
      }
      return std::move(*message);
    }
  }
  throw py::type_error("no overload of builtin '" + opName + "' accepts these arguments (Overloaded torch operator "
                       "invoked from Python failed to match any schema); the candidates said:" +
                       errors);
}

message::Message pythonCallMessage(const py::bytes& payload, std::vector<at::Tensor> tensors) {
  return message::Message{message::MessageType::kPythonCall, 0, std::string(payload), std::move(tensors)};
}

namespace {

// (args, kwargs) as IValues when every argument is plain (plainIValue).
std::optional<std::pair<c10::IValue, c10::impl::GenericDict>> plainArguments(const py::tuple& args,
                                                                             const py::dict& kwargs) {
  const bool grads = gradsRecorded();
  auto argValues = plainIValue(args, grads);
  if (!argValues) return std::nullopt;
  c10::impl::GenericDict kwValues(c10::StringType::get(), c10::AnyType::get());
  for (auto item : kwargs) {
    auto v = plainIValue(item.second, grads);
    if (!v) return std::nullopt;
    kwValues.insert(py::cast<std::string>(item.first), std::move(*v));
  }
  return std::make_pair(std::move(*argValues), std::move(kwValues));
}

}  // namespace

std::optional<message::Message> plainPythonCallMessage(const py::bytes& digest, const std::string& name,
                                                       const py::tuple& args, const py::dict& kwargs) {
  auto plain = plainArguments(args, kwargs);
  if (!plain) return std::nullopt;
  auto message = message::ivalueMessage(message::MessageType::kPythonCall, 0,
                                        c10::ivalue::Tuple::create({std::string(digest), name, std::move(plain->first),
                                                                    std::move(plain->second)}));
  // Values the compact form does not keep (the same tensor twice) came out as
  // torch's pickle, which the callee would take for Python's: pickle them.
  if (!message::isPlain(message.payload)) return std::nullopt;
  return message;
}

std::optional<message::Message> methodCallMessage(const rref::RRefId& rrefId, const std::string& name, const py::tuple& args,
                                         const py::dict& kwargs) {
  auto plain = plainArguments(args, kwargs);
  if (!plain) return std::nullopt;
  return rref::methodCallMessage(rrefId, name, std::move(plain->first), std::move(plain->second));
}

}  // namespace torchrpc::python_fallback
