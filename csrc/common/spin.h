#pragma once

// Bounded spinning before a blocking wait.
//
// Waking a sleeping thread costs ~20 us on small VMs, several times the cost
// of the work of a tiny RPC, and a call crosses four such waits (callee I/O
// thread, callee pool thread, caller I/O thread, caller). Each of these waits
// first polls its condition for a short budget (yielding the CPU on every
// round, so runnable work is never starved), and only then sleeps. The budget
// only applies right after activity: an idle worker sleeps and uses no CPU.
//
// TORCHRPC_SPIN_US sets the budget in microseconds (default 100; 0 disables).
// Wait sites that come back often use AdaptiveSpin (below): a site whose
// polls keep running out stops polling.
//
// Training budget. While this process takes part in a distributed autograd
// context, the budget is TORCHRPC_SPIN_AUTOGRAD_US (default 2000). A training
// iteration is a chain of dependent calls with gaps of a few hundred us of
// compute in between (the split RNN: a proxy call, the LSTM, a proxy call,
// three backward hops, the optimizer step). With the short budget every
// thread on the other side is asleep when the next message comes, and a
// worker whose CPU went idle also runs its code 2-3x slower at first (cold
// caches on the VM's idle vCPU): a proxy call cost 275-330 us in the loop
// against 83-130 us back to back. Still bounded: a worker with an open
// context but no traffic sleeps after 2 ms.

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace torchrpc {

// The current budget: TORCHRPC_SPIN_US, or the training budget while
// setTrainingSpin(true) holds; zero when TORCHRPC_SPIN_US=0.
std::chrono::microseconds spinBudget();

// False when TORCHRPC_SPIN_US=0: no wait polls at all.
bool spinEnabled();

// Set by the distributed autograd contexts (csrc/autograd/context.cpp): on
// while this process holds at least one.
void setTrainingSpin(bool on);

// Polls `ready` until it returns true or the budget runs out; returns its last
// value. `budget` defaults to spinBudget(); TORCHRPC_SPIN_US=0 disables every spin.
template <typename Ready>
bool spinUntil(Ready&& ready, std::chrono::microseconds budget = spinBudget()) {
  if (budget.count() <= 0 || !spinEnabled()) return ready();
  auto end = std::chrono::steady_clock::now() + budget;
  while (true) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    sched_yield();
  }
}

// One thread's wait site that learns whether polling pays. After kGiveUp
// polls in a row ran out of budget, its waits are long (a CPU-bound callee,
// a peer that calls rarely), so it sleeps at once, and it polls again on
// every kProbe-th wait to notice when waits get short again. Polling through
// a long wait only takes a core from threads that compute. A CPU-bound
// script callee with 2 callers on 2 cores (each of whose calling and I/O
// threads polled ~100 us per call of ~1.7 ms), interleaved A/B: 929-949 ->
// 970-1000 calls/s; back-to-back calls and the training loop poll as before.
class AdaptiveSpin {
 public:
  template <typename Ready>
  bool until(Ready&& ready, std::chrono::microseconds budget = spinBudget()) {
    if (misses_ >= kGiveUp && ++skipped_ % kProbe != 0) return ready();
    const bool hit = spinUntil(ready, budget);
    misses_ = hit ? 0 : std::min(misses_ + 1, kGiveUp);
    return hit;
  }

 private:
  static constexpr int kGiveUp = 3;
  static constexpr unsigned kProbe = 16;
  int misses_ = 0;
  unsigned skipped_ = 0;
};

}  // namespace torchrpc
