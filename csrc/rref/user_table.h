#pragma once

// UserTable: the user's side of the RRef protocol on this worker.
//
//   users             every live UserRRef (weak), for listing and shutdown.
//   pending users     UserRRefs the owner has not confirmed yet, kept alive
//                     here so that none can send USER_DELETE before the owner
//                     knows its fork. A UserRRef goes Pending -> Confirmed ->
//                     Deleted (see rref.h); this table holds it while Pending.
//   children          RRefs this worker sent to another worker (the child) as
//                     a user, kept alive until the child is confirmed
//                     (CHILD_ACCEPT, or the answer to the request that carried
//                     it to the owner): held -> released.
//
// Methods that may drop the last reference to an RRef return it, for the
// caller to let go after the table's lock is released (a UserRRef's
// destructor calls back here). Thread-safe.

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "rref/rref.h"

namespace torchrpc::rref {

class UserTable {
 public:
  // A new UserRRef; `pending` keeps it alive until confirm().
  void add(const std::shared_ptr<UserRRef>& user, bool pending);
  // The owner never heard of it (its message was not sent): forget it.
  void remove(const ForkId& forkId);
  // Pending -> Confirmed: returns the user the table held (or null), which
  // the caller confirms and then drops.
  std::shared_ptr<UserRRef> takePending(const ForkId& forkId);
  // The UserRRef object is destroyed; false once the table was cleared.
  bool forget(const ForkId& forkId);

  // `childRank`: the worker it was sent to, or -1 when unknown (a response's).
  void holdChild(const ForkId& forkId, std::shared_ptr<RRef> rref, int childRank);
  // Returns the child's RRef (or null) for the caller to drop.
  std::shared_ptr<RRef> releaseChild(const ForkId& forkId);
  // A lost peer never confirms its children: returns their RRefs to drop.
  std::vector<std::shared_ptr<RRef>> releaseChildrenOf(int rank);

  std::vector<std::shared_ptr<UserRRef>> live() const;
  // Shutdown: drops every hold; returns what it held.
  std::vector<std::shared_ptr<RRef>> clear();

  // (rrefId, forkId, owner rank, confirmed, deleted) per live user.
  using UserInfo = std::tuple<std::string, std::string, int, bool, bool>;
  std::vector<UserInfo> users() const;
  std::vector<std::string> pendingUsers() const;
  std::vector<std::string> children() const;

 private:
  mutable std::mutex mutex_;
  bool cleared_{false};
  std::unordered_map<ForkId, std::weak_ptr<UserRRef>, GlobalIdHash> users_;
  std::unordered_map<ForkId, std::shared_ptr<UserRRef>, GlobalIdHash> pending_;
  struct Child {
    std::shared_ptr<RRef> rref;
    int rank;
  };
  std::unordered_map<ForkId, Child, GlobalIdHash> children_;
};

}  // namespace torchrpc::rref
