#include "message/payload.h"

#include <torch/csrc/jit/runtime/jit_exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

namespace torchrpc {

Message ivalueMessage(MessageType type, uint64_t id, const c10::IValue& value) {
  Message m;
  m.type = type;
  m.id = id;
  std::vector<char> bytes = torch::jit::pickle(value, &m.tensors);
  m.payload.assign(bytes.data(), bytes.size());
  return m;
}

c10::IValue messageIValue(const Message& message) {
  return torch::jit::unpickle(message.payload.data(), message.payload.size(),
                              /*type_resolver=*/nullptr, message.tensors);
}

Message exceptionMessage(uint64_t id, const RemoteException& e) {
  return ivalueMessage(
      MessageType::kException, id,
      c10::ivalue::Tuple::create({e.type, e.message, e.traceback, e.function, e.worker}));
}

RemoteException messageException(const Message& message) {
  auto t = messageIValue(message).toTuple();
  const auto& el = t->elements();
  TORCH_CHECK(el.size() == 5, "malformed EXCEPTION message: ", el.size(), " fields");
  return RemoteException{el[0].toStringRef(), el[1].toStringRef(), el[2].toStringRef(),
                         el[3].toStringRef(), el[4].toStringRef()};
}

RemoteException describeException(std::exception_ptr error, std::string function,
                                  std::string worker) {
  RemoteException r;
  r.function = std::move(function);
  r.worker = std::move(worker);
  try {
    std::rethrow_exception(error);
  } catch (const torch::jit::JITException& e) {
    // A `raise ValueError(...)` inside TorchScript: keep the Python class.
    std::string cls = e.getPythonClassName().value_or("builtins.RuntimeError");
    if (cls.rfind("builtins.", 0) == 0) cls = cls.substr(9);
    r.type = cls;
    r.message = e.getOriginalMsg().value_or(e.what());
    r.traceback = e.what();
  } catch (const c10::TypeError& e) {  // e.g. arguments that do not match a schema
    r.type = "TypeError";
    r.message = e.what_without_backtrace();
  } catch (const c10::ValueError& e) {
    r.type = "ValueError";
    r.message = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    r.type = "RuntimeError";
    r.message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    r.type = "RuntimeError";
    r.message = e.what();
  } catch (...) {
    r.type = "RuntimeError";
    r.message = "unknown C++ exception";
  }
  return r;
}

}  // namespace torchrpc
