#include "agent/pending.h"

#include <cstdio>

#include "common/thread_name.h"

namespace torchrpc::agent {

Pending::Pending(std::string workerName, std::string optionsType)
    : workerName_(std::move(workerName)), optionsType_(std::move(optionsType)) {
  sweeper_ = std::thread([this] {
    common::nameThisThread("rpc-timeouts");
    sweep();
  });
}

Pending::~Pending() { stop(); }

void Pending::add(uint64_t id, Call call) {
  bool earliest = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (call.timeoutSeconds > 0) {
      // Wake the sweeper only if it sleeps past this deadline: back-to-back
      // calls with the same timeout each finish before it matters, and waking
      // it on every call cost a context switch per call.
      earliest = call.deadline < sweeperWakesAt_;
      deadlines_.insert(std::make_pair(call.deadline, id));
    }
    calls_.emplace(id, std::move(call));
  }
  if (earliest) cv_.notify_one();
}

void Pending::setConnection(uint64_t id, uint64_t connectionId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it != calls_.end()) it->second.connectionId = connectionId;
}

std::optional<Pending::Call> Pending::take(uint64_t id, std::optional<uint64_t> connectionId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return std::nullopt;
  if (connectionId && it->second.connectionId != *connectionId) return std::nullopt;
  Call call = std::move(it->second);
  calls_.erase(it);
  if (call.timeoutSeconds > 0) deadlines_.erase({call.deadline, id});
  if (calls_.empty()) emptyCv_.notify_all();
  return call;
}

void Pending::failConnection(uint64_t connectionId, common::ErrorKind kind,
                             const std::function<std::string(const Call&)>& why) {
  std::vector<Call> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->second.connectionId == connectionId) {
        if (it->second.timeoutSeconds > 0) deadlines_.erase({it->second.deadline, it->first});
        failed.push_back(std::move(it->second));
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
    if (calls_.empty()) emptyCv_.notify_all();
  }
  for (Call& c : failed) {
    c.future->setErrorIfNeeded(common::makeRpcError(kind, why(c)));
  }
}

void Pending::failAll(common::ErrorKind kind, const std::string& why) {
  std::vector<Call> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : calls_) failed.push_back(std::move(kv.second));
    calls_.clear();
    deadlines_.clear();
    emptyCv_.notify_all();
  }
  for (Call& c : failed) {
    c.future->setErrorIfNeeded(common::makeRpcError(kind, c.description + ": " + why));
  }
}

size_t Pending::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

size_t Pending::waitEmpty(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  emptyCv_.wait_until(lock, deadline, [this] { return calls_.empty(); });
  return calls_.size();
}

void Pending::sweep() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (deadlines_.empty()) {
      sweeperWakesAt_ = Clock::time_point::max();
      cv_.wait(lock);
      continue;
    }
    auto first = *deadlines_.begin();
    if (Clock::now() < first.first) {
      sweeperWakesAt_ = first.first;
      cv_.wait_until(lock, first.first);
      continue;
    }
    deadlines_.erase(deadlines_.begin());
    auto it = calls_.find(first.second);
    if (it == calls_.end()) continue;
    Call call = std::move(it->second);
    calls_.erase(it);
    if (calls_.empty()) emptyCv_.notify_all();
    lock.unlock();
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.3g", call.timeoutSeconds);
    char ms[32];
    std::snprintf(ms, sizeof(ms), "%.0f", call.timeoutSeconds * 1000.0);
    call.future->setErrorIfNeeded(common::makeRpcError(
        common::ErrorKind::kTimeout,
        call.description + " timed out after " + secs +
            " s (set by the timeout= argument, or " + optionsType_ + ".rpc_timeout by default): RPC ran for more than "
            "set timeout (" + ms + " ms) and will now be marked with an error"));
    lock.lock();
  }
}

void Pending::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

}  // namespace torchrpc::agent
