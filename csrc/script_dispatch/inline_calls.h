#pragma once

// Calls that the thread which read them runs itself (the I/O thread, or a
// pool thread that was reading the transport), instead of handing them to
// the pool.
//
// A hand-off to a pool thread wakes that thread. With workers in separate
// sessions the kernel makes each wake-up wait for the other session's
// threads: 128 tiny TorchScript calls in flight ran at 37k/s handed over
// and 66k/s run where they were read (benchmarks/HISTORY.md). Such a call
// runs where it was read only when it is short for sure:
// - a SCRIPT_CALL, not async_execution, whose payload is plain
//   (message/plain_codec.h: no RRef, no pickle), of a function this worker
//   registered (not shipped code, not one still to be imported), or a plain
//   BUILTIN_CALL of an operator this worker ran before;
// - the callee's time is bounded by the size of its tensor arguments
//   (Callee::bounded(), bounded.h: it never suspends, has no loop, and takes
//   no number that could size what it makes);
// - its tensors hold at most kMaxInputBytes;
// - its runs so far were short (under kShortRun, of CPU time: RunTimer):
//   kWarmRuns of them in a row, doubled for every run of kLongRun or more
//   so far. A run between the two takes kWarmRuns off the count (counted up
//   to kWarmRuns past what is needed): one such run leaves a proven
//   function inline; two in a row do not.
// So a function whose calls turn out long goes back to the pool, and one
// whose calls are long now and then holds the reading thread up a few
// times at most. TORCHRPC_INLINE_CALLS=0 turns it off.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torchrpc::message {
struct Message;
}

namespace torchrpc::script_dispatch {

class Registry;

// Times one run on the thread that makes it. A run that the wall clock
// says was not short is timed again by its thread's CPU time: a thread
// that the scheduler took off its core mid-run (for another session's
// threads, say) did not run long, and its callee should not lose its proof
// for it. The CPU clock costs a system call at each end (0.8 µs here, 3-7%
// of a tiny call), so a run reads it only within kCpuClockArmed of a run
// that the wall clock found not short; such a run, untimed by CPU, counts
// as between short and long (RunRecord::record) and arms the clock.
class RunTimer {
 public:
  static constexpr std::chrono::seconds kCpuClockArmed{1};

  RunTimer();
  std::chrono::nanoseconds wall() const;
  // Whether cpu() can be read: the CPU clock was read at the start.
  bool timedByCpu() const { return timedByCpu_; }
  std::chrono::nanoseconds cpu() const;
  // Runs from now on read the CPU clock, for kCpuClockArmed.
  static void armCpuClock();

 private:
  const std::chrono::steady_clock::time_point wallStart_;
  const bool timedByCpu_;
  const std::chrono::nanoseconds cpuStart_;
};

// How a callee's runs to the end went. Any thread; lock-free.
class RunRecord {
 public:
  // A tiny TorchScript function's runs on a slow machine's I/O thread come
  // near 30 µs (benchmarks/HISTORY.md): the bound leaves such a function room.
  static constexpr std::chrono::microseconds kShortRun{100};
  // Longer than the scheduler keeps a runnable thread off its core, mostly.
  static constexpr std::chrono::milliseconds kLongRun{5};
  static constexpr int kWarmRuns = 3;
  static constexpr int kMaxLongRuns = 20;  // then it needs 3M short runs in a row

  void record(const RunTimer& run);
  // Its last runs were short, enough of them (above).
  bool provenShort() const {
    return shortRuns_.load(std::memory_order_relaxed) >= (kWarmRuns << longRuns_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<int> shortRuns_{0};  // the count above
  std::atomic<int> longRuns_{0};   // so far, up to kMaxLongRuns
};

constexpr size_t kMaxInputBytes = 64 * 1024;

// Whether the thread that read `request` runs it itself (above). Decodes
// the payload but changes nothing; never throws.
bool runsInline(const message::Message& request, Registry& registry);

// The parts of the rule that other agents share (torch_backend/inline_script_calls.h):
// not turned off, and at most kMaxInputBytes of strided tensors.
bool inlineCallsEnabled();
bool smallInputs(const std::vector<at::Tensor>& tensors);
// Calls run where they were read, in this process so far (tests), and one more.
uint64_t inlineCalls();
void countInlineCall();

}  // namespace torchrpc::script_dispatch
