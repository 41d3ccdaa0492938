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
  char pad[56];
};
static_assert(sizeof(std::atomic<int32_t>) == 4 && std::atomic<int32_t>::is_always_lock_free,
              "the table is shared between processes: its counters must be plain lock-free words");

struct HostPollers::Table {
  Slot slots[kSlots];
};

namespace {

std::atomic<HostPollers::Slot*>* mySlot() {
  static std::atomic<HostPollers::Slot*> slot{nullptr};
  return &slot;
}

void forgetSlotInChild() {
  mySlot()->store(nullptr);
  claimState.store(0);
}

// Maps this user's table, or returns nullptr: no /dev/shm, or a file that is
// not a private regular file of this user (another user may have created
// the name first).
void* mapTable(size_t bytes) {
  const std::string path = "/dev/shm/torchrpc-pollers-v1-" + std::to_string(geteuid());
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

}  // namespace

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
  if (table_ == nullptr) return nullptr;
  const int32_t me = ::getpid();
  for (Slot& slot : table_->slots) {
    int32_t pid = slot.pid.load();
    if (pid == me || (pid != 0 && alive(pid))) continue;
    if (!slot.pid.compare_exchange_strong(pid, me)) continue;
    slot.pollers.store(0);
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

}  // namespace torchrpc::common
