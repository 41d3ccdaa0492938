#include "script_dispatch/inline_calls.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "message/payload.h"
#include "message/plain_codec.h"
#include "script_dispatch/registry.h"

namespace torchrpc::script_dispatch {

namespace {

std::atomic<uint64_t> inlineCount{0};

}  // namespace

bool inlineCallsEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("TORCHRPC_INLINE_CALLS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

bool smallInputs(const std::vector<at::Tensor>& tensors) {
  size_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (t.layout() != c10::kStrided) return false;  // sparse and the like: nbytes() says nothing of their work
    bytes += t.nbytes();
  }
  return bytes <= kMaxInputBytes;
}

void countInlineCall() { inlineCount.fetch_add(1, std::memory_order_relaxed); }

namespace {

std::chrono::nanoseconds threadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Until when runs read the CPU clock (steady_clock ticks); relaxed: a run
// that reads a stale value is timed one way or the other, both safe.
std::atomic<int64_t> cpuClockArmedUntil{0};

}  // namespace

RunTimer::RunTimer()
    : wallStart_(std::chrono::steady_clock::now()),
      timedByCpu_(wallStart_.time_since_epoch().count() < cpuClockArmedUntil.load(std::memory_order_relaxed)),
      cpuStart_(timedByCpu_ ? threadCpuTime() : std::chrono::nanoseconds(0)) {}

std::chrono::nanoseconds RunTimer::wall() const { return std::chrono::steady_clock::now() - wallStart_; }

std::chrono::nanoseconds RunTimer::cpu() const { return threadCpuTime() - cpuStart_; }

void RunTimer::armCpuClock() {
  const auto until = std::chrono::steady_clock::now() + kCpuClockArmed;
  cpuClockArmedUntil.store(until.time_since_epoch().count(), std::memory_order_relaxed);
}

void RunRecord::record(const RunTimer& run) {
  std::chrono::nanoseconds took = run.wall();
  if (took >= kShortRun) {
    if (run.timedByCpu()) {
      took = std::min(took, run.cpu());
    } else {  // maybe time off the core: between, and the next runs tell
      RunTimer::armCpuClock();
      took = kShortRun;
    }
  }
  // Relaxed, racy counts: concurrent runs may lose an update, never a long run's reset.
  if (took >= kLongRun) {
    shortRuns_.store(0, std::memory_order_relaxed);
    if (longRuns_.load(std::memory_order_relaxed) < kMaxLongRuns) longRuns_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const int short_ = shortRuns_.load(std::memory_order_relaxed);
  if (took >= kShortRun) {  // it loses kWarmRuns: twice in a row ends a proven streak
    shortRuns_.store(std::max(0, short_ - kWarmRuns), std::memory_order_relaxed);
    return;
  }
  const int most = (kWarmRuns << longRuns_.load(std::memory_order_relaxed)) + kWarmRuns;
  if (short_ < most) shortRuns_.store(short_ + 1, std::memory_order_relaxed);
}

bool runsInline(const message::Message& request, Registry& registry) {
  const bool builtin = request.type == message::MessageType::kBuiltinCall;
  if ((!builtin && request.type != message::MessageType::kScriptCall) || !inlineCallsEnabled() ||
      !message::isPlain(request.payload)) {
    return false;
  }
  try {
    if (!smallInputs(request.tensors)) return false;
    // A plain payload holds no RRef: decoding it registers nothing.
    const auto call = message::messageIValue(request).toTuple();
    const auto& el = call->elements();
    std::shared_ptr<Callee> callee;
    if (builtin) {
      callee = registry.findOperator(el.at(0).toStringRef(), /*resolve=*/false);
    } else if (el.size() >= 5 && el[4].isNone() && !(el.size() > 5 && el[5].toBool())) {
      callee = registry.find(el[0].toStringRef(), el[1].toStringRef(), /*resolve=*/false);
    }
    if (!callee || !callee->bounded() || !callee->runs.provenShort()) return false;
  } catch (...) {
    return false;  // the pool's run answers what is wrong with it
  }
  countInlineCall();
  return true;
}

uint64_t inlineCalls() { return inlineCount.load(std::memory_order_relaxed); }

}  // namespace torchrpc::script_dispatch
