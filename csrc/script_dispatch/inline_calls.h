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
// - its runs so far were short (under kShortRun): kWarmRuns of them in a
//   row, doubled for every run of kLongRun or more so far. A run between
//   the two takes kWarmRuns off the count (counted up to kWarmRuns past
//   what is needed): one such run, the scheduler having taken the thread's
//   core for a while, leaves a proven function inline; two in a row do not.
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

// How a callee's runs to the end went. Any thread; lock-free.
class RunRecord {
 public:
  static constexpr std::chrono::microseconds kShortRun{30};
  // Longer than the scheduler keeps a runnable thread off its core, mostly.
  static constexpr std::chrono::milliseconds kLongRun{5};
  static constexpr int kWarmRuns = 3;
  static constexpr int kMaxLongRuns = 20;  // then it needs 3M short runs in a row

  // `shortRun`: what counts as short, if the times recorded hold more than the run (torch_backend).
  explicit RunRecord(std::chrono::microseconds shortRun = kShortRun) : shortRun_(shortRun) {}

  void record(std::chrono::steady_clock::duration took);
  // Its last runs were short, enough of them (above).
  bool provenShort() const {
    return shortRuns_.load(std::memory_order_relaxed) >= (kWarmRuns << longRuns_.load(std::memory_order_relaxed));
  }

 private:
  const std::chrono::microseconds shortRun_;
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
