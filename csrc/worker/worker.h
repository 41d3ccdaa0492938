#pragma once

// Worker: one initialised member of a job, and the one lifecycle of it, for
// C++ programs and for Python's init_rpc / shutdown alike. A C++ worker
// serves TorchScript calls (and calls others, e.g. from a loaded model
// through the torchrpc:: ops) in the same job as Python workers.
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
//   torchrpc::Worker w(options, store, [&](torchrpc::Agent& agent, torchrpc::rref::RRefContext&) {
//     agent.registry().add("server.forward", moduleMethodCallee(model, "forward"));
//   });
//   ...
//   w.shutdown();  // waits for every worker, like shutdown(graceful=True)
//
// Init: listen; exchange addresses through the store (waiting for the whole
// job; a dynamic job's worker joins the members there are instead, see
// worker/membership.h); create the RRef context; install distributed autograd; run the
// front end's hook (Python installs its handlers there; no call is handled
// before it returns); serve; become Agent::current() and
// RRefContext::current() for the ops.
//
// Shutdown (graceful): wait for this worker's calls; meet every worker
// ("shutdown" barrier), serving calls meanwhile; release this worker's user
// RRefs and wait for the owners' acks (twice: a user may be confirmed during
// the first pass); meet again ("rref-shutdown"); stop. A peer known dead
// (PeerWatch::gone) is not waited for at either meeting; the shutdown then
// finishes and reports it (PeerUnreachableError naming it). A dynamic job's
// worker settles its own calls and RRefs, then leaves alone (membership.h).
// A timeout <= 0 (upstream's default) sets no limit on the wait for this
// worker's calls and for the others to arrive, which may be busy for hours
// (a parameter server waits there while trainers train); each later step is
// bounded by the job's RPC timeout.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "rendezvous/rendezvous.h"
#include "rref/rref_context.h"
#include "worker/membership.h"
#include "worker/peer_watch.h"

namespace torchrpc::worker {

// Identifies this host and network namespace: workers with equal ids talk over
// Unix sockets. Python workers use the same function.
std::string localHostId();

class Worker {
 public:
  using Hook = std::function<void(agent::Agent&, rref::RRefContext&)>;

  // Joins the job (see Init above); throws if it cannot, leaving nothing running.
  // `interrupted` (may be empty) is asked between polls of the wait for the
  // whole job; once it returns true, init throws (Python: Ctrl-C).
  Worker(agent::AgentOptions options, c10::intrusive_ptr<c10d::Store> store, const Hook& beforeServing = {},
         const std::function<bool()>& interrupted = {});
  // Stops at once if stop() was not called.
  ~Worker();

  agent::Agent& agent() { return *agent_; }
  const std::shared_ptr<agent::Agent>& agentPtr() const { return agent_; }
  const std::shared_ptr<rref::RRefContext>& rrefs() const { return rrefs_; }
  // Every worker of the job now, by rank (a dynamic job's change).
  std::vector<agent::PeerInfo> peers() const { return agent_->members().list(); }

  struct StopReport {
    std::exception_ptr failure;  // an RpcError: why the graceful part did not finish
    // Owner RRefs that still had users after every worker released its own:
    // (rrefId, forks, value ready, creation failed).
    std::vector<rref::OwnerTable::EntryInfo> leaked;
  };
  // Leaves the job: graceful (see Shutdown above, each wait bounded by
  // `timeoutSeconds`, or as said there when it is <= 0) or at once (pending calls fail with ShutdownError).
  // Stops the agent and the RRef context in every case. Call it once, from a
  // thread that is not the agent's.
  // `interrupted` (may be empty) is asked between polls of the wait for the
  // other workers: once it returns true, that wait ends and the worker stops
  // as after a timeout (the failure says so). Python passes a check of its
  // signals, so that Ctrl-C ends a wait without a limit.
  StopReport stop(bool graceful, double timeoutSeconds, const std::function<bool()>& interrupted = {});
  // stop(graceful=true) that throws its failure.
  void shutdown(double timeoutSeconds = 0.0);

 private:
  std::exception_ptr leaveGracefully(double timeoutSeconds, const std::function<bool()>& interrupted,
                                     std::vector<rref::OwnerTable::EntryInfo>* leaked);
  // A dynamic job's: this worker's calls and RRefs settled, then it leaves
  // alone (worker/membership.h), without meeting the others.
  std::exception_ptr leaveDynamic(double timeoutSeconds, std::vector<rref::OwnerTable::EntryInfo>* leaked);
  // Releases this worker's user RRefs and waits for the owners' acks, twice
  // (a user may be confirmed during the first pass); a timeout error or null.
  std::exception_ptr releaseRRefs(std::chrono::steady_clock::time_point deadline, const std::string& limit);
  void leakedOwners(std::vector<rref::OwnerTable::EntryInfo>* leaked) const;
  // How long each step after the meeting may take in a shutdown without a
  // limit: the job's RPC timeout, or 60 s without one.
  double stepSeconds() const;
  // PeerUnreachableError naming the peers found dead at shutdown's
  // meetings (`dead`), or null.
  std::exception_ptr deadPeersFailure(const std::set<int>& dead) const;

  std::shared_ptr<agent::Agent> agent_;
  std::shared_ptr<rref::RRefContext> rrefs_;
  std::shared_ptr<PeerWatch> peerWatch_;
  std::unique_ptr<rendezvous::Rendezvous> rendezvous_;
  std::unique_ptr<Membership> membership_;  // a dynamic job's
  bool stopped_{false};
};

}  // namespace torchrpc::worker
