#pragma once

// TorchAgent: torch.distributed.rpc's agent interface (upstream's RpcAgent,
// torch/csrc/distributed/rpc/rpc_agent.h) on torchrpc's agent. It is the
// TORCHRPC backend (torchrpc/torch_backend.py registers it): upstream's Python
// API, RRef context, distributed autograd, profiler and request callback run
// unchanged above it; below it, one agent::Agent moves the messages over
// torchrpc's transport, framing, handshake and rendezvous. See
// docs/torch-backend.md.
//
// A call: send() wraps upstream's Message in a TORCH_REQUEST (envelope.h) and
// hands it to agent::Agent::send, which gives it an id, a deadline and a
// connection, and fails it at once when the peer's connection is lost. On the
// callee, the agent runs the TORCH_REQUEST handler on its pool: upstream's
// RequestCallback processes the message (a SCRIPT_CALL whose callee this
// worker knows runs without it, a short one on the I/O thread:
// inline_script_calls.h); its response,
// or its error as upstream's EXCEPTION message, goes back in a TORCH_RESPONSE
// with the request's id. The caller completes upstream's future on a pool
// thread too (upstream's callbacks may run user code or wait), or, for an
// rpc_sync, on the thread that waits for it (SyncWait, below).
//
// Errors: a timeout says upstream's "RPC ran for more than set timeout" and
// carries upstream's TIMEOUT error type (RRefs check it); every error of the
// transport names the call and the peer ("rpc #7 worker0 -> worker1 (addr)
// 'PYTHON_CALL': ..."); remote errors are upstream's own.
//
// Lifecycle (upstream's): construct (rendezvous: every worker's address and
// name), start() (serve), join() (wait until no worker has a call in flight),
// shutdown(). Threads: send() and the getters from any thread; join(), sync()
// and shutdown() from one that is not the agent's (pool or loop).
//
// A dynamic job (init_rpc without a world_size, as TensorPipe's): the worker
// joins the members there are and leaves on its own, through
// worker/membership.h, as torchrpc's own workers do; the worker tables here
// follow the agent's members.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/rpc/rpc_agent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/agent.h"
#include "common/waiting_thread.h"
#include "rendezvous/rendezvous.h"
#include "torch_backend/inline_script_calls.h"
#include "worker/membership.h"
#include "worker/peer_watch.h"

namespace torchrpc::torch_backend {

namespace upstream = torch::distributed::rpc;

class SyncWait;

// What the Python side lends the agent (bindings/torch_backend_bindings.cpp):
// libtorchrpc has no Python. Each may be empty.
struct PythonHooks {
  // Runs on a pool thread before upstream's code does there: the Python side
  // keeps the thread's Python state with it (python_fallback/gil.h), which
  // upstream's GIL acquires would otherwise make and free on every call.
  std::function<void()> onPoolThread;
  // Runs a request that runs Python (a PYTHON_CALL, say) in its turn: the
  // pool's Python requests take turns (python_fallback/python_turn.h).
  std::function<void(const std::function<void()>&)> inPythonTurn;
  // A thread that sends a call gives its turn up, if it holds one: upstream's
  // nested calls wait inside upstream's code, where no pause can be put.
  std::function<void()> sending;
  // The TorchScript function a SCRIPT_CALL names (inline_script_calls.h).
  InlineScriptCalls::FindFunction scriptFunction;
};

class TorchAgent : public upstream::RpcAgent {
 public:
  // Joins a job through `store` (the store upstream's init_rpc made): a
  // static one of options.worldSize workers, or with worldSize 0 a dynamic
  // one (it is announced to the members once start() serves). `callback` is
  // upstream's request callback (RequestCallbackImpl, from the Python side).
  // options.secret, if empty, comes from the rendezvous (rendezvous.h
  // sharedSecret).
  TorchAgent(c10::intrusive_ptr<c10d::Store> store, agent::AgentOptions options,
             std::unique_ptr<upstream::RequestCallback> callback, PythonHooks python = {});
  ~TorchAgent() override;

  c10::intrusive_ptr<upstream::JitFuture> send(const upstream::WorkerInfo& to,
                                               c10::intrusive_ptr<upstream::Message> message,
                                               const float rpcTimeoutSeconds = upstream::kUnsetRpcTimeout,
                                               const upstream::DeviceMap& deviceMap = {}) override;

  using upstream::RpcAgent::getWorkerInfo;  // this worker's own, beside the overrides
  const upstream::WorkerInfo& getWorkerInfo(const std::string& workerName) const override;
  const upstream::WorkerInfo& getWorkerInfo(upstream::worker_id_t id) const override;
  std::vector<upstream::WorkerInfo> getWorkerInfos() const override;

  // Waits until no worker of the job has a call in flight (its own calls done,
  // then a count over all workers, repeated until it is zero), bounded by
  // `timeout` seconds (<= 0: the rpc_timeout the agent started with). With
  // `shutdown`, all workers then meet once more, so none stops serving while
  // another still counts. A worker found dead is not waited for; join then
  // throws, naming it. A dynamic job's worker waits for its own calls only;
  // with `shutdown` it then leaves the job (the members drop it) and waits
  // for the requests it is still serving.
  void join(bool shutdown = false, float timeout = 0) override;
  // Waits for this worker's calls, then (a static job) for every worker to
  // reach sync().
  void sync() override;
  void startImpl() override;
  void shutdownImpl() override;
  std::unordered_map<std::string, std::string> getMetrics() override;
  std::unordered_map<std::string, std::string> getDebugInfo() override;

