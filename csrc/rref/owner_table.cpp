#include "rref/owner_table.h"

#include <c10/util/Exception.h>

namespace torchrpc::rref {

OwnerTable::Entry& OwnerTable::entryLocked(const RRefId& id, int requester, bool* created) {
  auto it = entries_.find(id);
  if (created) *created = it == entries_.end();
  if (it != entries_.end()) return it->second;
  if (requester >= 0) {
    size_t& count = awaitedPerPeer_[requester];
    TORCH_CHECK(count < kMaxAwaitedPerPeer, "RRef ", id.str(), " does not exist on this worker (rank ", rank_,
                "), and rank ", requester, " already waits for ", count, " RRefs that do not exist yet (the cap is ",
                kMaxAwaitedPerPeer, " per peer); fetch or use an RRef only after the call that creates it was sent");
    ++count;
  }
  auto& entry = entries_[id];
  entry.awaitedBy = requester;
  entry.rref = std::make_shared<OwnerRRef>(ctx_, rank_, id);
  objects_[id] = entry.rref.get();
  return entry;
}

void OwnerTable::uncountLocked(Entry& entry) {
  if (entry.awaitedBy < 0) return;
  auto it = awaitedPerPeer_.find(entry.awaitedBy);
  if (it != awaitedPerPeer_.end() && --it->second == 0) awaitedPerPeer_.erase(it);
  entry.awaitedBy = kUnknownHolder;
}

std::shared_ptr<OwnerRRef> OwnerTable::maybeEraseLocked(const RRefId& id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.forks.empty() || it->second.state == State::kCreating) return nullptr;
  uncountLocked(it->second);
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

std::shared_ptr<OwnerRRef> OwnerTable::startCreation(const RRefId& id, const ForkId* forkId, int holder,
                                                     uint64_t* expiry) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& entry = entryLocked(id, kUnknownHolder);  // the creating call is no request about an unknown id
  TORCH_CHECK(entry.state == State::kAwaited && !entry.rref->value()->completed(), "RRef ", id.str(),
              " is already being created or was created");
  uncountLocked(entry);
  if (expiry) *expiry = entry.expiry;
  entry.expiry = 0;
  entry.state = State::kCreating;
  if (forkId) entry.forks[*forkId] = holder;
  return entry.rref;
}

std::shared_ptr<OwnerRRef> OwnerTable::endCreation(const RRefId& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;  // cleared by shutdown meanwhile
  it->second.state = State::kReady;
  return maybeEraseLocked(id);
}

std::shared_ptr<OwnerRRef> OwnerTable::awaited(const RRefId& id, int requester, bool* created) {
  std::lock_guard<std::mutex> lock(mutex_);
  *created = false;
  if (cleared_) return nullptr;
  return entryLocked(id, requester, created).rref;
}

std::shared_ptr<OwnerRRef> OwnerTable::addFork(const RRefId& id, const ForkId& forkId, int holder, bool* created) {
  std::lock_guard<std::mutex> lock(mutex_);
  *created = false;
  if (cleared_) return nullptr;
  auto& entry = entryLocked(id, holder, created);
  entry.forks[forkId] = holder;
  return entry.rref;
}

void OwnerTable::addForkOf(const std::shared_ptr<OwnerRRef>& owner, const ForkId& forkId, int holder) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& entry = entries_[owner->id()];
  if (!entry.rref) {
    entry.rref = owner;
    entry.state = State::kReady;
  }
  entry.forks[forkId] = holder;
}

std::shared_ptr<OwnerRRef> OwnerTable::removeFork(const RRefId& id, const ForkId& forkId, bool* known) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  const bool found = it != entries_.end() && it->second.forks.erase(forkId) > 0;
  if (known) *known = found;
  return found ? maybeEraseLocked(id) : nullptr;
}

std::shared_ptr<OwnerRRef> OwnerTable::find(const RRefId& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.rref;
}

std::shared_ptr<OwnerRRef> OwnerTable::withFork(const RRefId& id, const ForkId& forkId) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cleared_) return nullptr;
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.forks.count(forkId)) return nullptr;
  return it->second.rref;
}

bool OwnerTable::setExpiry(const RRefId& id, const OwnerRRef* rref, uint64_t timer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.rref.get() != rref || it->second.state != State::kAwaited) return false;
  it->second.expiry = timer;
  return true;
}

std::shared_ptr<OwnerRRef> OwnerTable::expire(const RRefId& id, const OwnerRRef* rref) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.rref.get() != rref || it->second.state != State::kAwaited) return nullptr;
  uncountLocked(it->second);
  auto held = std::move(it->second.rref);
  entries_.erase(it);
  return held;
}

std::vector<std::shared_ptr<OwnerRRef>> OwnerTable::releasePeer(int rank, size_t* forks) {
  std::vector<std::shared_ptr<OwnerRRef>> erased;
  *forks = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RRefId> touched;
  for (auto& [id, entry] : entries_) {
    bool touches = false;
    if (entry.awaitedBy == rank) {
      uncountLocked(entry);
      touches = true;
    }
    for (auto f = entry.forks.begin(); f != entry.forks.end();) {
      if (f->second == rank) {
        f = entry.forks.erase(f);
        ++*forks;
        touches = true;
      } else {
        ++f;
      }
    }
    if (touches) touched.push_back(id);
  }
  for (const auto& id : touched) {
    if (auto rref = maybeEraseLocked(id)) erased.push_back(std::move(rref));
  }
  return erased;
}

size_t OwnerTable::awaitedCount(int requester) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = awaitedPerPeer_.find(requester);
  return it == awaitedPerPeer_.end() ? 0 : it->second;
}

std::vector<std::shared_ptr<OwnerRRef>> OwnerTable::clear() {
  std::vector<std::shared_ptr<OwnerRRef>> held;
  std::lock_guard<std::mutex> lock(mutex_);
  cleared_ = true;
  for (auto& kv : entries_) held.push_back(std::move(kv.second.rref));
  entries_.clear();
  awaitedPerPeer_.clear();
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
