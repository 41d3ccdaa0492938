#include "rref/rref.h"

#include <chrono>
#include <future>

#include "common/error.h"
#include "common/python_held.h"
#include "rref/rref_context.h"

namespace torchrpc::rref {

std::vector<int64_t> ForkData::toInts() const {
  return {owner, rrefId.worker, rrefId.local, forkId.worker, forkId.local, parent, answered ? 1 : 0};
}

ForkData ForkData::fromInts(const std::vector<int64_t>& ints) {
  TORCH_CHECK(ints.size() == 7, "malformed RRef fork data: ", ints.size(), " fields, expected 7");
  return ForkData{static_cast<int>(ints[0]),
                  {static_cast<int32_t>(ints[1]), ints[2]},
                  {static_cast<int32_t>(ints[3]), ints[4]},
                  static_cast<int>(ints[5]),
                  ints[6] != 0};
}

OwnerRRef::OwnerRRef(std::weak_ptr<RRefContext> ctx, int owner, RRefId id)
    : RRef(std::move(ctx), owner, id),
      value_(c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get())) {}

OwnerRRef::~OwnerRRef() {
  if (auto ctx = ctx_.lock()) ctx->forgetOwner(id_, this);
}

void releaseOwner(std::shared_ptr<OwnerRRef>& owner) noexcept {
  if (!owner) return;
  if (auto urgency = common::handOver(owner.use_count() == 1, *owner->value())) {
    common::dropAside(std::move(owner), *urgency);
  } else {
    owner.reset();
  }
}

void OwnerRRef::setValue(c10::IValue value) { value_->markCompleted(std::move(value)); }

bool OwnerRRef::waitValue(double seconds) const {
  if (value_->completed()) return true;
  if (seconds <= 0) {
    value_->wait();
    return true;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto ready = done->get_future();
  value_->addCallback([done](c10::ivalue::Future&) { done->set_value(); });
  return ready.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}

void OwnerRRef::setError(const message::RemoteException& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
  }
  value_->setError(common::makeRpcError(
      common::ErrorKind::kRemote,
      error.message + " (raised on " + error.worker + " while creating the value of RRef " +
          id_.str() + " with '" + error.function + "')",
      error.type, error.traceback));
}

std::optional<message::RemoteException> OwnerRRef::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

UserRRef::UserRRef(std::weak_ptr<RRefContext> ctx, int owner, RRefId id, ForkId forkId,
                   bool confirmed)
    : RRef(std::move(ctx), owner, id),
      forkId_(forkId),
      confirmed_(confirmed),
      creation_(c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get())) {
  if (confirmed) created(nullptr);
}

void UserRRef::created(std::exception_ptr error) {
  auto creation = takeCreation();
  if (!creation) return;
  if (error) {
    creation->setError(std::move(error));
  } else {
    creation->markCompleted(c10::IValue());
  }
}

UserRRef::~UserRRef() {
  if (auto ctx = ctx_.lock()) ctx->userReleased(*this);
}

void UserRRef::setCreationError(int kind, std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  creationError_ = std::make_pair(kind, std::move(message));
}

std::optional<std::pair<int, std::string>> UserRRef::creationError() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return creationError_;
}

}  // namespace torchrpc::rref