  // False in a dynamic job (TensorPipe's agent has the same property).
  bool isStaticGroup() const { return membership_ == nullptr; }
  // The torchrpc agent underneath (tests, debugging).
  const std::shared_ptr<agent::Agent>& torchrpcAgent() const { return agent_; }

 private:
  void addGilWaitTime(const std::chrono::microseconds gilWaitTime) override;
  friend class SyncWait;  // names its waits after this worker
  // TORCH_REQUEST handler, on a pool thread.
  void serve(message::Message&& request, message::Reply reply);
  // The fast path, on the thread that read it: a short call runs there, a
  // candidate for it runs on the pool and is timed (inline_script_calls.h).
  // False: not a candidate (serve() then, on the pool).
  bool serveCandidate(message::Message& request, const message::Reply& reply);
  // Runs upstream's request through upstream's callback and answers it.
  void process(upstream::Message& request, uint64_t id, const message::Reply& reply);
  // A candidate's run: by InlineScriptCalls::run, else process().
  void processScriptCall(upstream::Message& request, uint64_t id, const message::Reply& reply,
                         InlineScriptCalls::Sighting& seen);
  // Completes upstream's future from torchrpc's (on a pool thread, or on
  // the caller's for a call refused before sending).
  void complete(upstream::JitFuture& out, c10::ivalue::Future& in);
  void callDone();
  int64_t clientCalls();
  // Waits until this worker has no call in flight; false at the deadline.
  bool waitCalls(std::chrono::steady_clock::time_point deadline);
  // The bound of join() and sync() when none is given.
  double defaultWaitSeconds() const;
  std::string workerLabel(int rank) const;
  // Upstream's WorkerInfo of a member; upstream keeps references to it, so
  // each one lives as long as the agent.
  const upstream::WorkerInfo& infoOf(int rank, const std::string& name) const;
  // A dynamic job's leave: tells the members, then waits for the requests
  // this worker still serves. Throws at the deadline or if some member could
  // not be told.
  void leave(std::chrono::steady_clock::time_point deadline, const std::string& limit);

  const std::string name_;
  const double startTimeoutSeconds_;
  const PythonHooks python_;
  InlineScriptCalls inlineCalls_;
  std::unique_ptr<rendezvous::Rendezvous> rendezvous_;
  std::shared_ptr<agent::Agent> agent_;
  std::string tcpAddress_;  // where this worker listens (get_debug_info's "agent.address")
  std::shared_ptr<worker::PeerWatch> peerWatch_;
  std::unique_ptr<worker::Membership> membership_;  // a dynamic job's
  mutable std::mutex infosMutex_;
  mutable std::map<std::pair<int, std::string>, std::unique_ptr<upstream::WorkerInfo>> infos_;

  // Calls sent and not yet completed (their callbacks run): join() waits for zero.
  std::mutex callsMutex_;
  std::condition_variable callsDone_;
  int64_t clientCalls_{0};
  struct ServerStats {
    std::atomic<int64_t> calls{0};       // requests being processed here
    std::atomic<int64_t> asyncCalls{0};  // of those, ones whose result is not ready yet
  };
  const std::shared_ptr<ServerStats> serverStats_;  // shared with callbacks that may outlive the agent
  std::atomic<uint64_t> gilWaitMicros_{0};
  std::atomic<uint64_t> gilWaits_{0};
  std::atomic<uint64_t> meetings_{0};  // join() and sync() calls so far: their meetings' tags
  std::atomic<bool> stopped_{false};
};

// An rpc_sync whose caller waits for it itself (torchrpc/torch_backend.py
// wraps upstream's rpc_sync): made on the calling thread just before
// upstream's code sends, it makes that thread's next send() the call. wait()
// polls, then sleeps, and runs the call's completion (upstream's callbacks)
// on this thread when the response comes, instead of a pool thread running
// it and waking this one from upstream's Future.wait.
class SyncWait {
 public:
  explicit SyncWait(TorchAgent& agent);
  ~SyncWait();  // close()
  SyncWait(const SyncWait&) = delete;
  SyncWait& operator=(const SyncWait&) = delete;

  // Returns once the call's future is complete, its completion having run
  // on this thread. onSleep as WaitingThread::serveUntil's (an exception it
  // throws ends the wait). Without a send since construction (upstream
  // failed before sending, or a nested SyncWait of this thread was
  // pending), returns at once.
  void wait(const std::function<void()>& onSleep);
  // The call's completion, if it comes later, runs on the pool.
  void close();

 private:
  friend class TorchAgent;
  // send()'s: binds this thread's SyncWait that no send took yet to `out`
  // and returns its waiter; null if there is none.
  static std::shared_ptr<common::WaitingThread> takeFor(c10::intrusive_ptr<upstream::JitFuture> out);
  std::function<void(common::WaitingThread::Task)> toPool() const;  // where a completion not run here goes

  std::shared_ptr<agent::Agent> agent_;
  std::shared_ptr<common::WaitingThread> waiter_;
  c10::intrusive_ptr<upstream::JitFuture> out_;  // the call's future, once sent
};

}  // namespace torchrpc::torch_backend
