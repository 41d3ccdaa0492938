#pragma once

// Timers: runs callbacks at given times on one thread of its own, which
// sleeps until the earliest (no polling; with nothing scheduled it sleeps
// until stop()). For deadlines of protocol state (an awaited RRef that must
// expire, a lost peer's grace period), not of calls (agent/pending.h).
//
// Callbacks run on the timer thread, one at a time, and must not block for
// long; an exception they throw is logged, never propagated. Callbacks not
// yet run when stop() is called are dropped, unrun. The thread keeps its
// state alive itself, so a callback may destroy the Timers. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

namespace torchrpc::common {

class Timers {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;  // never 0

  explicit Timers(std::string workerName);
  ~Timers() { stop(); }
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;

  // Runs fn at `when` (at once if it passed), unless cancelled. Ignored
  // after stop().
  Id at(Clock::time_point when, std::function<void()> fn);
  Id after(double seconds, std::function<void()> fn);
  // Drops a callback that has not run yet (a no-op if it ran or is running).
  void cancel(Id id);
  // Drops what is scheduled and joins the thread (unless called from a
  // callback: the thread then ends after it); idempotent.
  void stop();

 private:
  struct State {
    std::string workerName;
    std::mutex mutex;
    std::condition_variable cv;
    std::map<std::pair<Clock::time_point, Id>, std::function<void()>> due;
    std::unordered_map<Id, Clock::time_point> whenOf;  // the key of each id in `due`
    Id nextId{1};
    bool stopping{false};
  };
  static void run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::mutex threadMutex_;
  std::thread thread_;  // started by the first at()
};

}  // namespace torchrpc::common
