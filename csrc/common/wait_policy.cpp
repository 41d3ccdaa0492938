#include "common/wait_policy.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/proc_files.h"

namespace torchrpc::common {

namespace {

using Clock = WaitPolicy::Clock;

// Reads a small /proc file into buf; false on error or an empty read.
bool readAt(int fd, char* buf, size_t size) { return proc::readAt(fd, buf, size) > 0; }

// The host's CPU time in ticks: user, nice and system of /proc/stat's first
// line (interrupts and steal belong to no group); -1 on error.
int64_t hostTicks() {
  static const int fd = ::open("/proc/stat", O_RDONLY | O_CLOEXEC);
  char buf[256];
  if (!readAt(fd, buf, sizeof buf) || std::strncmp(buf, "cpu ", 4) != 0) return -1;
  char* p = buf + 4;
  int64_t sum = 0;
  for (int field = 0; field < 3; ++field) sum += std::strtoll(p, &p, 10);
  return sum;
}

// Rule 0's measurement: the cores that other groups used over the last
// window. Advanced by samples; one sampler at a time.
class OthersCpu {
 public:
  double cores(Clock::time_point now) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock) return last_.load(std::memory_order_relaxed);  // another thread is advancing it
    if (now - start_ < WaitPolicy::kWindow && host_ >= 0) return last_.load(std::memory_order_relaxed);
    const int64_t host = hostTicks();
    std::map<int32_t, int64_t> group;
    for (const proc::ProcessStat& process : HostPollers::instance().group()) group[process.pid] = process.ticks;
    // A window after a pause (an idle worker takes no samples) says nothing about now.
    const bool fresh = host_ >= 0 && host >= host_ && now - start_ < 3 * WaitPolicy::kWindow;
    double cores = -1;
    if (fresh) {
      int64_t ours = 0;
      for (const auto& [pid, ticks] : group) {
        auto before = group_.find(pid);
        if (ticks >= 0 && before != group_.end() && before->second >= 0) ours += ticks - before->second;
      }
      static const double tick = 1.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
      const double seconds = std::chrono::duration<double>(now - start_).count();
      cores = std::max<double>(0, static_cast<double>(host - host_ - ours)) * tick / seconds;
    }
    start_ = now;
    host_ = host;
    group_.swap(group);
    last_.store(cores, std::memory_order_relaxed);
    return cores;
  }

 private:
  std::mutex mutex_;
  Clock::time_point start_;
  int64_t host_ = -1;
  std::map<int32_t, int64_t> group_;  // each group process's ticks at start_
  std::atomic<double> last_{-1};      // also read by samplers that find the mutex taken
};

// The host's runnable threads: the 4th field of /proc/loadavg, "R/T".
WaitSample sampleHost() {
  static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  static OthersCpu* others = new OthersCpu();  // never destroyed: pool threads left at exit may sample
  WaitSample s;
  s.othersCores = others->cores(Clock::now());
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

bool WaitPolicy::jobAlone(const WaitSample& sample) {
  return sample.othersCores >= 0 && sample.othersCores < kOthersIdle;
}

bool WaitPolicy::allowed(Clock::time_point now, int ourPollers) {
  const Clock::rep t = now.time_since_epoch().count();
  Clock::rep next = nextCheck_.load(std::memory_order_relaxed);
  if (t >= next && nextCheck_.compare_exchange_strong(next, t + Clock::duration(kCheckInterval).count())) {
    const WaitSample sample = sampler_();
    alone_.store(jobAlone(sample), std::memory_order_relaxed);
    free_.store(coreFree(sample, ourPollers, cores_), std::memory_order_relaxed);
  }
  if (alone_.load(std::memory_order_relaxed)) return true;
  if (t < holdUntil_.load(std::memory_order_relaxed)) return false;
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
  // Alone, the core went to a thread of the job's own, which a yield let in.
  if (!lostCore(waited, arrivals) || alone_.load(std::memory_order_relaxed)) {
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
