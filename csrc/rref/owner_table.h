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
//   kAwaited  -- expire(): the creation did not come in time -----> erased
//   any but kCreating -- releasePeer() removed its last fork -----> erased
//
// State a peer makes on demand is bounded and tied to that peer: a kAwaited
// entry counts against the cap of the peer whose request made it (at most
// kMaxAwaitedPerPeer; beyond it awaited() throws), and every fork records the
// rank that holds it, so that releasePeer() can drop what a lost peer held.
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
  // kAwaited entries one peer may have made and not seen created.
  static constexpr size_t kMaxAwaitedPerPeer = 4096;
  // The holder of a fork the owner cannot attribute (the owner's own RRef
  // sent in a response): never released by releasePeer().
  static constexpr int kUnknownHolder = -1;

  OwnerTable(std::weak_ptr<RRefContext> ctx, int rank) : ctx_(std::move(ctx)), rank_(rank) {}

  // A new owner RRef of a value that exists (RRef(value)); not in the table
  // until it is forked.
  void addObject(const std::shared_ptr<OwnerRRef>& owner);
  // The OwnerRRef object `owner` is destroyed.
  void forgetObject(const RRefId& id, const OwnerRRef* owner);

  // kAwaited/new -> kCreating, with the creating caller's fork (held by
  // `holder`) if any (Early Fork Registration); *expiry (if given) gets the
  // timer that was to expire the kAwaited entry (0: none), for the caller to
  // cancel. Throws if the value was created already.
  std::shared_ptr<OwnerRRef> startCreation(const RRefId& id, const ForkId* forkId, int holder,
                                           uint64_t* expiry = nullptr);
  // kCreating -> kReady. Returns the entry's RRef if that erased it.
  std::shared_ptr<OwnerRRef> endCreation(const RRefId& id);
  // The entry's RRef, made kAwaited for `requester` if it did not exist
  // (*created tells); null once cleared. Throws, naming the id and the cap,
  // if `requester` has kMaxAwaitedPerPeer awaited entries already.
  std::shared_ptr<OwnerRRef> awaited(const RRefId& id, int requester, bool* created);
  // A fork that `holder` holds (FORK_REQUEST): the entry's RRef, made
  // kAwaited for `holder` if new (*created tells); throws as awaited().
  std::shared_ptr<OwnerRRef> addFork(const RRefId& id, const ForkId& forkId, int holder, bool* created);
  // The owner sends its own RRef to `holder` (or kUnknownHolder): a fork of
  // `owner`, kReady if new.
  void addForkOf(const std::shared_ptr<OwnerRRef>& owner, const ForkId& forkId, int holder);
  // Removes a fork; *known tells whether it was there. Returns the entry's
  // RRef if that erased it.
  std::shared_ptr<OwnerRRef> removeFork(const RRefId& id, const ForkId& forkId, bool* known = nullptr);
  // The entry's RRef, or null if there is none (nothing is created).
  std::shared_ptr<OwnerRRef> find(const RRefId& id) const;
  // The RRef of an entry that has `forkId`, or null.
  std::shared_ptr<OwnerRRef> withFork(const RRefId& id, const ForkId& forkId) const;

  // Records the timer that expires the kAwaited entry of `rref`; false if
  // it is not kAwaited any more (the caller then cancels the timer).
  bool setExpiry(const RRefId& id, const OwnerRRef* rref, uint64_t timer);
  // kAwaited -> erased, if the entry of `id` is still the kAwaited one of
  // `rref` (its creation did not come in time). Returns it, for the caller
  // to fail its value (which answers its waiters) and drop.
  std::shared_ptr<OwnerRRef> expire(const RRefId& id, const OwnerRRef* rref);
  // Peer `rank` is gone: removes the forks it held and forgets the kAwaited
  // entries it made. Returns the entries that erased, for the caller to fail
  // those never created and drop them all; *forks counts the forks removed.
  std::vector<std::shared_ptr<OwnerRRef>> releasePeer(int rank, size_t* forks);
  // kAwaited entries `requester` made that are not created yet.
  size_t awaitedCount(int requester) const;

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
    std::unordered_map<ForkId, int, GlobalIdHash> forks;  // fork -> the rank that holds it
    int awaitedBy{kUnknownHolder};  // kAwaited: the peer it counts against
    uint64_t expiry{0};              // kAwaited: the timer that expires it (common::Timers), 0 if none
  };
  // Finds or creates the entry (kAwaited, counted against `requester`, with
  // *created set); mutex_ held. Throws at the requester's cap.
  Entry& entryLocked(const RRefId& id, int requester, bool* created = nullptr);
  // The entry no longer counts against the peer that made it; mutex_ held.
  void uncountLocked(Entry& entry);
  std::shared_ptr<OwnerRRef> maybeEraseLocked(const RRefId& id);

  const std::weak_ptr<RRefContext> ctx_;
  const int rank_;
  mutable std::mutex mutex_;
  bool cleared_{false};
  std::unordered_map<RRefId, Entry, GlobalIdHash> entries_;
  std::unordered_map<RRefId, const OwnerRRef*, GlobalIdHash> objects_;
  std::unordered_map<int, size_t> awaitedPerPeer_;  // kAwaited entries made on demand, by requester
};

}  // namespace torchrpc::rref
