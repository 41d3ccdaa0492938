#pragma once

// Pending: the calls this worker is waiting on. Only the agent uses it.
// It knows request ids, deadlines and which connection each call went out on,
// so a response, a deadline or a closed connection completes each future
// exactly once. A sweeper thread sleeps until the earliest deadline (no
// polling; an idle worker with no calls in flight sleeps forever).

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"

namespace torchrpc::agent {

class Pending {
 public:
  using Clock = std::chrono::steady_clock;
  using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

  struct Call {
    FuturePtr future;
    int peer{-1};
    uint64_t connectionId{0};
    std::string description;  // "rpc_sync #7 worker0 -> worker1 'fn'"
    double timeoutSeconds{0};  // 0: none
    Clock::time_point start;
    Clock::time_point deadline;
  };

  // `optionsType`: where the default timeout is set, as the timeout error names it.
  Pending(std::string workerName, std::string optionsType);
  ~Pending();

  uint64_t nextId() { return nextId_.fetch_add(1); }
  void add(uint64_t id, Call call);
  void setConnection(uint64_t id, uint64_t connectionId);
  // Removes and returns the call, if it is still pending (and, when
  // `connectionId` is given, went out on that connection: a response counts
  // only from the connection its request went to; 0 is a call to oneself).
  std::optional<Call> take(uint64_t id, std::optional<uint64_t> connectionId = std::nullopt);

  // Fails every call sent on this connection; `why` gets the call description.
  void failConnection(uint64_t connectionId, common::ErrorKind kind,
                      const std::function<std::string(const Call&)>& why);
  // Fails everything (local shutdown).
  void failAll(common::ErrorKind kind, const std::string& why);

  size_t size() const;
  // Blocks until no call is pending or the deadline passes; returns size().
  size_t waitEmpty(Clock::time_point deadline);

  void stop();

 private:
  void sweep();

  const std::string workerName_;
  const std::string optionsType_;
  std::atomic<uint64_t> nextId_{1};
  mutable std::mutex mutex_;
  std::condition_variable cv_;       // sweeper wake-ups
  std::condition_variable emptyCv_;  // waitEmpty
  std::unordered_map<uint64_t, Call> calls_;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_;
  // When the sweeper wakes next, unless notified (it may be earlier than the
  // first deadline left: that call completed meanwhile).
  Clock::time_point sweeperWakesAt_{Clock::time_point::min()};
  bool stopping_{false};
  std::thread sweeper_;
};

}  // namespace torchrpc::agent
