#include "common/malloc_arenas.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace torchrpc::common {

void reserveMallocArenas(size_t threads) {
#if defined(__GLIBC__) && defined(M_ARENA_MAX)
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return;  // the user's choice
  static std::mutex mutex;
  static size_t reserved = 0;  // over every pool this process started
  std::lock_guard<std::mutex> lock(mutex);
  reserved += threads;
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  mallopt(M_ARENA_MAX, static_cast<int>(8 * cores + reserved));  // glibc's default + ours
#else
  (void)threads;
#endif
}

}  // namespace torchrpc::common
