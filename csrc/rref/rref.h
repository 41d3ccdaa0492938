#pragma once

// RRef: a reference to a value that lives on one worker (its owner).
//
// Two kinds, as in upstream's Remote Reference Protocol:
//   OwnerRRef  on the owner; holds the value (a future: remote() creates it
//              asynchronously, and creation may fail).
//   UserRRef   anywhere else; holds ids only. Each UserRRef is one "fork" of
//              the owner's RRef, known to the owner by its ForkId.
//
// Ownership: both are held by shared_ptr: by Python handles, by the
// RRefContext while a protocol step needs them (see rref_context.h), and by
// nobody else. A UserRRef that dies after the owner confirmed it tells the
// owner (USER_DELETE) from its destructor; any thread may run it.

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>

#include "message/payload.h"

namespace torchrpc::rref {

// An id unique in the job: the worker that made it and a counter there.
struct GlobalId {
  int32_t worker{-1};
  int64_t local{-1};

  bool operator==(const GlobalId& o) const { return worker == o.worker && local == o.local; }
  bool operator!=(const GlobalId& o) const { return !(*this == o); }
  bool operator<(const GlobalId& o) const {
    return worker != o.worker ? worker < o.worker : local < o.local;
  }
  std::string str() const { return std::to_string(worker) + ":" + std::to_string(local); }
};

struct GlobalIdHash {
  size_t operator()(const GlobalId& id) const {
    return std::hash<int64_t>()(id.local) * 31 + std::hash<int32_t>()(id.worker);
  }
};

using RRefId = GlobalId;
using ForkId = GlobalId;

// The ids of a table keyed by ids (a map or a set), as text, for snapshots.
template <typename Table>
std::vector<std::string> idStrings(const Table& table) {
  std::vector<std::string> out;
  out.reserve(table.size());
  for (const auto& item : table) {
    if constexpr (std::is_same_v<std::decay_t<decltype(item)>, GlobalId>) {
      out.push_back(item.str());
    } else {
      out.push_back(item.first.str());
    }
  }
  return out;
}

// What travels when an RRef is sent in a message: enough for the receiver to
// build its RRef and tell the owner and the parent (the sender) about it.
struct ForkData {
  int owner{-1};
  RRefId rrefId;
  ForkId forkId;
  int parent{-1};
  // A user sent its RRef to the owner inside a request: the owner's answer to
  // that request releases the parent's hold, so the owner sends no CHILD_ACCEPT.
  bool answered{false};

  // Its form inside pickles (Python and TorchScript alike): (owner,
  // rrefId.worker, rrefId.local, forkId.worker, forkId.local, parent, answered).
  std::vector<int64_t> toInts() const;
  static ForkData fromInts(const std::vector<int64_t>& ints);
};

class RRefContext;

class RRef {
 public:
  virtual ~RRef() = default;
  virtual bool isOwner() const = 0;
  // Whether the owner knows this reference (always, on the owner).
  virtual bool confirmedByOwner() const = 0;
  int owner() const { return owner_; }
  const RRefId& id() const { return id_; }
  // The context this RRef belongs to; empty once that session is gone.
  std::shared_ptr<RRefContext> context() const { return ctx_.lock(); }
  // remote()'s call, when this worker's remote() made this RRef and a
  // profiler watches it: completes once its creation is answered and
  // recorded. Set by remote() before it returns the RRef.
  void setCreation(c10::intrusive_ptr<c10::ivalue::Future> call) { creation_ = std::move(call); }
  const c10::intrusive_ptr<c10::ivalue::Future>& creation() const { return creation_; }

 protected:
  RRef(std::weak_ptr<RRefContext> ctx, int owner, RRefId id)
      : ctx_(std::move(ctx)), owner_(owner), id_(id) {}

  std::weak_ptr<RRefContext> ctx_;
  const int owner_;
  const RRefId id_;
  c10::intrusive_ptr<c10::ivalue::Future> creation_;
};

class OwnerRRef final : public RRef {
 public:
  using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

