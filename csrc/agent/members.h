#pragma once

// Members: the workers of the job as this agent knows them, by rank, and the
// connection this agent keeps to each. A static job's table (init_rpc with a
// world_size) is set once, after the rendezvous. A dynamic job's (init_rpc
// without one) grows and shrinks while the job runs: worker/membership.h adds
// a worker when it joins and removes it when it leaves. See
// docs/user-guide.md, "Workers that join and leave".
//
// Owned by the Agent. Thread-safe: lookups return shared pointers, so a member
// that leaves stays valid for a caller that still holds it.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/connection.h"

namespace torchrpc::agent {

struct PeerInfo {
  std::string name;
  int rank{0};
  std::string tcpAddress;
  std::string unixAddress;
  std::string hostId;

  // Where a worker on host `fromHost` reaches it: its Unix socket on the same
  // host, else TCP.
  const std::string& addressFrom(const std::string& fromHost) const {
    return !hostId.empty() && hostId == fromHost ? unixAddress : tcpAddress;
  }
};

// The connection this agent sends its requests to one peer on (one at a time).
struct PeerLink {
  std::mutex connectMutex;  // one connection attempt at a time
  std::mutex mutex;         // guards conn
  std::shared_ptr<transport::Connection> conn;
};

class Members {
 public:
  // Ranks a worker of a dynamic job may have (upstream's worker ids are int16).
  static constexpr int kMaxDynamicRank = 32767;
  // How many departed workers are remembered for errors that name them.
  static constexpr size_t kMaxDeparted = 1024;

  // `worldSize` > 0: a static job of ranks [0, worldSize); else dynamic.
  Members(int selfRank, int worldSize);

  bool dynamic() const { return worldSize_ <= 0; }
  // Whether a peer may prove `rank` in the handshake: a static job's other
  // ranks; in a dynamic job any rank up to kMaxDynamicRank, since a worker
  // that joins connects before the members know it (the job's secret is what
  // admits it).
  bool admissible(int rank) const;
  // How many workers the job has now (a static job: world_size, from the start).
  size_t size() const;

  // Sets a static job's table, indexed by rank, or a dynamic job's first one.
  void set(std::vector<PeerInfo> peers);
  // A dynamic job: adds a worker that joined. Throws c10::Error if its rank
  // or name belongs to another member.
  void add(PeerInfo info);
  // A dynamic job: removes a worker that left (`why` names how, for the
  // errors of later calls to it). Returns whether it was a member.
  bool remove(int rank, const std::string& why);

  // The member of `rank`, or null.
  std::shared_ptr<const PeerInfo> find(int rank) const;
  // The rank of the member named `name`, or -1.
  int rankOf(const std::string& name) const;
  // Every member, by rank.
  std::vector<PeerInfo> list() const;
  // Why `rank`, or the worker named `name`, is not a member ("worker1 (rank
  // 1) left the job"), or "" when it never was one (as far as this agent
  // remembers, and while no member has that rank or name again).
  std::string departed(int rank) const;
  std::string departed(const std::string& name) const;
  // Changes with every add and remove: caches of the table compare it.
  uint64_t version() const { return version_.load(); }

  // The link to `rank`: one per member, and one per rank of a static job
  // before its table is set (a peer may connect before); null otherwise.
  std::shared_ptr<PeerLink> link(int rank) const;
  std::vector<std::shared_ptr<PeerLink>> links() const;
  // Forgets `conn` if a link holds it; returns that link's rank, else -1.
  int unlink(const std::shared_ptr<transport::Connection>& conn);

 private:
  const int selfRank_;
  const int worldSize_;
  mutable std::mutex mutex_;
  std::map<int, std::shared_ptr<const PeerInfo>> infos_;
  mutable std::unordered_map<int, std::shared_ptr<PeerLink>> links_;  // made when first needed
  struct Departed {
    std::string name;
    std::string why;
  };
  std::map<int, Departed> departed_;  // by rank; at most kMaxDeparted
  std::atomic<uint64_t> version_{0};
};

}  // namespace torchrpc::agent
