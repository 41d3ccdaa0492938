#include "rref/user_table.h"

namespace torchrpc::rref {

namespace {

// Removes table[forkId] and returns what it held (null if nothing); the
// caller drops it after the lock. mutex_ held.
template <typename Table>
typename Table::mapped_type takeLocked(Table& table, const ForkId& forkId) {
  auto it = table.find(forkId);
  if (it == table.end()) return {};
  auto held = std::move(it->second);
  table.erase(it);
  return held;
}

}  // namespace

void UserTable::add(const std::shared_ptr<UserRRef>& user, bool pending) {
  std::lock_guard<std::mutex> lock(mutex_);
  users_[user->forkId()] = user;
  if (pending) pending_[user->forkId()] = user;
}

void UserTable::remove(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  takeLocked(pending_, forkId).reset();  // not the last reference: the caller holds the user
  users_.erase(forkId);
}

std::shared_ptr<UserRRef> UserTable::takePending(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  return takeLocked(pending_, forkId);
}

bool UserTable::forget(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = users_.find(forkId);
  if (it != users_.end() && it->second.expired()) users_.erase(it);
  return !cleared_;
}

void UserTable::holdChild(const ForkId& forkId, std::shared_ptr<RRef> rref, int childRank) {
  std::lock_guard<std::mutex> lock(mutex_);
  children_[forkId] = Child{std::move(rref), childRank};
}

std::shared_ptr<RRef> UserTable::releaseChild(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  return takeLocked(children_, forkId).rref;
}

std::vector<std::shared_ptr<RRef>> UserTable::releaseChildrenOf(int rank) {
  std::vector<std::shared_ptr<RRef>> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = children_.begin(); it != children_.end();) {
    if (it->second.rank == rank) {
      out.push_back(std::move(it->second.rref));
      it = children_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<std::shared_ptr<UserRRef>> UserTable::live() const {
  std::vector<std::shared_ptr<UserRRef>> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kv : users_) {
    if (auto u = kv.second.lock()) out.push_back(std::move(u));
  }
  return out;
}

std::vector<std::shared_ptr<RRef>> UserTable::clear() {
  std::vector<std::shared_ptr<RRef>> held;
  std::lock_guard<std::mutex> lock(mutex_);
  cleared_ = true;
  for (auto& kv : pending_) held.push_back(std::move(kv.second));
  for (auto& kv : children_) held.push_back(std::move(kv.second.rref));
  pending_.clear();
  children_.clear();
  return held;
}

std::vector<UserTable::UserInfo> UserTable::users() const {
  std::vector<UserInfo> out;
  std::vector<std::shared_ptr<UserRRef>> keep = live();  // dropped after the lock (destructors lock)
  for (const auto& u : keep) {
    out.emplace_back(u->id().str(), u->forkId().str(), u->owner(), u->confirmed(), u->deleted());
  }
  return out;
}

std::vector<std::string> UserTable::pendingUsers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idStrings(pending_);
}

std::vector<std::string> UserTable::children() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idStrings(children_);
}

}  // namespace torchrpc::rref