  OwnerRRef(std::weak_ptr<RRefContext> ctx, int owner, RRefId id);
  ~OwnerRRef() override;
  bool isOwner() const override { return true; }
  bool confirmedByOwner() const override { return true; }

  // Completes with the value, or with an RpcError if creating it failed.
  const FuturePtr& value() const { return value_; }
  void setValue(c10::IValue value);
  // Creation failed on this worker: keep the exception for fetches.
  void setError(const message::RemoteException& error);
  // The creation error, if any (set before value() completes).
  std::optional<message::RemoteException> error() const;
  // Blocks until value() completes, at most `seconds` (<= 0: no limit);
  // false if it did not. The caller releases the GIL (or any lock) first.
  bool waitValue(double seconds) const;

 private:
  FuturePtr value_;
  mutable std::mutex mutex_;
  std::optional<message::RemoteException> error_;
};

// Lets go of `owner` from a thread that must not take the GIL (the I/O
// thread, PeerWatch's timer): here when no one else holds it and its value
// drops without the GIL (common/python_held.h), otherwise on rpc-drop.
void releaseOwner(std::shared_ptr<OwnerRRef>& owner) noexcept;

// States of a UserRRef (transitions under the context's lock, or atomic):
//   Pending    -> Confirmed: the owner acknowledged the fork (remote()'s
//                 response, or FORK_REQUEST's ack); until then the context
//                 holds the UserRRef, so it cannot die unconfirmed.
//   Confirmed  -> Deleted: the last handle dropped (destructor), or shutdown
//                 released every user; exactly one USER_DELETE is sent.
class UserRRef final : public RRef {
 public:
  UserRRef(std::weak_ptr<RRefContext> ctx, int owner, RRefId id, ForkId forkId, bool confirmed);
  ~UserRRef() override;
  bool isOwner() const override { return false; }
  bool confirmedByOwner() const override { return confirmed(); }

  const ForkId& forkId() const { return forkId_; }
  bool confirmed() const { return confirmed_.load(); }
  // The owner acknowledged this fork. Returns the creation future for the
  // caller to complete (with None) when this is its first completion, else
  // null: the context completes it after it let go of the RRef, so that a
  // thread waiting on it holds the last reference (and sends USER_DELETE).
  c10::intrusive_ptr<c10::ivalue::Future> confirm() {
    confirmed_.store(true);
    return takeCreation();
  }
  // Completes (None) once the owner has the value, or with remote()'s error
  // (RRef._get_future()); users that are not remote()'s are done when confirmed.
  const c10::intrusive_ptr<c10::ivalue::Future>& creation() const { return creation_; }
  void created(std::exception_ptr error);
  // True the first time: the caller then sends the one USER_DELETE.
  bool markDeleted() { return !deleted_.exchange(true); }
  bool deleted() const { return deleted_.load(); }

  // remote() could not create the value (owner unreachable, timeout): to_here
  // reports this instead of asking the owner.
  void setCreationError(int kind, std::string message);
  std::optional<std::pair<int, std::string>> creationError() const;
  // remote()'s deadline: a fetch sent before the owner confirmed waits no
  // longer than this (so remote(timeout=...) bounds an early to_here too).
  void setCreationDeadline(std::chrono::steady_clock::time_point deadline) {
    creationDeadline_ = deadline;
  }
  std::optional<std::chrono::steady_clock::time_point> creationDeadline() const {
    return creationDeadline_;
  }

 private:
  const ForkId forkId_;
  std::atomic<bool> confirmed_;
  std::atomic<bool> deleted_{false};
  // The creation future for its one completer (the first to ask), else null.
  c10::intrusive_ptr<c10::ivalue::Future> takeCreation() { return created_.exchange(true) ? nullptr : creation_; }

  c10::intrusive_ptr<c10::ivalue::Future> creation_;
  std::atomic<bool> created_{false};
  mutable std::mutex mutex_;
  std::optional<std::pair<int, std::string>> creationError_;
  std::optional<std::chrono::steady_clock::time_point> creationDeadline_;  // set before sharing
};

}  // namespace torchrpc::rref
