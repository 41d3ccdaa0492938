#pragma once

// Rendezvous: workers find each other through a torch.distributed Store
// (TCPStore, FileStore, ... whatever env://, tcp://, file:// or the user
// gave). The same code serves Python workers (through the bindings) and C++
// programs that link libtorchrpc, so both kinds can be in one job.
//
// Keys, under "torchrpc/<generation>/": "worker/<rank>" holds a worker's
// record (name, rank, TCP address, Unix address, host id; one per line);
// "secret" the job's secret, when the user gave none.
// The generation, from a counter all workers of a job bump once, keeps a
// reused store (the same file://, an explicit store passed twice) apart
// across init/shutdown cycles. Barriers ("shutdown") live there too.
//
// A dynamic job (no world size: workers join and leave while it runs, see
// worker/membership.h) keeps its keys under "torchrpc/dynamic/": "token"
// (who is joining or leaving now: one at a time), "members" (the ranks of
// the workers in the job, comma-separated), "worker/<rank>" and "secret" as
// above. "torchrpc/kind" says which kind of job holds the store: the two
// cannot share one.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.h"

namespace torchrpc::rendezvous {

// A worker's record: name, rank, addresses, host id (for the store and the
// MEMBER_JOIN message). decodePeer throws c10::Error on a malformed one,
// naming `where` it came from; it reads at most kMaxRecordBytes.
std::string encodePeer(const agent::PeerInfo& peer);
agent::PeerInfo decodePeer(const std::string& record, const std::string& where);
constexpr size_t kMaxRecordBytes = 4096;

class Rendezvous {
 public:
  // `worldSize` <= 0: a dynamic job.
  Rendezvous(c10::intrusive_ptr<c10d::Store> store, int rank, int worldSize);

  static constexpr size_t kSecretBytes = 32;
  static constexpr size_t kMinSecretBytes = 16;

  // The job's secret for the connection handshake (auth/handshake.h): `given`
  // (the user's), else TORCHRPC_SECRET, else one that rank 0 makes and hands
  // out through the store (whoever can read the store can read that one).
  // Ranks other than 0 wait for it up to the store's timeout, asking
  // `interrupted` (may be empty) between polls, as exchange() does.
  std::string sharedSecret(std::string given, const std::function<bool()>& interrupted = {});
  // Publishes `me`; returns every worker's record, by rank, once all are in.
  // Polls the store up to its timeout; `interrupted` (may be empty) is asked
  // between polls, and once it returns true the wait throws (init_rpc:
  // Ctrl-C). Throws c10::ValueError if two workers have the same name.
  std::vector<agent::PeerInfo> exchange(const agent::PeerInfo& me, const std::function<bool()>& interrupted = {});
  // Returns once every worker reached barrier `tag`, or is gone: `gone(rank)`
  // (may be empty) says a worker died, and this worker then marks it gone in
  // the store for the others, who may not know. Rank 0 (which may host the
  // store) also waits until everyone else has left it. Returns the ranks
  // that were gone instead of arriving. Throws on timeout, naming the ranks
  // still missing; `timeoutSeconds` <= 0 waits without a limit.
  std::set<int> barrier(const std::string& tag, double timeoutSeconds, const std::function<bool(int)>& gone = {});
  // barrier() that also adds up `value` over the workers that arrived (an
  // all-reduce of one count: the TORCHRPC backend's join counts calls in
  // flight). A tag is used once.
  struct Tally {
    int64_t sum{0};
    std::set<int> gone;
  };
  Tally tally(const std::string& tag, int64_t value, double timeoutSeconds, const std::function<bool(int)>& gone = {});

  // Claims the store for this kind of job (static or dynamic); throws
  // c10::Error (RuntimeError) if the other kind holds it. releaseKind() gives
  // it back: rank 0 after a static job's graceful shutdown, the last worker of
  // a dynamic job as it leaves.
  void claimKind();
  void releaseKind();

  // ---- dynamic jobs, see worker/membership.h ----
  // Takes the job's membership token for `me`, who is `doing` it ("joining",
  // "leaving"): one worker joins or leaves at a time. Waits up to the store's
  // timeout; throws naming the holder. The token's value is its holder's
  // label and record; once a second, `runs(holder)` is asked whether the
  // holder still runs: one that died with it (killed while joining or
  // leaving) would block every later join and leave, so it is taken over.
  // Returns the label of the holder taken over from, or "".
  std::string lockMembership(const agent::PeerInfo& me, const std::string& doing,
                             const std::function<bool(const agent::PeerInfo&)>& runs);
  void unlockMembership();
  // The records of the workers in the job now, by rank.
  std::vector<agent::PeerInfo> members();
  // Publishes this worker's record and lists it among the members.
  void list(const agent::PeerInfo& me);
  // Takes `rank` off the list of members; returns how many remain.
  size_t unlist(int rank);
  bool dynamic() const { return worldSize_ <= 0; }

 private:
  std::vector<int> listedRanks();
  void setListedRanks(const std::vector<int>& ranks);

  // Polls until every rank set `prefix`<rank> or is marked gone under `tag`
  // (those are added to *goneRanks).
  void waitForAll(const std::string& tag, const std::string& prefix, std::chrono::steady_clock::time_point deadline,
                  const std::function<bool(int)>& gone, std::set<int>* goneRanks,
                  std::chrono::milliseconds maxPoll = std::chrono::milliseconds(200));

  c10::intrusive_ptr<c10d::Store> root_;   // the store as given
  c10::intrusive_ptr<c10d::Store> store_;  // prefixed with the generation (or "dynamic")
  int rank_;
  int worldSize_;
};

}  // namespace torchrpc::rendezvous
