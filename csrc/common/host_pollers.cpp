#include "common/host_pollers.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace torchrpc::common {

namespace {

constexpr int kSlots = 64;
constexpr int kMaxPerProcess = 256;  // a count above it is not believed

// This process's slot, and whether it was claimed (0: not yet, 1: yes, 2: no
// table or no free slot). Reset in a child after fork().
std::atomic<int> claimState{0};

}  // namespace

struct HostPollers::Slot {
  std::atomic<int32_t> pid;
  std::atomic<int32_t> pollers;
  std::atomic<uint64_t> group;    // the pid's groupKeyOf(); 0: unknown
  std::atomic<uint64_t> started;  // the process's start time (proc::ProcessStat)
  char pad[40];
};
static_assert(std::atomic<int32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
                  sizeof(HostPollers::Slot) == 64,
              "the table is shared between processes: its fields must be plain lock-free words");

struct HostPollers::Table {
  Slot slots[kSlots];
};

namespace {

std::atomic<HostPollers::Slot*>* mySlot() {
  static std::atomic<HostPollers::Slot*> slot{nullptr};
  return &slot;
}

std::atomic<uint64_t> myGroup{0};  // this process's groupKeyOf(), set when it claims its slot

void forgetSlotInChild() {
  mySlot()->store(nullptr);
  claimState.store(0);
}

// Maps this user's table, or returns nullptr: no /dev/shm, or a file that is
// not a private regular file of this user (another user may have created
// the name first).
void* mapTable(size_t bytes) {
  const std::string path = "/dev/shm/torchrpc-pollers-v3-" + std::to_string(geteuid());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return nullptr;
  struct stat st;
  void* mem = nullptr;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
      (static_cast<size_t>(st.st_size) >= bytes || ::ftruncate(fd, static_cast<off_t>(bytes)) == 0)) {
    mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) mem = nullptr;
  }
  ::close(fd);
  return mem;
}

bool alive(int32_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Whether the process that claimed `slot` (its pid, read as `pid`) still
// runs: false if it is gone, or its pid now names a later process.
bool claimantRuns(const HostPollers::Slot& slot, int32_t pid, proc::ProcessStat* stat = nullptr) {
  proc::ProcessStat now;
  if (!proc::processStat(pid, now)) return alive(pid);  // no /proc: the pid alone
  if (now.started != slot.started.load(std::memory_order_relaxed)) return false;
  if (stat != nullptr) *stat = now;
  return true;
}

}  // namespace

uint64_t HostPollers::groupKeyOf(const char* cgroupPath, const char* autogroupPath) {
  std::string cgroup, autogroup;
  if (!proc::readFile(cgroupPath, cgroup) || !proc::readFile(autogroupPath, autogroup)) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::string_view text : {std::string_view(cgroup), std::string_view("\0", 1), std::string_view(autogroup)})
    for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

HostPollers& HostPollers::instance() {
  // Never destroyed: pool threads left behind at exit may still poll.
  static HostPollers* pollers = new HostPollers();
  return *pollers;
}

HostPollers::HostPollers() {
  table_ = static_cast<Table*>(mapTable(sizeof(Table)));
  pthread_atfork(nullptr, nullptr, forgetSlotInChild);
  std::atexit([] {
    Slot* slot = mySlot()->exchange(nullptr);
    if (slot == nullptr) return;
    claimState.store(2);
    slot->pollers.store(0);
    int32_t me = ::getpid();
    slot->pid.compare_exchange_strong(me, 0);
  });
}

HostPollers::~HostPollers() = default;

HostPollers::Slot* HostPollers::claim() {
  int expected = 0;
  if (!claimState.compare_exchange_strong(expected, 2)) return mySlot()->load();
  myGroup.store(groupKeyOf("/proc/self/cgroup", "/proc/self/autogroup"));
  if (table_ == nullptr) return nullptr;
  const int32_t me = ::getpid();
  proc::ProcessStat self;  // its start time stays 0 if unreadable
  proc::processStat(me, self);
  for (Slot& slot : table_->slots) {
    // A negative pid is a claim in progress (readers skip it); a slot that
    // holds this process's pid is a dead process's: other processes'
    // group() frees it.
    int32_t pid = slot.pid.load();
    if (pid == me || (pid > 0 && claimantRuns(slot, pid)) || (pid < 0 && pid != INT32_MIN && alive(-pid))) continue;
    if (!slot.pid.compare_exchange_strong(pid, -me)) continue;
    slot.pollers.store(0);
    slot.group.store(myGroup.load());
    slot.started.store(self.started);
    slot.pid.store(me);  // published with its fields
    mySlot()->store(&slot);
    claimState.store(1);
    return &slot;
  }
  return nullptr;  // full: this process's pollers stay unpublished
}

HostPollers::Slot* HostPollers::begin() {
  Slot* slot = mySlot()->load(std::memory_order_relaxed);
  if (slot == nullptr && claimState.load(std::memory_order_relaxed) == 0) slot = claim();
  if (slot != nullptr) slot->pollers.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

void HostPollers::end(Slot* slot) {
  if (slot != nullptr) slot->pollers.fetch_sub(1, std::memory_order_relaxed);
}

int HostPollers::others() {
  if (table_ == nullptr) return 0;
  const int32_t me = ::getpid();
  int total = 0;
  for (Slot& slot : table_->slots) {
    const int32_t pid = slot.pid.load(std::memory_order_relaxed);
    if (pid <= 0 || pid == me) continue;
    const int n = std::min(slot.pollers.load(std::memory_order_relaxed), kMaxPerProcess);
    if (n > 0 && alive(pid)) total += n;
  }
  return total;
}

std::vector<proc::ProcessStat> HostPollers::group() {
  const int32_t me = ::getpid();
  std::vector<proc::ProcessStat> members(1);
  if (!proc::processStat(me, members[0])) members[0].pid = me;
  if (claimState.load(std::memory_order_relaxed) == 0) claim();  // learns this process's group
  const uint64_t group = myGroup.load(std::memory_order_relaxed);
  if (table_ == nullptr) return members;
  for (Slot& slot : table_->slots) {
    int32_t pid = slot.pid.load(std::memory_order_relaxed);
    if (pid <= 0 || pid == me) continue;
    const bool ours = group != 0 && slot.group.load(std::memory_order_relaxed) == group;
    if (!ours && slot.pollers.load(std::memory_order_relaxed) <= 0) continue;  // counts for nothing here
    proc::ProcessStat stat;
    if (!claimantRuns(slot, pid, &stat)) {
      // Gone without freeing its slot (killed), maybe with polls counted: free it.
      slot.pid.compare_exchange_strong(pid, 0);  // its next claimant resets the counts
      continue;
    }
    if (ours && stat.pid == pid) members.push_back(stat);
  }
  return members;
}

}  // namespace torchrpc::common
