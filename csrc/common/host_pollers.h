#pragma once

// HostPollers: how many threads of this user's torchrpc processes on this
// host are polling right now (common/spin.h), so that the wait policy
// (common/wait_policy.h) can tell pollers, which give way, from work when it
// counts the host's runnable threads; and which of those processes share
// this one's scheduling group (its session's autogroup and its cgroups), so
// that the policy can tell the CPU its own job uses from other groups'.
//
// Each process publishes its count in its own slot of a small table in shared
// memory (/dev/shm/torchrpc-pollers-v3-<uid>, mode 0600): {pid, start time,
// pollers, group}, one cache line each. A process claims a free slot, or one
// whose process is gone, on first use and frees it at exit. A process killed
// before it could free its slot leaves its pid to whichever process gets it
// next: the start time tells them apart, and group() frees such a slot.
// Readers skip dead pids and clamp every count, so a crashed process or a
// hostile table can skew the policy only towards polling as it did before it
// measured. Without /dev/shm (or if the file is not this user's own), only
// this process's pollers are known, and its group is itself.
//
// Thread-safe; begin() and end() are the hot path (one atomic add each). A child after fork()
// starts with no pollers and claims its own slot.

#include <cstdint>
#include <vector>

#include "common/proc_files.h"

namespace torchrpc::common {

class HostPollers {
 public:
  static HostPollers& instance();

  struct Slot;  // opaque outside host_pollers.cpp

  // A poll of this process begins: counts it in this process's slot, and
  // returns that slot (nullptr if none) for end().
  Slot* begin();
  // The poll that begin() counted in `slot` ended.
  static void end(Slot* slot);
  // Pollers of the other live processes in the table (scans it: for samples only).
  int others();
  // This process and the live processes of the table in its scheduling
  // group, each with its /proc stat (scans the table and reads those
  // processes' stat files: for rule 0's samples only). Frees the slots of
  // processes whose pid another process has taken since.
  std::vector<proc::ProcessStat> group();
  // The scheduling group of a process whose cgroup and autogroup files
  // (/proc/self/... for this one) are these: a hash of their texts, so any
  // difference gives another key; 0 if either cannot be read (a doubt counts
  // as another group). An empty autogroup is a real one: the host's default
  // autogroup, of every process in no session of its own (as under an init
  // or a service manager that never calls setsid).
  static uint64_t groupKeyOf(const char* cgroupPath, const char* autogroupPath);

  HostPollers(const HostPollers&) = delete;
  HostPollers& operator=(const HostPollers&) = delete;

 private:
  HostPollers();
  ~HostPollers();
  struct Table;
  Slot* claim();

  Table* table_ = nullptr;  // nullptr: no shared table
};

}  // namespace torchrpc::common
