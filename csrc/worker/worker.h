#pragma once

// The C++ entry point of libtorchrpc: what init_rpc / shutdown are in Python,
// for programs without Python. A C++ worker serves TorchScript calls (and
// calls others, e.g. from a loaded model through the torchrpc:: ops) in the
// same job as Python workers.
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
//   torchrpc::Worker w(options, store, [&](torchrpc::Agent& agent) {
//     agent.registry().add("server.forward", moduleMethodCallee(model, "forward"));
//   });
//   ...
//   w.shutdown();  // waits for every worker, like shutdown(graceful=True)

#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <memory>

#include "agent/agent.h"
#include "rendezvous/rendezvous.h"
#include "rref/rref_context.h"

namespace torchrpc {

// Identifies this host and network namespace: workers with equal ids talk over
// Unix sockets. Python workers use the same function.
std::string localHostId();

class Worker {
 public:
  // Listens, exchanges addresses through `store` (waiting for the whole job)
  // and starts serving; the agent becomes Agent::current() for the ops, and
  // its RRef context (remote() calls, RRefs in loaded TorchScript) current().
  // `beforeServing` may register callees: no call is handled before it returns.
  Worker(AgentOptions options, c10::intrusive_ptr<c10d::Store> store,
         const std::function<void(Agent&)>& beforeServing = {});
  ~Worker();

  Agent& agent() { return *agent_; }
  // Graceful: waits (serving calls) until every worker reached shutdown, up
  // to `timeoutSeconds`, then stops. Throws if the wait timed out.
  void shutdown(double timeoutSeconds = 60.0);

 private:
  std::shared_ptr<Agent> agent_;
  std::shared_ptr<rref::RRefContext> rrefs_;
  std::unique_ptr<Rendezvous> rendezvous_;
};

}  // namespace torchrpc
