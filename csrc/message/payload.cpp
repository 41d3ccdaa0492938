#include "message/payload.h"

#include "message/pickle_check.h"
#include "message/plain_codec.h"

#include <torch/csrc/jit/runtime/jit_exception.h>
#include <ATen/core/function.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/custom_class_detail.h>

#include <mutex>
#include <unordered_map>

namespace torchrpc::message {

namespace {

thread_local PickleScope* currentPickleScope = nullptr;
thread_local UnpickleScope* currentUnpickleScope = nullptr;

constexpr const char* kCustomClassPrefix = "__torch__.torch.classes.";

}  // namespace

void requireTypeTag(const std::string& tag) {
  const std::string wrong = checkTypeTag(tag);
  TORCH_CHECK(wrong.empty(), "a message holds ", wrong, "; send flatter values");
}

c10::TypePtr boundedTypeParser(const std::string& tag) {
  requireTypeTag(tag);
  return torch::jit::Unpickler::defaultTypeParser(tag);
}

namespace {

// The type of a container's tag, parsed once per distinct tag: the TorchScript
// parser took about 1% of a tiny call's CPU, run for every message's dict or list.
// A few tags cover real traffic; past kMaxTags new ones are parsed each time.
c10::TypePtr parsedTypeTag(const std::string& tag) {
  constexpr size_t kMaxTags = 256;
  static std::mutex mutex;
  static std::unordered_map<std::string, c10::TypePtr> parsed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = parsed.find(tag);
    if (it != parsed.end()) return it->second;
  }
  auto type = boundedTypeParser(tag);
  TORCH_CHECK(!type->cast<c10::ClassType>(), "a message holds an object of class '", tag,
              "'; only tensors, plain values and torch.classes objects (RRefs) can be sent");
  std::lock_guard<std::mutex> lock(mutex);
  if (parsed.size() < kMaxTags) parsed.emplace(tag, type);
  return type;
}

// Resolves the classes of objects and the type tags of containers. Only
// TorchScript custom classes (registered in C++ with torch::class_) can be
// rebuilt here; script classes would need their compilation unit. Type tags
// ("Dict[str, Any]") go to the unpickler's default parser, as without a
// resolver.
c10::StrongTypePtr resolveType(const c10::QualifiedName& name) {
  const std::string qualified = name.qualifiedName();
  if (qualified.rfind(kCustomClassPrefix, 0) == 0 && qualified.find_first_of("[], ") == std::string::npos) {
    auto cls = torch::getCustomClass(qualified);
    TORCH_CHECK(cls, "a message holds an object of custom class '", qualified,
                "', which is not registered in this process; load the library that defines it");
    return c10::StrongTypePtr(nullptr, std::move(cls));
  }
  return c10::StrongTypePtr(nullptr, parsedTypeTag(qualified));
}

c10::intrusive_ptr<c10::ivalue::Object> loadObject(const c10::StrongTypePtr& type, c10::IValue state) {
  auto cls = type.type_->expect<c10::ClassType>();
  torch::jit::Function* setstate = cls->findMethod("__setstate__");
  TORCH_CHECK(setstate, "custom class '", cls->repr_str(), "' has no __setstate__ (def_pickle)");
  auto obj = c10::ivalue::Object::create(type, cls->numAttributes());
  torch::jit::Stack stack{obj, std::move(state)};
  setstate->run(stack);
  return obj;
}

}  // namespace

PickleScope::PickleScope() : outer_(currentPickleScope) { currentPickleScope = this; }

PickleScope::~PickleScope() {
  currentPickleScope = outer_;
  if (committed_) return;
  for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) {
    try {
      (*it)();
    } catch (...) {
      // Undoing is best effort; the pickling error is what the caller sees.
    }
  }
}

void PickleScope::commit() { committed_ = true; }
void PickleScope::onAbort(std::function<void()> undo) { undo_.push_back(std::move(undo)); }
PickleScope* PickleScope::current() { return currentPickleScope; }

UnpickleScope::UnpickleScope() : outer_(currentUnpickleScope) { currentUnpickleScope = this; }
UnpickleScope::~UnpickleScope() { currentUnpickleScope = outer_; }
bool UnpickleScope::active() { return currentUnpickleScope != nullptr; }

void UnpickleScope::awaitBeforeUse(c10::intrusive_ptr<c10::ivalue::Future> future) {
  if (currentUnpickleScope != nullptr) currentUnpickleScope->awaited_.push_back(std::move(future));
}

Message ivalueMessage(MessageType type, uint64_t id, const c10::IValue& value) {
  Message m;
  m.type = type;
  m.id = id;
  if (encodePlain(value, m.payload, m.tensors)) return m;
  PickleScope scope;
  std::vector<char> bytes = torch::jit::pickle(value, &m.tensors);
  scope.commit();
  m.payload.assign(bytes.data(), bytes.size());
  return m;
}

c10::IValue messageIValue(const Message& message, std::vector<c10::intrusive_ptr<c10::ivalue::Future>>* awaited) {
  if (isPlain(message.payload)) {  // nothing in it waits (no objects)
    c10::IValue value;
    const std::string bad = decodePlain(message.payload, message.tensors, value);
    TORCH_CHECK(bad.empty(), "malformed ", messageTypeName(message.type), " payload: ", bad);
    return value;
  }
  const std::string bad = checkPickle(message.payload.data(), message.payload.size(), /*torchValues=*/true);
  TORCH_CHECK(bad.empty(), "malformed ", messageTypeName(message.type), " payload: ", bad);
  UnpickleScope scope;
  c10::IValue value = torch::jit::unpickle(message.payload.data(), message.payload.size(), loadObject,
                                           resolveType, message.tensors);
  if (awaited != nullptr) *awaited = scope.takeAwaited();
  return value;
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

}  // namespace torchrpc::message
