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

#include <sched.h>

#include <chrono>
#include <cstdlib>

namespace torchrpc {

inline std::chrono::microseconds spinBudget() {
  static const std::chrono::microseconds budget = [] {
    const char* v = std::getenv("TORCHRPC_SPIN_US");
    return std::chrono::microseconds(v != nullptr ? std::atol(v) : 100);
  }();
  return budget;
}

// Polls `ready` until it returns true or the budget runs out; returns its last
// value. `budget` defaults to spinBudget(); TORCHRPC_SPIN_US=0 disables every spin.
template <typename Ready>
bool spinUntil(Ready&& ready, std::chrono::microseconds budget = spinBudget()) {
  if (budget.count() <= 0 || spinBudget().count() <= 0) return ready();
  auto end = std::chrono::steady_clock::now() + budget;
  while (true) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    sched_yield();
  }
}

}  // namespace torchrpc
