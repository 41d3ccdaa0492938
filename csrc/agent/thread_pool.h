#pragma once

// ThreadPool: a fixed set of threads that run request handlers. Idle threads
// poll briefly right after a task (see work()), then sleep: an idle pool uses
// no CPU. Tasks run in FIFO order; idle threads are woken in LIFO order.
// run() may be called from any thread; stop() runs what is queued, then joins.
//
// At most `activeCap` threads (default: the usable cores) run fresh tasks
// (started less than `stall` ago, default kStall) at once: a task queued while
// they are busy waits for one of them rather than waking another thread,
// which would only take turns with them on the same cores. A watch thread
// wakes a sleeper for it when the pool takes no task for `stall` (its tasks
// block, waiting for a queued one, say), so nothing waits on a blocked task.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/core_spread.h"

namespace torchrpc::agent {

class ThreadPool {
 public:
  // `idlePoll`, if given, is called on every round of an idle thread's poll
  // after a long task (see work()): the agent reads the transport there.
  // `activeCap` 0: the usable cores.
  ThreadPool(size_t numThreads, std::string workerName, std::function<void()> idlePoll = nullptr,
             size_t activeCap = 0, std::chrono::microseconds stall = kStall);
  ~ThreadPool();

  void run(std::function<void()> task);
  // Lets queued and running tasks finish, up to timeoutSeconds; returns false
  // if some thread is still busy then (its threads are detached and the pool
  // must be leaked, not destroyed).
  bool stop(double timeoutSeconds = 1e9);

  size_t size() const { return threads_.size(); }
  // Tasks queued or running; for shutdown and debugging.
  size_t busy() const;
  // The calling thread is a thread of some pool (it must never wait on a peer).
  static bool onPoolThread();
  // Tasks queued on the pools of this process so far (tests, diagnostics).
  static uint64_t tasksQueued();

 private:
  // A task that ran this long without finishing no longer counts against activeCap.
  static constexpr std::chrono::microseconds kStall{1000};

  using Clock = std::chrono::steady_clock;

  static constexpr std::chrono::microseconds kBusySpin{2000};
  static constexpr std::chrono::microseconds kLongTask{500};

  // An idle thread waiting for a task, on its own condition variable.
  struct Sleeper {
    std::condition_variable cv;
    bool woken = false;
  };

  void work(size_t slot);
  void watch();
  // Some queued task is one that no polling thread or woken sleeper will take
  // (a poller that gives up re-checks the queue under the lock).
  bool unclaimedLocked() const;
  // The threads running fresh tasks (begun less than stall_ ago), with the
  // sleepers woken for one, leave room under activeCap_.
  bool roomLocked() const;
  Sleeper* popSleeperLocked();

  const std::string workerName_;
  const std::function<void()> idlePoll_;
  const size_t cores_;  // CPUs this process may run on
  const size_t activeCap_;
  const std::chrono::microseconds stall_;
  mutable std::mutex mutex_;
  // Idle threads, the one that went to sleep last at the back: run() wakes
  // that one. Its cache is warm and the kernel tends to run it on the core it
  // last used, which is not the core of a thread that is still busy. Waking
  // in FIFO order (one shared condition variable) picked long-idle threads
  // that the kernel often queued behind a busy thread while the other core
  // idled: a CPU-bound callee with 2 callers on 2 cores served them one at a
  // time (1.1x the rate of 1 caller).
  std::vector<Sleeper*> sleepers_;
  std::deque<std::function<void()>> tasks_;
  std::atomic<size_t> queued_{0};  // tasks_.size(), readable without the lock
  std::atomic<size_t> spinning_{0};  // idle threads about to sleep, polling or not (see work())
  std::atomic<size_t> running_{0};  // changed under mutex_, read without it
  size_t waking_{0};  // sleepers woken that have not yet come back for a task
  uint64_t taken_{0};  // tasks taken so far: the watch thread's measure of progress
  std::vector<Clock::time_point> started_;  // by thread: when its task started; {} while idle
  bool watching_{false};  // a task waits for a busy thread: the watch thread checks on it
  std::condition_variable watchCv_;
  std::thread watcher_;
  size_t alive_{0};
  std::condition_variable exited_;
  std::atomic<bool> stopping_{false};
  CoreSpread spread_;
  std::vector<std::thread> threads_;
};

}  // namespace torchrpc::agent
