#pragma once

// Bounded spinning before a blocking wait.
//
// Waking a sleeping thread costs more than the work of a tiny RPC, and a
// call crosses four such waits (callee I/O thread, callee pool thread, caller
// I/O thread, caller). Each first polls its condition for a short budget,
// yielding on every round, and only then sleeps. The budget applies only
// right after activity: an idle worker sleeps and uses no CPU.
//
// TORCHRPC_SPIN_US sets the budget (default 300 us; 0 disables). It must
// outlast a round trip in which every site sleeps, or a pair of workers can
// settle into that slow mode. Wait sites that come back often use
// AdaptiveSpin (below).
//
// While this process takes part in a distributed autograd context, the
// budget is TORCHRPC_SPIN_AUTOGRAD_US (default 2000): a training iteration is
// a chain of dependent calls with a little compute in between, and with the
// short budget every thread on the other side is asleep when the next
// message comes. A worker with an open context but no traffic still sleeps.
// Measurements: benchmarks/HISTORY.md.
//
// Every poll first asks the process's WaitPolicy (common/wait_policy.h): a
// thread polls only while that measures polling as free (no work waits for
// the core it would take); otherwise it sleeps at once.

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "common/wait_policy.h"

namespace torchrpc::common {

// The current budget: TORCHRPC_SPIN_US, or the training budget while
// setTrainingSpin(true) holds; zero when TORCHRPC_SPIN_US=0.
std::chrono::microseconds spinBudget();

// False when TORCHRPC_SPIN_US=0: no wait polls at all.
bool spinEnabled();

// Set by the distributed autograd contexts (csrc/autograd/context.cpp): on
// while this process holds at least one.
void setTrainingSpin(bool on);

// Polls `ready` until it returns true or the budget runs out; returns its last
// value. `budget` defaults to spinBudget(); TORCHRPC_SPIN_US=0 disables every
// spin, and the wait policy any one poll.
template <typename Ready>
bool spinUntil(Ready&& ready, std::chrono::microseconds budget = spinBudget()) {
  if (budget.count() <= 0 || !spinEnabled()) return ready();
  if (ready()) return true;
  const auto start = std::chrono::steady_clock::now();
  PollGrant grant(start);
  if (!grant) return false;
  const auto end = start + budget;
  while (true) {
    if (ready()) return true;
    const auto now = std::chrono::steady_clock::now();
    // The host may have changed since the poll began (work woke up): ask again.
    if (now >= end || !grant.keep(now)) return false;
    sched_yield();
  }
}

// One thread's wait site that learns whether polling pays. until() polls
// (or not); the site then sleeps if it must, and calls done() when its wait
// is over (always: done() is what learns). A wait is long when it lasted
// over kLongWait and over twice the budget, so that no poll could have ended
// it. After kGiveUp long waits in a row (a CPU-bound callee, a peer that
// calls rarely) the site sleeps at once, until a wait is short again:
// polling through a long wait only takes a core from threads that compute.
//
// "The poll ran out" would be the wrong test: when every site sleeps at
// once, a round trip is longer than any poll, so no site would ever learn
// that polling pays again.
//
// `longFactor` sets "long" to over longFactor times the budget instead: 1
// for a site whose budget outlasts any round trip (a pool thread after a
// long task, ThreadPool::work), where a poll that ran out was wasted.
class AdaptiveSpin {
 public:
  explicit AdaptiveSpin(int longFactor = 2) : longFactor_(longFactor) {}

  template <typename Ready>
  bool until(Ready&& ready, std::chrono::microseconds budget = spinBudget()) {
    longAfter_ = std::chrono::steady_clock::now() +
                 std::max<std::chrono::steady_clock::duration>(kLongWait, longFactor_ * budget);
    return longWaits_ >= kGiveUp ? ready() : spinUntil(ready, budget);
  }

  // The wait that until() began is over (the site slept, or did not).
  void done() {
    const bool isLong = std::chrono::steady_clock::now() > longAfter_;
    longWaits_ = isLong ? std::min(longWaits_ + 1, kGiveUp) : 0;
  }

 private:
  static constexpr int kGiveUp = 3;
  static constexpr std::chrono::milliseconds kLongWait{1};
  const int longFactor_;
  int longWaits_ = 0;
  std::chrono::steady_clock::time_point longAfter_;  // this wait is long past it
};

// Blocks until `future` (anything with completed() and wait(), such as
// c10::ivalue::Future) is done: polls first, through this thread's
// AdaptiveSpin, then sleeps in `block()`. For a thread that waits on its own
// result (rpc_sync, to_here): without the poll every such wait costs a wake-up.
template <typename Future, typename Block>
void spinThenWait(Future& future, Block&& block) {
  static thread_local AdaptiveSpin spin;  // this thread's waits (of this kind of block)
  if (!spin.until([&] { return future.completed(); })) block();
  spin.done();
}

// The same, sleeping in future.wait().
template <typename Future>
void spinThenWait(Future& future) {
  spinThenWait(future, [&] { future.wait(); });
}

}  // namespace torchrpc::common
