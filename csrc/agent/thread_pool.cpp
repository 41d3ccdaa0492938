#include "agent/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "common/intra_op.h"
#include "common/malloc_arenas.h"
#include "common/logging.h"
#include "common/spin.h"
#include "common/thread_name.h"

namespace torchrpc {

ThreadPool::ThreadPool(size_t numThreads, std::string workerName)
    : workerName_(std::move(workerName)) {
  reserveMallocArenas(numThreads);  // an arena each: tensor ops in parallel never share a malloc lock
  threads_.reserve(numThreads);
  alive_ = numThreads;
  for (size_t i = 0; i < numThreads; ++i) {
    threads_.emplace_back([this] {
      nameThisThread("rpc-pool");
      work();
    });
  }
}

ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::run(std::function<void()> task) {
  Sleeper* wake = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    queued_.store(tasks_.size());
    // A spinning thread will pick the task up; wake a sleeper only if none
    // spins (a spinner that gives up re-checks the queue under the lock).
    if ((spinning_.load() == 0 || tasks_.size() > 1) && !sleepers_.empty()) {
      wake = sleepers_.back();
      sleepers_.pop_back();
      wake->woken = true;
    }
  }
  if (wake != nullptr) wake->cv.notify_one();
}

size_t ThreadPool::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.size() + running_;
}

void ThreadPool::work() {
  initIntraOpThreads();
  bool lastTaskLong = false;  // this thread's last task ran for kLongTask or more
  AdaptiveSpin spin;
  while (true) {
    std::function<void()> task;
    // One idle thread at a time spins for the next task (it saves the wake-up
    // latency); the others sleep at once. Many spinners would take the CPU
    // from the I/O thread that brings the tasks (128 calls in flight on 2
    // cores: 28k -> 5k calls/s).
    //
    // A callee of long calls (its last task took kLongTask or more) spins for
    // up to kBusySpin while other threads still run tasks: their callers tend
    // to send the next request soon after the answer, and while the other
    // cores compute, a sleeping thread's wake-up waits for one of them to
    // finish its time slice (~1 ms). A CPU-bound callee with 2 callers on 2
    // cores: 1.41-1.56x -> 1.61-1.66x the rate of 1 caller. The spin yields on
    // every round, so it only uses a core that nothing else wants, and never
    // when the pool is idle. Callees of short calls (distributed autograd,
    // RRef traffic) keep the short spin: their callers' own threads need the
    // cores.
    const bool polled = spinning_.fetch_add(1) == 0;
    if (polled) {
      auto ready = [this] { return queued_.load() > 0 || stopping_; };
      if (!spin.until(ready) && lastTaskLong && running_.load() > 0) {
        spinUntil([&] { return ready() || running_.load() == 0; }, kBusySpin);
      }
    }
    spinning_.fetch_sub(1);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stopping_ && tasks_.empty()) {
        // Sleep on the stack of idle threads: run() wakes the one that went
        // to sleep last (see sleepers_).
        Sleeper me;
        sleepers_.push_back(&me);
        me.cv.wait(lock, [&] { return me.woken || stopping_.load(); });
        if (!me.woken) sleepers_.erase(std::find(sleepers_.begin(), sleepers_.end(), &me));
      }
      if (tasks_.empty()) {  // stopping and drained
        --alive_;
        exited_.notify_all();
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
      queued_.store(tasks_.size());
      ++running_;
    }
    if (polled) spin.done();
    const auto started = std::chrono::steady_clock::now();
    try {
      task();
    } catch (const std::exception& e) {
      // Handlers turn their own errors into responses; this is a bug guard.
      TORCHRPC_WARN(workerName_, "uncaught exception in a pool task: " << e.what());
    }
    lastTaskLong = std::chrono::steady_clock::now() - started >= kLongTask;
    std::lock_guard<std::mutex> lock(mutex_);
    --running_;
  }
}

bool ThreadPool::stop(double timeoutSeconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  for (Sleeper* sleeper : sleepers_) sleeper->cv.notify_one();
  bool finished = exited_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                                   [this] { return alive_ == 0; });
  lock.unlock();
  for (auto& t : threads_) {
    if (!t.joinable() || t.get_id() == std::this_thread::get_id()) continue;
    if (finished) {
      t.join();
    } else {
      t.detach();
    }
  }
  if (!finished) {
    TORCHRPC_WARN(workerName_, "shutdown: " << busy()
                                  << " task(s) still running after " << timeoutSeconds
                                  << " s; leaving their threads behind");
  }
  return finished;
}

}  // namespace torchrpc
