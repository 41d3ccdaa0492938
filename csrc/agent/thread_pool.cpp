#include "agent/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <sched.h>

#include "common/intra_op.h"
#include "common/malloc_arenas.h"
#include "common/logging.h"
#include "common/spin.h"
#include "common/thread_name.h"

namespace torchrpc::agent {

namespace {

// CPUs this process may run on (its affinity mask, as taskset sets it).
size_t usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

thread_local bool inPool = false;

}  // namespace

bool ThreadPool::onPoolThread() { return inPool; }

ThreadPool::ThreadPool(size_t numThreads, std::string workerName, std::function<void()> idlePoll, size_t activeCap,
                       std::chrono::microseconds stall)
    : workerName_(std::move(workerName)),
      idlePoll_(std::move(idlePoll)),
      cores_(usableCores()),
      activeCap_(activeCap > 0 ? activeCap : cores_),
      stall_(stall),
      started_(numThreads) {
  common::reserveMallocArenas(numThreads);  // an arena each: tensor ops in parallel never share a malloc lock
  threads_.reserve(numThreads);
  alive_ = numThreads;
  for (size_t i = 0; i < numThreads; ++i) {
    threads_.emplace_back([this, i] {
      common::nameThisThread("rpc-pool");
      inPool = true;
      work(i);
    });
  }
  watcher_ = std::thread([this] {
    common::nameThisThread("rpc-pool-watch");
    watch();
  });
}

ThreadPool::~ThreadPool() { stop(); }

bool ThreadPool::unclaimedLocked() const { return tasks_.size() > spinning_.load() + waking_; }

bool ThreadPool::roomLocked() const {
  const auto now = Clock::now();
  size_t fresh = 0;
  for (const auto& started : started_) {
    if (started != Clock::time_point{} && now - started < stall_) ++fresh;
  }
  return waking_ + fresh < activeCap_;
}

ThreadPool::Sleeper* ThreadPool::popSleeperLocked() {
  Sleeper* sleeper = sleepers_.back();
  sleepers_.pop_back();
  sleeper->woken = true;
  ++waking_;
  return sleeper;
}

namespace {
std::atomic<uint64_t> tasksQueuedSoFar{0};
}  // namespace

uint64_t ThreadPool::tasksQueued() { return tasksQueuedSoFar.load(std::memory_order_relaxed); }

void ThreadPool::run(std::function<void()> task) {
  tasksQueuedSoFar.fetch_add(1, std::memory_order_relaxed);
  Sleeper* wake = nullptr;
  bool check = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    queued_.store(tasks_.size());
    if (unclaimedLocked()) {
      if (!sleepers_.empty() && roomLocked()) {
        wake = popSleeperLocked();
      } else if (!watching_) {
        watching_ = check = true;  // it waits for a busy thread: the watch thread checks that one finishes
      }
    }
  }
  if (wake != nullptr) wake->cv.notify_one();
  if (check) watchCv_.notify_one();
}

void ThreadPool::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (!watching_) {
      watchCv_.wait(lock);  // no timeout: idle until a task waits (an idle pool uses no CPU)
      continue;
    }
    const uint64_t before = taken_;
    watchCv_.wait_for(lock, stall_);
    if (stopping_) break;
    if (tasks_.empty()) {
      watching_ = false;
      continue;
    }
    // No task taken for stall_ (the busy threads block or compute at length),
    // or the tasks running went stale: one more thread takes the next task.
    if (unclaimedLocked() && !sleepers_.empty() && (taken_ == before || roomLocked())) {
      popSleeperLocked()->cv.notify_one();
    }
  }
}

size_t ThreadPool::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.size() + running_;
}

void ThreadPool::work(size_t slot) {
  common::initIntraOpThreads();
  bool lastTaskLong = false;  // this thread's last task ran for kLongTask or more
  common::AdaptiveSpin spin;          // polls after short tasks
  common::AdaptiveSpin afterLong(1);  // polls after long tasks: kBusySpin outlasts any round trip
  // This thread's place on the stack of sleepers, alive as long as the
  // thread: run() notifies it after unlocking, when a spurious wake-up may
  // have let this thread go on already.
  Sleeper me;
  while (true) {
    std::function<void()> task;
    Clock::time_point started;
    // Idle threads poll for the next task before they sleep; polling saves
    // the wake-up latency.
    //
    // After a short task, one idle thread at a time polls, for the short
    // budget (spinBudget); the others sleep at once: many pollers would take
    // the CPU from the I/O thread that brings the tasks.
    //
    // After a long task (kLongTask or more), the thread polls for up to
    // kBusySpin, and so may one such thread per core: its caller tends to
    // send the next request soon, and a sleeping thread's wake-up would wait
    // for a computing core's time slice. The site stops polling after a few
    // waits that outlasted kBusySpin (AdaptiveSpin). The poll yields on every
    // round. On every round the poller also:
    // - reads the transport itself (idlePoll_, Loop::pollOnce), so a request
    //   becomes its task with no wake-up of the loop thread;
    // - keeps off cores where another pool thread is (CoreSpread); a poller
    //   that shares its core and cannot move stops.
    // Measurements: benchmarks/HISTORY.md.
    auto ready = [this] { return queued_.load() > 0 || stopping_; };
    const size_t spinners = spinning_.fetch_add(1);
    const bool polledLong = lastTaskLong && spinners < cores_;
    const bool polled = !polledLong && spinners == 0;
    if (polledLong) {
      afterLong.until([&] {
        if (ready()) return true;
        if (idlePoll_) {
          idlePoll_();
          if (ready()) return true;
        }
        return !spread_.settle();
      }, kBusySpin);
    } else if (polled) {
      spin.until(ready);
    }
    spinning_.fetch_sub(1);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stopping_ && tasks_.empty()) {
        CoreSpread::leave();  // a sleeper holds no core
        // Sleep on the stack of idle threads: run() wakes the one that went
        // to sleep last (see sleepers_).
        me.woken = false;
        sleepers_.push_back(&me);
        me.cv.wait(lock, [&] { return me.woken || stopping_.load(); });
        if (me.woken) {
          --waking_;
        } else {
          sleepers_.erase(std::find(sleepers_.begin(), sleepers_.end(), &me));
        }
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
      ++taken_;
      started = started_[slot] = Clock::now();
    }
    if (polled) spin.done();
    if (polledLong) afterLong.done();
    if (lastTaskLong) spread_.settle();  // a poller, or a thread just woken
    try {
      task();
    } catch (const std::exception& e) {
      // Handlers turn their own errors into responses; this is a bug guard.
      TORCHRPC_WARN(workerName_, "uncaught exception in a pool task: " << e.what());
    }
    CoreSpread::leave();
    lastTaskLong = Clock::now() - started >= kLongTask;
    std::lock_guard<std::mutex> lock(mutex_);
    --running_;
    started_[slot] = Clock::time_point{};
  }
}

bool ThreadPool::stop(double timeoutSeconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  for (Sleeper* sleeper : sleepers_) sleeper->cv.notify_one();
  watchCv_.notify_one();
  bool finished = exited_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                                   [this] { return alive_ == 0; });
  lock.unlock();
  if (watcher_.joinable()) watcher_.join();  // it ends at once on stopping_
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

}  // namespace torchrpc::agent
