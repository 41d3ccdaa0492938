#include "rref/user_table.h"

namespace torchrpc::rref {

void UserTable::add(const std::shared_ptr<UserRRef>& user, bool pending) {
  std::lock_guard<std::mutex> lock(mutex_);
  users_[user->forkId()] = user;
  if (pending) pending_[user->forkId()] = user;
}

void UserTable::remove(const ForkId& forkId) {
  std::shared_ptr<UserRRef> drop;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(forkId);
  if (it != pending_.end()) {
    drop = std::move(it->second);
    pending_.erase(it);
  }
  users_.erase(forkId);
  // `drop` is not the last reference: the caller holds the user.
}

std::shared_ptr<UserRRef> UserTable::takePending(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(forkId);
  if (it == pending_.end()) return nullptr;
  auto user = std::move(it->second);
  pending_.erase(it);
  return user;
}

bool UserTable::forget(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = users_.find(forkId);
  if (it != users_.end() && it->second.expired()) users_.erase(it);
  return !cleared_;
}

void UserTable::holdChild(const ForkId& forkId, std::shared_ptr<RRef> rref) {
  std::lock_guard<std::mutex> lock(mutex_);
  children_[forkId] = std::move(rref);
}

std::shared_ptr<RRef> UserTable::releaseChild(const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = children_.find(forkId);
  if (it == children_.end()) return nullptr;
  auto rref = std::move(it->second);
  children_.erase(it);
  return rref;
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
  for (auto& kv : children_) held.push_back(std::move(kv.second));
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
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kv : pending_) out.push_back(kv.first.str());
  return out;
}

std::vector<std::string> UserTable::children() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kv : children_) out.push_back(kv.first.str());
  return out;
}

}  // namespace torchrpc::rref
