#include "message/receive_buffers.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>
#include <sys/mman.h>

#include <cstdlib>
#include <list>
#include <mutex>
#include <new>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

namespace torchrpc::message::receive_buffers {

namespace {

constexpr uint64_t kHugePage = 2u << 20;

struct Block {
  void* data;
  uint64_t bytes;  // a multiple of kHugePage
};

// A 2 MB-aligned block of `bytes`, not yet faulted in (populate() does that
// as the bytes arrive).
void* mapBlock(uint64_t bytes) {
  const uint64_t span = bytes + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  auto begin = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (begin + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > begin) ::munmap(raw, aligned - begin);
  uintptr_t tail = aligned + bytes;
  if (begin + span > tail) ::munmap(reinterpret_cast<void*>(tail), begin + span - tail);
  auto* data = reinterpret_cast<char*>(aligned);
  ::madvise(data, bytes, MADV_HUGEPAGE);
  return data;
}

class Cache {
 public:
  static Cache& instance() {
    static Cache* cache = new Cache();  // never destroyed: tensors may outlive statics
    return *cache;
  }

  // The smallest free block of at least `bytes` and at most a quarter more,
  // else a new one.
  Block take(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && it->bytes <= bytes + bytes / 4 &&
            (best == free_.end() || it->bytes < best->bytes)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        Block b = *best;
        free_.erase(best);
        cached_ -= b.bytes;
        return b;
      }
    }
    return Block{mapBlock(bytes), bytes};
  }

  // Keeps `b`, returning the longest-unused blocks to the system to make room.
  void give(Block b) {
    std::vector<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (b.bytes > capacity_) {
        evicted.push_back(b);
      } else {
        while (cached_ + b.bytes > capacity_) {
          evicted.push_back(free_.front());
          cached_ -= free_.front().bytes;
          free_.pop_front();
        }
        free_.push_back(b);
        cached_ += b.bytes;
      }
    }
    for (const Block& e : evicted) ::munmap(e.data, e.bytes);
  }

  uint64_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

 private:
  Cache() {
    const char* v = std::getenv("TORCHRPC_RECEIVE_CACHE_MB");
    capacity_ = (v != nullptr ? std::strtoull(v, nullptr, 10) : 256ull) << 20;
  }

  std::mutex mutex_;
  std::list<Block> free_;  // longest unused first
  uint64_t cached_ = 0;
  uint64_t capacity_;
};

void returnBlock(void* context) {
  auto* block = static_cast<Block*>(context);
  Cache::instance().give(*block);
  delete block;
}

}  // namespace

at::Tensor empty(const std::vector<int64_t>& sizes, c10::ScalarType dtype, uint64_t nbytes) {
  const uint64_t rounded = (nbytes + kHugePage - 1) & ~(kHugePage - 1);
  auto* block = new Block(Cache::instance().take(rounded));
  c10::DataPtr ptr(block->data, block, &returnBlock, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), c10::GetCPUAllocator(),
                       /*resizable=*/true);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  t.set_(std::move(storage), 0, sizes);
  return t;
}

void populate(char* begin, uint64_t bytes) {
  // madvise wants a page-aligned start; pages already present cost a table walk.
  auto start = reinterpret_cast<uintptr_t>(begin) & ~uintptr_t{4095};
  uint64_t span = reinterpret_cast<uintptr_t>(begin) + bytes - start;
  if (::madvise(reinterpret_cast<void*>(start), span, MADV_POPULATE_WRITE) != 0) {
    for (char* page = begin; page < begin + bytes; page += 4096) *static_cast<volatile char*>(page) = *page;
  }
}

uint64_t cachedBytes() { return Cache::instance().cached(); }

}  // namespace torchrpc::message::receive_buffers
