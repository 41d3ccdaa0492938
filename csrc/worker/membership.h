#pragma once

// Membership: how a worker joins and leaves a dynamic job (init_rpc without a
// world_size), while the job runs. One per dynamic Worker.
//
// Join (the Worker's init):
//   enter()    take the job's membership token in the store (one worker joins
//              or leaves at a time); claim the store for a dynamic job (a
//              static job there is upstream's "mixes statically and
//              dynamically" error); read the members; publish this worker's
//              record. Returns the agent's first table: the members and itself.
//   announce() once serving: send each member MEMBER_JOIN with this worker's
//              record, whose handler adds it to the member's table, and wait
//              for every answer; list this worker; give the token back.
//              A member that refuses connections died without leaving: it is
//              dropped from the list, with a warning.
// The token: one holder at a time, its record in the token's value. A worker
// that died holding it (killed while joining or leaving) would block every
// later join and leave; a waiter that finds its listener gone takes it over.
// Leave (graceful shutdown): take the token; send each member MEMBER_LEAVE,
// whose handler removes this worker from its table (later calls to it fail
// naming it); unlist it (the last one gives the store's kind back); give the
// token back. Workers leave one by one: nobody waits for the whole job.
//
// A joiner proves the job's secret in the handshake like any worker; the
// handler also checks that the record it sends is for the rank it proved.
// Threads: enter/announce/leave on the thread that starts or stops the Worker;
// the handlers on pool threads.

#include <memory>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "rendezvous/rendezvous.h"

namespace torchrpc::worker {

class Membership {
 public:
  Membership(std::shared_ptr<agent::Agent> agent, rendezvous::Rendezvous& rendezvous);
  // Gives the token back if it is still held (a join that failed).
  ~Membership();

  std::vector<agent::PeerInfo> enter(const agent::PeerInfo& me);
  // Installs the MEMBER_JOIN and MEMBER_LEAVE handlers; before the agent serves.
  void install();
  void announce(double timeoutSeconds);
  // Returns an RpcError (PeerUnreachable or Timeout) if some member could not
  // be told, or null; this worker is unlisted either way.
  std::exception_ptr leave(double timeoutSeconds);

 private:
  // Sends `type` with this worker's record to each of `ranks`; returns the
  // ranks that answered, and in *failure the first error of the others.
  std::vector<int> tell(message::MessageType type, const std::vector<int>& ranks, double timeoutSeconds,
                        std::exception_ptr* failure);
  // Takes the job's token, saying what this worker does with it; takes it
  // over from a holder that died (listens).
  void lock(const std::string& doing);
  // Whether the token's holder still accepts connections.
  bool listens(const agent::PeerInfo& holder) const;
  void unlock();

  const std::shared_ptr<agent::Agent> agent_;
  rendezvous::Rendezvous& rendezvous_;
  agent::PeerInfo me_;
  std::vector<int> others_;  // the members this worker found as it joined
  bool locked_{false};
};

}  // namespace torchrpc::worker
