#pragma once

// WaitPolicy: whether a thread about to poll (common/spin.h) may, or must
// sleep at once.
//
// Polling is free only while no other runnable thread wants the core it
// takes. sched_yield does not ensure that: the kernel shares the CPU between
// autogroups (one per session) and cgroups, and a yield gives way only to
// threads of the yielding thread's own group. A worker started in its own
// session (a terminal, a service, a container) then polls on a core that
// another session's thread waits for. So the policy measures, by three rules:
//
// 0. The job alone. Over windows of kWindow, the host's CPU time
//    (/proc/stat) less that of this process's scheduling group (this
//    process and the torchrpc processes in its session and cgroups:
//    common/host_pollers.h) is what other groups used. While that stays
//    under kOthersIdle, every runnable thread is one that a yield gives way
//    to, and polls are free whatever rules 1 and 2 would find: on 2 cores a
//    job in one session keeps 3 of its own threads runnable, and rule 1 alone
//    refused most of its polls (benchmarks/HISTORY.md). A process that is no
//    torchrpc process of the group counts as another group's, even in the
//    same session: rules 1 and 2 then decide.
// 1. A free core, now. A sample reads the host's runnable threads
//    (/proc/loadavg) and how many of them are torchrpc pollers
//    (common/host_pollers.h); the rest is work. While work fills every core,
//    besides the sampling thread, no thread of this process polls.
// 2. Polls that kept their core. Now and then a thread's poll is a probe: it
//    reads its thread's schedstat (/proc/thread-self/schedstat: time spent
//    runnable but not running, and how often it got a core back) before and
//    after. A probe that waited a scheduler slice at a time lost its core to
//    a thread that its yields did not let in (another session's, or work on
//    the same core); then no thread of this process polls for a hold-off,
//    doubled while probes keep finding that. Short waits are yields to threads
//    of its own group, which run at once: those polls cost nothing.
//
// A thread that computes in the group (a trainer's own forward pass) is the
// job's: a yield gives way to it. Other work that starts stops rule 0 within
// a window or two.
//
// Samples are taken by threads about to poll and by threads polling (a poll
// granted before work woke up stops at the next sample that sees the work),
// at most once per kCheckInterval per process, and probes once per
// kProbeInterval per thread: an idle process measures nothing, and a poll
// pays a few atomics. TORCHRPC_SPIN_POLICY=always polls after activity
// without measuring, as torchrpc did before.
//
// Thread-safe. The rules are static functions, so that tests can feed them
// made-up measurements; so can a WaitPolicy built with a fake sampler.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

#include "common/host_pollers.h"

namespace torchrpc::common {

// One sample of the host.
struct WaitSample {
  int runnable = -1;     // the host's runnable threads, the sampling thread included; -1: unknown
  int otherPollers = 0;  // how many of them are other torchrpc processes' pollers
  // Cores that other scheduling groups used over the last window; -1: unknown
  // (no window yet, or a stale one).
  double othersCores = -1;
};

class WaitPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  using Sampler = std::function<WaitSample()>;

  static constexpr std::chrono::milliseconds kCheckInterval{2};
  static constexpr std::chrono::milliseconds kProbeInterval{10};
  static constexpr std::chrono::milliseconds kHoldOff{20};
  static constexpr std::chrono::milliseconds kMaxHoldOff{640};
  // A wait this long at a time is a scheduler slice (0.75-3 ms) of another
  // thread, not a yield to one that blocks soon.
  static constexpr std::chrono::microseconds kSliceWait{250};
  // Rule 0's window, and what other groups may use in it for polls to be
  // free: /proc/stat counts in 10 ms ticks, so a window holds 20 of them on
  // 2 cores, and the system's own threads take a tick now and then.
  static constexpr std::chrono::milliseconds kWindow{100};
  static constexpr double kOthersIdle = 0.2;

  // `cores`: the CPUs that `runnable` is compared with. `measure`: false polls
  // whenever asked. `publish`: count this policy's pollers in HostPollers
  // (the process's own policy only).
  WaitPolicy(int cores, Sampler sampler, bool measure = true, bool publish = false);

  // This process's policy: the host's online CPUs, /proc/loadavg, HostPollers,
  // TORCHRPC_SPIN_POLICY.
  static WaitPolicy& process();

  // A thread would poll from `now`: true if it may; it then calls leave()
  // when the poll ends.
  bool enter(Clock::time_point now);
  // A thread that entered asks again during its poll: false if it must stop
  // now (the host changed since the poll began; it still calls leave()).
  bool keep(Clock::time_point now);
  void leave();
  // The probe of a poll that ended at `end`, during which its thread waited
  // `waited` in all for a core and got one back `arrivals` times.
  void probed(Clock::time_point end, Clock::duration waited, int64_t arrivals);

  // Rule 1: work (runnable threads that are not pollers, less the sampling
  // thread) leaves a core free. An unknown sample leaves polling on.
  static bool coreFree(const WaitSample& sample, int ourPollers, int cores);
  // Rule 2: a probe that waited kSliceWait or more at a time.
  static bool lostCore(Clock::duration waited, int64_t arrivals);
  // Rule 0: other groups used less than kOthersIdle of a core; an unknown
  // window is not alone.
  static bool jobAlone(const WaitSample& sample);

  bool measures() const { return measure_; }
  bool publishes() const { return publish_; }
  int pollers() const { return pollers_.load(); }
  // Polls refused so far, by either rule (diagnostics, tests).
  uint64_t withheld() const { return withheld_.load(); }
  int cores() const { return cores_; }
  // One sample now (tests, diagnostics).
  WaitSample sample() const { return sampler_(); }

 private:
  // Both rules' verdict at `now`, sampling if rule 1's is due; `ourPollers`
  // excludes the asking thread.
  bool allowed(Clock::time_point now, int ourPollers);

  const int cores_;
  const Sampler sampler_;
  const bool measure_;
  const bool publish_;
  std::atomic<int> pollers_{0};                  // this policy's polls in progress
  std::atomic<uint64_t> withheld_{0};            // polls refused
  std::atomic<bool> free_{true};                 // rule 1's last verdict
  std::atomic<bool> alone_{false};               // rule 0's last verdict
  std::atomic<Clock::rep> nextCheck_{0};         // when rule 1 samples again
  std::atomic<Clock::rep> holdUntil_{0};         // rule 2: no polls before
  std::atomic<Clock::rep> holdOff_{0};           // rule 2: the next hold-off's length
};

// spinUntil's permission for one poll, and its probe (rule 2), for the
// process's policy. The poll may run while the grant is true; the destructor
// ends it. One thread.
class PollGrant {
 public:
  explicit PollGrant(WaitPolicy::Clock::time_point now);
  ~PollGrant();
  explicit operator bool() const { return granted_; }
  // The poll may go on at `now` (WaitPolicy::keep); only while granted.
  bool keep(WaitPolicy::Clock::time_point now);

  PollGrant(const PollGrant&) = delete;
  PollGrant& operator=(const PollGrant&) = delete;

 private:
  WaitPolicy& policy_;
  bool granted_ = false;
  HostPollers::Slot* slot_ = nullptr;
  bool probing_ = false;
  int64_t waited0_ = 0, arrivals0_ = 0;  // this thread's schedstat at the start
};

}  // namespace torchrpc::common
