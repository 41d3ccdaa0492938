#include "rref/owner_table.h"

#include <c10/util/Exception.h>

namespace torchrpc::rref {

OwnerTable::Entry& OwnerTable::entryLocked(const RRefId& id) {
  auto& entry = entries_[id];
  if (!entry.rref) {
    entry.rref = std::make_shared<OwnerRRef>(ctx_, rank_, id);
    objects_[id] = entry.rref.get();
  }
  return entry;
}

std::shared_ptr<OwnerRRef> OwnerTable::maybeEraseLocked(const RRefId& id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.forks.empty() || it->second.state == State::kCreating) return nullptr;
  auto rref = std::move(it->second.rref);
  entries_.erase(it);
  return rref;
}

void OwnerTable::addObject(const std::shared_ptr<OwnerRRef>& owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_[owner->id()] = owner.get();
}

void OwnerTable::forgetObject(const RRefId& id, const OwnerRRef* owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = objects_.find(id);
  if (it != objects_.end() && it->second == owner) objects_.erase(it);
}

std::shared_ptr<OwnerRRef> OwnerTable::startCreation(const RRefId& id, const ForkId* forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& entry = entryLocked(id);
  TORCH_CHECK(entry.state == State::kAwaited && !entry.rref->value()->completed(), "RRef ", id.str(),
              " is already being created or was created");
  entry.state = State::kCreating;
  if (forkId) entry.forks.insert(*forkId);
  return entry.rref;
}

std::shared_ptr<OwnerRRef> OwnerTable::endCreation(const RRefId& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;  // cleared by shutdown meanwhile
  it->second.state = State::kReady;
  return maybeEraseLocked(id);
}

std::shared_ptr<OwnerRRef> OwnerTable::awaited(const RRefId& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cleared_) return nullptr;
  return entryLocked(id).rref;
}

void OwnerTable::addFork(const RRefId& id, const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  entryLocked(id).forks.insert(forkId);
}

void OwnerTable::addForkOf(const std::shared_ptr<OwnerRRef>& owner, const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& entry = entries_[owner->id()];
  if (!entry.rref) {
    entry.rref = owner;
    entry.state = State::kReady;
  }
  entry.forks.insert(forkId);
}

std::shared_ptr<OwnerRRef> OwnerTable::removeFork(const RRefId& id, const ForkId& forkId, bool* known) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  const bool found = it != entries_.end() && it->second.forks.erase(forkId) > 0;
  if (known) *known = found;
  return found ? maybeEraseLocked(id) : nullptr;
}

std::shared_ptr<OwnerRRef> OwnerTable::withFork(const RRefId& id, const ForkId& forkId) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cleared_) return nullptr;
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.forks.count(forkId)) return nullptr;
  return it->second.rref;
}

std::vector<std::shared_ptr<OwnerRRef>> OwnerTable::clear() {
  std::vector<std::shared_ptr<OwnerRRef>> held;
  std::lock_guard<std::mutex> lock(mutex_);
  cleared_ = true;
  for (auto& kv : entries_) held.push_back(std::move(kv.second.rref));
  entries_.clear();
  return held;
}

std::vector<OwnerTable::EntryInfo> OwnerTable::entries() const {
  std::vector<EntryInfo> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, entry] : entries_) {
    const auto& v = entry.rref->value();
    out.emplace_back(id.str(), idStrings(entry.forks), v->completed() && !v->hasError(),
                     v->completed() && v->hasError());
  }
  return out;
}

std::vector<std::string> OwnerTable::objects() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idStrings(objects_);
}

}  // namespace torchrpc::rref
