#include "transport/same_host.h"

#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/error.h"

namespace torchrpc::transport::same_host {

namespace {

#pragma pack(push, 1)
struct Offer {
  int64_t pid;
  uint64_t address;  // of the secret, in the sender's memory
  std::array<uint64_t, 2> secret;
};
#pragma pack(pop)

// The proof a peer reads from this process's memory: random, made once.
const std::array<uint64_t, 2>& secret() {
  static const std::array<uint64_t, 2> value = [] {
    std::random_device rd;
    std::array<uint64_t, 2> v{};
    for (auto& x : v) x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return v;
  }();
  return value;
}

std::atomic<uint64_t> copied{0};

common::Error readMemory(int pid, uint64_t address, void* dst, uint64_t nbytes) {
  uint64_t done = 0;
  while (done < nbytes) {
    iovec local{static_cast<char*>(dst) + done, nbytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), nbytes - done};
    ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      int err = errno;
      if (err == EINTR) continue;
      return common::Error(common::Error::Code::kIo, common::errnoMessage(("process_vm_readv from pid " + std::to_string(pid)).c_str(), err));
    }
    if (n == 0) return common::Error(common::Error::Code::kIo, "process_vm_readv from pid " + std::to_string(pid) + " copied nothing");
    done += static_cast<uint64_t>(n);
  }
  return common::Error();
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("TORCHRPC_SAME_HOST_COPY");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

std::string offer() {
  Offer o{static_cast<int64_t>(::getpid()), reinterpret_cast<uint64_t>(secret().data()), secret()};
  return std::string(reinterpret_cast<const char*>(&o), sizeof(o));
}

common::Fallible<int> verify(const std::string& payload) {
  auto refused = [](std::string why) { return common::Fallible<int>{-1, common::Error(common::Error::Code::kInvalid, std::move(why))}; };
  if (payload.size() != sizeof(Offer)) return refused("malformed offer (" + std::to_string(payload.size()) + " bytes)");
  Offer o;
  std::memcpy(&o, payload.data(), sizeof(o));
  if (o.pid <= 0 || o.pid > INT32_MAX) return refused("offer names pid " + std::to_string(o.pid));
  std::array<uint64_t, 2> seen{};
  if (common::Error err = readMemory(static_cast<int>(o.pid), o.address, seen.data(), sizeof(seen))) return {-1, err};
  if (seen != o.secret) {
    return refused("pid " + std::to_string(o.pid) + " is another process here (a different pid namespace)");
  }
  return {static_cast<int>(o.pid), common::Error()};
}

common::Error copy(int pid, uint64_t address, void* dst, uint64_t nbytes) {
  common::Error err = readMemory(pid, address, dst, nbytes);
  if (!err) copied.fetch_add(nbytes, std::memory_order_relaxed);
  return err;
}

uint64_t copiedBytes() { return copied.load(std::memory_order_relaxed); }

}  // namespace torchrpc::transport::same_host
