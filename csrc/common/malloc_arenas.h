#pragma once

// glibc malloc arenas for threads that run tasks.
//
// glibc gives each new thread that allocates its own arena (heap and lock)
// only up to a limit, 8 per core by default: 16 on a 2-core machine. A worker
// has more threads than that (the pool, the I/O thread, the callback runner,
// the main thread and torch's own), so some share an arena, and which ones is
// decided by the order of their first allocation. A tensor op allocates and
// frees its outputs, so two pool threads that share an arena and compute at
// once take turns on its lock: a CPU-bound callee with 2 callers on 2 cores
// then spent 13% of its CPU in futex waits and wakes under malloc and free
// (perf), and served 690 calls/s instead of about 980.
//
// reserveMallocArenas(n), called before n threads start, raises the limit by n
// (M_ARENA_MAX), so that each of them gets an arena of its own. glibc fixes the
// limit once a process has 9 arenas; a worker's pool starts well before that
// (a process that has imported torch has 2 threads). MALLOC_ARENA_MAX, when
// set, is left as it is. No effect with other C libraries.

#include <cstddef>

namespace torchrpc::common {

void reserveMallocArenas(size_t threads);

}  // namespace torchrpc::common
