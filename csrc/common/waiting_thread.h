#pragma once

// WaitingThread: a thread that waits for a future runs, meanwhile, the tasks
// other threads hand it, instead of the pool running them.
//
// For distributed autograd's root: its part of the graph (a trainer's LSTM)
// comes back to it in AUTOGRAD_BACKWARD messages while it waits in
// backward(). On a pool thread that part, and the next forward, ran slower
// than on the thread that built it: its tensors sat in another core's caches
// (measurements: benchmarks/HISTORY.md).
//
// The thread takes one task at a time: a task offered while it runs another,
// or while one waits for it, goes to the pool, so tasks that can run in
// parallel still do. It takes one from the moment it is made, so a task
// offered while the thread still works before its wait (backward()'s own
// pass) runs on it too, after that work.

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace torchrpc::common {

class WaitingThread : public std::enable_shared_from_this<WaitingThread> {
 public:
  using Task = std::function<void()>;

  // `worker` and `what` name the wait in the log line of a task that throws.
  WaitingThread(std::string worker, std::string what) : worker_(std::move(worker)), what_(std::move(what)) {}

  // If the thread has no task (none waiting, none running), takes
  // makeTask() (called under the lock) and returns true; otherwise returns
  // false without calling it. Any thread; never waits for the thread's work.
  template <typename MakeTask>
  bool offer(MakeTask&& makeTask) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!accepting_) return false;
      task_ = makeTask();
      accepting_ = false;
      hasTask_.store(true, std::memory_order_release);
    }
    cv_.notify_one();
    return true;
  }

  // Runs offered tasks on the calling thread until `future` completes. Polls
  // first, as spinThenWait does, then sleeps, calling onSleep (if any) every
  // 100 ms asleep: to run Python's signal handlers; an exception it throws
  // ends the wait. Then close(elsewhere).
  void serveUntil(c10::ivalue::Future& future, const std::function<void()>& onSleep,
                  const std::function<void(Task)>& elsewhere);
  // Takes no more tasks; one taken but not run goes to `elsewhere` (the
  // pool). For a thread that will not serve after all (its work threw).
  void close(const std::function<void(Task)>& elsewhere);

 private:
  Task take();  // the offered task, if any (offers stay refused until it has run)

  const std::string worker_, what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool accepting_{true};  // no task waiting or running, and still waiting: offer() may hand one
  std::atomic<bool> hasTask_{false};  // task_ is set (polled without the lock)
  Task task_;
};

}  // namespace torchrpc::common
