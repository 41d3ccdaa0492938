#pragma once

// Names the threads torchrpc creates, so `top -H`, `perf sched` and gdb show
// their role ("rpc-io", "rpc-pool", "rpc-pool-watch", "rpc-callbacks",
// "rpc-completions", "rpc-release", "rpc-timeouts", "rpc-drop") instead of
// "python".

#include <pthread.h>

namespace torchrpc::common {

// `name` must be at most 15 characters (the kernel's limit).
inline void nameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace torchrpc::common
