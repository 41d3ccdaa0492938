#pragma once

// What the threads torchrpc creates tell the OS about themselves.
//
// Names: `top -H`, `perf sched` and gdb show each thread's role ("rpc-io",
// "rpc-pool", "rpc-callbacks", "rpc-timeouts") instead of "python".
//
// Short time slices for the I/O thread: it runs for microseconds at a time,
// and a frame it has not read holds up a whole call. Linux's fair scheduler
// (EEVDF, 6.6 and later) lets a woken thread preempt a running one only once
// the runner's slice (0.75-3 ms) is used up, unless the woken thread asked for
// a shorter slice (6.12 and later). When a callee's pool threads compute on
// every core, the I/O thread waited about 1 ms, on average, for each incoming
// request; with a 100 us slice it runs at once, and a CPU-bound callee with 2
// callers on 2 cores went from ~1.35x to ~1.6x the rate of 1 caller. Older
// kernels ignore the request, and a refusal (a seccomp filter) changes
// nothing else.

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace torchrpc {

// `name` must be at most 15 characters (the kernel's limit).
inline void nameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

// Asks for the shortest time slice the kernel grants (100 us), keeping the
// thread's policy (SCHED_OTHER) and nice value.
inline void askShortTimeSlices() {
  struct SchedAttr {  // struct sched_attr, first version (48 bytes)
    uint32_t size;
    uint32_t policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime;  // for SCHED_OTHER: the requested slice, in ns
    uint64_t deadline;
    uint64_t period;
  } attr{};
  attr.size = sizeof(attr);
  attr.policy = 0;  // SCHED_OTHER
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, 0);  // this thread's (Linux: per thread)
  if (errno != 0) return;
  attr.nice = nice;
  attr.runtime = 100 * 1000;
  (void)syscall(SYS_sched_setattr, 0, &attr, 0);
}

}  // namespace torchrpc
