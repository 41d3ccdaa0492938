#include "common/spin.h"

#include <atomic>
#include <cstdlib>

namespace torchrpc::common {

namespace {

std::chrono::microseconds fromEnv(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return std::chrono::microseconds(v != nullptr ? std::atol(v) : fallback);
}

using Clock = std::chrono::steady_clock;

// Contexts open now, and when the last one closed: a training loop opens the
// next context right after, so the training budget outlives the last context
// by kTrainingLinger (the callee sees no context between its cleanup message
// and the next iteration's first call).
constexpr auto kTrainingLinger = std::chrono::milliseconds(50);
std::atomic<bool> trainingSpin{false};
std::atomic<Clock::rep> trainingEnded{0};

const std::chrono::microseconds& baseBudget() {
  static const std::chrono::microseconds base = fromEnv("TORCHRPC_SPIN_US", 300);
  return base;
}

}  // namespace

bool spinEnabled() { return baseBudget().count() > 0; }

std::chrono::microseconds spinBudget() {
  static const std::chrono::microseconds training = fromEnv("TORCHRPC_SPIN_AUTOGRAD_US", 2000);
  const auto base = baseBudget();
  if (base.count() <= 0) return base;
  if (trainingSpin.load(std::memory_order_relaxed)) return training;
  const auto ended = trainingEnded.load(std::memory_order_relaxed);
  if (ended != 0 && Clock::now().time_since_epoch().count() - ended < Clock::duration(kTrainingLinger).count()) {
    return training;
  }
  return base;
}

void setTrainingSpin(bool on) {
  if (!on && trainingSpin.load(std::memory_order_relaxed)) {
    trainingEnded.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  trainingSpin.store(on, std::memory_order_relaxed);
}

}  // namespace torchrpc::common
