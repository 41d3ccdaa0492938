#pragma once

// Reading the small /proc files that the wait policy samples
// (common/wait_policy.h, common/host_pollers.h): plain syscalls into
// buffers on the stack, no exception.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchrpc::common::proc {

// Reads an open /proc file from offset 0 into buf, NUL-terminated: the byte
// count (0 for an empty file), or -1 on error.
ssize_t readAt(int fd, char* buf, size_t size);

// Reads a whole small file (at most 4 KiB) into `out`; false if it cannot be
// opened or read. An empty file is empty text, not an error.
bool readFile(const char* path, std::string& out);

// What the wait policy reads of a process's /proc/<pid>/stat.
struct ProcessStat {
  int32_t pid = 0;
  int64_t ticks = -1;     // CPU time, utime + stime (fields 14 and 15), in clock ticks
  uint64_t started = 0;   // start time after boot (field 22), in clock ticks: with the pid, the process's identity
};

// /proc/<pid>/stat of `pid`; false if it is gone or unreadable.
bool processStat(int32_t pid, ProcessStat& out);

}  // namespace torchrpc::common::proc
