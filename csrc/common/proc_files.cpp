#include "common/proc_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace torchrpc::common::proc {

ssize_t readAt(int fd, char* buf, size_t size) {
  if (fd < 0 || size == 0) return -1;
  const ssize_t n = ::pread(fd, buf, size - 1, 0);
  if (n < 0) return -1;
  buf[n] = '\0';
  return n;
}

bool readFile(const char* path, std::string& out) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  const ssize_t n = readAt(fd, buf, sizeof buf);
  ::close(fd);
  if (n < 0) return false;
  out.assign(buf, static_cast<size_t>(n));
  return true;
}

bool processStat(int32_t pid, ProcessStat& out) {
  char path[32], buf[1024];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = readAt(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return false;
  // Fields count from the last ')': the name (field 2) may hold spaces and parentheses.
  const char* p = std::strrchr(buf, ')');
  int64_t fields[22] = {};  // fields[i]: field i + 1, from field 4 on
  for (int field = 3; field <= 22; ++field) {
    p = p == nullptr ? nullptr : std::strchr(p + 1, ' ');
    if (p == nullptr) return false;
    if (field >= 4) fields[field - 1] = std::strtoll(p + 1, nullptr, 10);
  }
  out.pid = pid;
  out.ticks = fields[13] + fields[14];
  out.started = static_cast<uint64_t>(fields[21]);
  return true;
}

}  // namespace torchrpc::common::proc
