#pragma once

// OwnerTable: the owner's side of the RRef protocol. One entry per RRef this
// worker owns that users may reference, with the forks (user RRefs) the owner
// knows of, and every live OwnerRRef object (for listing and shutdown).
//
// Each entry is a state machine; messages of one RRef may be handled out of
// order (a fetch or a fork request can run before the call that creates it):
//
//   (none)    -- a fetch, method call or fork request names it -->  kAwaited
//   (none)    -- the call that creates it arrives ----------------> kCreating
//   (none)    -- the owner sends its own RRef (fork) -------------> kReady
//   kAwaited  -- the call that creates it arrives ----------------> kCreating
//   kCreating -- the value or its error is set -------------------> kReady
//   kAwaited, kReady -- the last fork is removed -----------------> erased
//
// A kCreating entry stays until its creation ends, forks or not. Methods that
// may drop the last reference to an OwnerRRef return it: the caller lets it
// go after the table's lock is released (its destructor calls back here).
// Thread-safe.

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rref/rref.h"

namespace torchrpc::rref {

class OwnerTable {
 public:
  enum class State { kAwaited, kCreating, kReady };

  OwnerTable(std::weak_ptr<RRefContext> ctx, int rank) : ctx_(std::move(ctx)), rank_(rank) {}

  // A new owner RRef of a value that exists (RRef(value)); not in the table
  // until it is forked.
  void addObject(const std::shared_ptr<OwnerRRef>& owner);
  // The OwnerRRef object `owner` is destroyed.
  void forgetObject(const RRefId& id, const OwnerRRef* owner);

  // kAwaited/new -> kCreating, with the creating caller's fork if any (Early
  // Fork Registration). Throws if the value was created already.
  std::shared_ptr<OwnerRRef> startCreation(const RRefId& id, const ForkId* forkId);
  // kCreating -> kReady. Returns the entry's RRef if that erased it.
  std::shared_ptr<OwnerRRef> endCreation(const RRefId& id);
  // The entry's RRef, made kAwaited if it did not exist; null once cleared.
  std::shared_ptr<OwnerRRef> awaited(const RRefId& id);
  // A fork the owner learned of (FORK_REQUEST), kAwaited if new.
  void addFork(const RRefId& id, const ForkId& forkId);
  // The owner sends its own RRef: a fork of `owner`, kReady if new.
  void addForkOf(const std::shared_ptr<OwnerRRef>& owner, const ForkId& forkId);
  // Removes a fork; *known tells whether it was there. Returns the entry's
  // RRef if that erased it.
  std::shared_ptr<OwnerRRef> removeFork(const RRefId& id, const ForkId& forkId, bool* known = nullptr);
  // The RRef of an entry that has `forkId`, or null.
  std::shared_ptr<OwnerRRef> withFork(const RRefId& id, const ForkId& forkId) const;

  // Shutdown: empties the table and refuses new entries; returns what it held.
  std::vector<std::shared_ptr<OwnerRRef>> clear();

  // (rrefId, forks, value ready, creation failed) per entry.
  using EntryInfo = std::tuple<std::string, std::vector<std::string>, bool, bool>;
  std::vector<EntryInfo> entries() const;
  std::vector<std::string> objects() const;

 private:
  struct Entry {
    State state{State::kAwaited};
    std::shared_ptr<OwnerRRef> rref;
    std::unordered_set<ForkId, GlobalIdHash> forks;
  };
  // Finds or creates the entry (kAwaited); mutex_ held.
  Entry& entryLocked(const RRefId& id);
  std::shared_ptr<OwnerRRef> maybeEraseLocked(const RRefId& id);

  const std::weak_ptr<RRefContext> ctx_;
  const int rank_;
  mutable std::mutex mutex_;
  bool cleared_{false};
  std::unordered_map<RRefId, Entry, GlobalIdHash> entries_;
  std::unordered_map<RRefId, const OwnerRRef*, GlobalIdHash> objects_;
};

}  // namespace torchrpc::rref
