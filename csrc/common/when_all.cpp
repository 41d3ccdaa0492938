#include "common/when_all.h"

namespace torchrpc::common {

c10::intrusive_ptr<c10::ivalue::Future> whenAll(std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures) {
  auto result = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
  if (futures.empty()) {
    result->markCompleted(c10::IValue());
    return result;
  }
  c10::List<c10::intrusive_ptr<c10::ivalue::Future>> list(c10::FutureType::create(c10::AnyType::get()));
  for (auto& f : futures) list.push_back(f);
  c10::collectAll(list)->addCallback([result, futures](c10::ivalue::Future&) {
    for (const auto& f : futures) {
      if (f->hasError()) {
        result->setErrorIfNeeded(f->exception_ptr());
        return;
      }
    }
    result->markCompleted(c10::IValue());
  });
  return result;
}

}  // namespace torchrpc::common
