#include "agent/core_spread.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace torchrpc::agent {

namespace {

int configuredCores() {
  long n = sysconf(_SC_NPROCESSORS_CONF);
  return static_cast<int>(std::clamp<long>(n, 1, CPU_SETSIZE));
}

// The counter this thread is counted in (its core's), if any.
thread_local std::atomic<int>* counted = nullptr;

}  // namespace

CoreSpread::CoreSpread() : cores_(configuredCores()), present_(new std::atomic<int>[cores_]) {
  for (int i = 0; i < cores_; ++i) present_[i].store(0);
}

bool CoreSpread::settle() {
  int core = sched_getcpu();
  if (core < 0 || core >= cores_) return true;
  if (counted != &present_[core]) {
    leave();
    counted = &present_[core];
    counted->fetch_add(1, std::memory_order_relaxed);
  }
  if (counted->load(std::memory_order_relaxed) == 1) return true;
  return moveOff(core);
}

void CoreSpread::leave() {
  if (counted == nullptr) return;
  counted->fetch_sub(1, std::memory_order_relaxed);
  counted = nullptr;
}

bool CoreSpread::moveOff(int core) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  for (int c = 0; c < cores_; ++c) {
    if (c == core || !CPU_ISSET(c, &allowed)) continue;
    int none = 0;
    if (!present_[c].compare_exchange_strong(none, 1)) continue;  // claimed before the move
    cpu_set_t only;
    CPU_ZERO(&only);
    CPU_SET(c, &only);
    if (sched_setaffinity(0, sizeof only, &only) != 0) {
      present_[c].fetch_sub(1);
      return false;
    }
    sched_setaffinity(0, sizeof allowed, &allowed);  // the kernel may move it again later
    leave();
    counted = &present_[c];  // counted there by the exchange above
    return true;
  }
  return false;
}

}  // namespace torchrpc::agent
