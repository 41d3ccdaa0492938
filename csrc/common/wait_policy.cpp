#include "common/wait_policy.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace torchrpc::common {

namespace {

using Clock = WaitPolicy::Clock;

// Reads a small /proc file from offset 0 into buf (NUL-terminated); false on error.
bool readAt(int fd, char* buf, size_t size) {
  if (fd < 0) return false;
  const ssize_t n = ::pread(fd, buf, size - 1, 0);
  if (n <= 0) return false;
  buf[n] = '\0';
  return true;
}

// The host's runnable threads: the 4th field of /proc/loadavg, "R/T".
WaitSample sampleHost() {
  static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  WaitSample s;
  char buf[128];
  if (!readAt(fd, buf, sizeof buf)) return s;
  const char* p = buf;
  for (int spaces = 0; spaces < 3 && p != nullptr; ++spaces) {
    p = std::strchr(p, ' ');
    if (p != nullptr) ++p;
  }
  if (p == nullptr) return s;
  char* end = nullptr;
  const long runnable = std::strtol(p, &end, 10);
  if (end == p || *end != '/' || runnable < 0) return s;
  s.runnable = static_cast<int>(std::min(runnable, 1L << 20));
  s.otherPollers = HostPollers::instance().others();
  return s;
}

// This thread's /proc/thread-self/schedstat ("on-cpu-ns waiting-ns
// timeslices"), opened at its first probe, and when it may probe next.
struct ThreadProbe {
  int fd = -1;            // -2: unavailable here
  Clock::rep next = 0;    // no probe before
  ~ThreadProbe() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  bool read(int64_t& waited, int64_t& arrivals) {
    if (fd == -1) fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      fd = -2;
      return false;
    }
    char buf[96];
    if (!readAt(fd, buf, sizeof buf)) return false;
    char* p = buf;
    (void)std::strtoll(p, &p, 10);  // time on a CPU
    waited = std::strtoll(p, &p, 10);
    arrivals = std::strtoll(p, &p, 10);
    return true;
  }
};

thread_local ThreadProbe probe;

// After fork(), the forking thread's file names the parent's thread.
void reopenProbeInChild() { probe.close(); }

}  // namespace

WaitPolicy::WaitPolicy(int cores, Sampler sampler, bool measure, bool publish)
    : cores_(std::max(1, cores)), sampler_(std::move(sampler)), measure_(measure), publish_(publish) {}

WaitPolicy& WaitPolicy::process() {
  static WaitPolicy* policy = [] {
    const char* mode = std::getenv("TORCHRPC_SPIN_POLICY");
    const bool measure = mode == nullptr || std::strcmp(mode, "always") != 0;
    pthread_atfork(nullptr, nullptr, reopenProbeInChild);
    // Never destroyed: pool threads left behind at exit may still poll.
    return new WaitPolicy(static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)), sampleHost, measure,
                          /*publish=*/true);
  }();
  return *policy;
}

bool WaitPolicy::coreFree(const WaitSample& sample, int ourPollers, int cores) {
  if (sample.runnable < 0) return true;
  const int work = sample.runnable - ourPollers - sample.otherPollers - 1;
  return work < cores;
}

bool WaitPolicy::lostCore(Clock::duration waited, int64_t arrivals) {
  const auto perArrival = waited / std::max<int64_t>(arrivals, 1);
  return waited >= kSliceWait && perArrival >= kSliceWait;
}

bool WaitPolicy::allowed(Clock::time_point now, int ourPollers) {
  const Clock::rep t = now.time_since_epoch().count();
  if (t < holdUntil_.load(std::memory_order_relaxed)) return false;
  Clock::rep next = nextCheck_.load(std::memory_order_relaxed);
  if (t >= next && nextCheck_.compare_exchange_strong(next, t + Clock::duration(kCheckInterval).count())) {
    free_.store(coreFree(sampler_(), ourPollers, cores_), std::memory_order_relaxed);
  }
  return free_.load(std::memory_order_relaxed);
}

bool WaitPolicy::enter(Clock::time_point now) {
  if (measure_ && !allowed(now, pollers_.load())) {
    withheld_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  pollers_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool WaitPolicy::keep(Clock::time_point now) {
  // The asking thread is one of pollers_, and coreFree counts it as the sampler.
  if (!measure_ || allowed(now, pollers_.load() - 1)) return true;
  withheld_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void WaitPolicy::leave() { pollers_.fetch_sub(1, std::memory_order_relaxed); }

void WaitPolicy::probed(Clock::time_point end, Clock::duration waited, int64_t arrivals) {
  const Clock::rep base = Clock::duration(kHoldOff).count();
  if (!lostCore(waited, arrivals)) {
    holdOff_.store(base, std::memory_order_relaxed);  // a clean probe ends the back-off
    return;
  }
  const Clock::rep hold = std::max(holdOff_.load(std::memory_order_relaxed), base);
  holdUntil_.store(end.time_since_epoch().count() + hold, std::memory_order_relaxed);
  holdOff_.store(std::min<Clock::rep>(2 * hold, Clock::duration(kMaxHoldOff).count()), std::memory_order_relaxed);
}

PollGrant::PollGrant(Clock::time_point now) : policy_(WaitPolicy::process()) {
  granted_ = policy_.enter(now);
  if (!granted_) return;
  if (policy_.publishes()) slot_ = HostPollers::instance().begin();
  if (policy_.measures() && now.time_since_epoch().count() >= probe.next && probe.fd != -2) {
    probe.next = (now + WaitPolicy::kProbeInterval).time_since_epoch().count();
    probing_ = probe.read(waited0_, arrivals0_);
  }
}

bool PollGrant::keep(Clock::time_point now) { return policy_.keep(now); }

PollGrant::~PollGrant() {
  if (!granted_) return;
  int64_t waited = 0, arrivals = 0;
  if (probing_ && probe.read(waited, arrivals)) {
    policy_.probed(Clock::now(), std::chrono::nanoseconds(waited - waited0_), arrivals - arrivals0_);
  }
  HostPollers::end(slot_);
  policy_.leave();
}

}  // namespace torchrpc::common
