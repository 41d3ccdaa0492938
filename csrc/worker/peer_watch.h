#pragma once

// PeerWatch: which peers of the job died; its owner says what to let go of
// when one does (a Worker: the RRef forks and autograd contexts the peer held;
// the TORCHRPC backend: nothing). One per agent; created before it serves.
//
// A peer is lost when a connection to it closes without its GOODBYE
// (Agent::onPeerLost). It is gone when, besides, it cannot be reached: a
// worker that exited listens no more, so connecting is refused at once
// (Agent::reachable). A peer whose connection merely dropped, or a stranger
// that proved a live worker's rank and left, is reachable and so not gone.
//
//   lost --(grace period: AgentOptions::peerGraceSeconds)--> probe
//     unreachable: gone; the owner's onGone(rank) runs
//     reachable:   forgotten (it lives, or came back)
//
// Graceful shutdown asks gone() without waiting for the grace: a dead worker
// never reaches the shutdown barrier, and waiting for it would only time out
// (or never end: shutdown's default has no limit). gone() also dials a peer
// it has no open connection to, so a worker that exited or stopped (after its
// goodbye) is found even by a worker that never talked to it.
//
// Threads: the agent's callback runs on the loop thread and only schedules;
// probes and releases run on the timer thread; gone() on the caller's (not
// the loop). Thread-safe.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "common/timers.h"

namespace torchrpc::worker {

class PeerWatch : public std::enable_shared_from_this<PeerWatch> {
 public:
  // Runs on the timer thread when a lost peer is found gone after its grace.
  using OnGone = std::function<void(int rank)>;
  // Subscribes to the agent's peer losses; call before it serves.
  static std::shared_ptr<PeerWatch> create(std::shared_ptr<agent::Agent> agent, OnGone onGone = {});

  // Whether `rank` cannot be reached now: no open connection, and dialing it
  // fails (a dead peer stays dead).
  bool gone(int rank);
  // The ranks found gone so far, with why their connection closed.
  std::map<int, std::string> goneRanks() const;
  // Cancels pending grace periods; later losses are ignored.
  void stop();

 private:
  PeerWatch(std::shared_ptr<agent::Agent> agent, OnGone onGone);
  void lostFromLoop(int rank, const std::string& reason);
  // The grace period of a loss of `rank` ended: release its state if gone.
  void graceEnded(int rank);

  // How long a probe may take to connect: a dead worker refuses at once; a
  // slow network gets this long.
  static constexpr double kProbeSeconds = 1.0;

  const std::shared_ptr<agent::Agent> agent_;
  const OnGone onGone_;
  common::Timers graces_;
  mutable std::mutex mutex_;
  std::map<int, std::string> lost_;  // rank -> why its connection closed
  std::set<int> dead_;               // lost and found unreachable
};

}  // namespace torchrpc::worker
