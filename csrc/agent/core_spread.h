#pragma once

// CoreSpread: keeps the pool threads that serve long tasks on different
// cores.
//
// The kernel places a thread when it wakes and rebalances its run queues
// every few milliseconds; in between, two pool threads can share one core
// while another idles, and a request then waits a whole task behind the
// other.
//
// A pool thread that polls after a long task, or starts a task after one,
// calls settle(): it is counted on its core, and when another pool thread is
// counted there and an allowed core has none, it moves itself there
// (sched_setaffinity to that core, then back to the mask it had, so the
// kernel stays free to move it later). leave() uncounts it: before it sleeps,
// and when its task sends the answer (the caller's threads, woken by the
// answer, often preempt it on its core).
// Measurements: benchmarks/HISTORY.md.

#include <atomic>
#include <memory>

namespace torchrpc::agent {

class CoreSpread {
 public:
  CoreSpread();

  // Counts the calling thread on the core it runs on, first moving it to a
  // core with no counted pool thread if another is counted on its own.
  // Returns false if it still shares its core.
  bool settle();
  // Uncounts the calling thread; nothing if it is not counted.
  static void leave();

 private:
  bool moveOff(int core);

  const int cores_;  // CPU ids are below this
  std::unique_ptr<std::atomic<int>[]> present_;  // pool threads counted, per CPU id
};

}  // namespace torchrpc::agent
