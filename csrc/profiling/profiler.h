#pragma once

// RPC profiling, as the agent's Interceptor (agent/interceptor.h).
//
// Caller: a call sent while the sending thread runs torch's legacy autograd
// profiler (torch.autograd.profiler_legacy.profile) is recorded there as one
// range named as upstream names it, "rpc_async#f(worker0 -> worker1)", from
// the send until its response arrives, and travels in a PROFILED_CALL
// envelope carrying the profiler's settings. The callee runs it under a
// legacy profiler of its own (the handler and its continuations), and answers
// in a PROFILED_RET envelope with the events it recorded. The caller adds
// them to its profile as remote events, each named "<range>#remote_op: <op>"
// and keeping the node id (rank) of the worker that recorded it, before the
// call's future completes. Nested calls nest the same way.
//
// Cost when no profiler runs: one thread-local check per call on the caller
// and one comparison of the response's type.
//
// The process-global profiler (torchrpc._server_process_global_profile)
// profiles every request this worker serves while it is on.

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/agent.h"
#include "agent/interceptor.h"

namespace torchrpc::profiling {

// Adds the interceptor to `agent` and makes this worker's rank the node id of
// the events it records. Before agent.startServing().
void install(agent::Agent& agent);

// Whether this thread's calls are profiled now (a legacy profiler runs on it).
bool profiled();

// A call that never leaves this worker (remote() to oneself): when profiled,
// records its range until `done` completes and returns a future that
// completes once the range ended; else null.
c10::intrusive_ptr<c10::ivalue::Future> localCall(const agent::Agent& agent, const std::string& callKind,
                                                  const std::string& function,
                                                  const c10::intrusive_ptr<c10::ivalue::Future>& done);

// The process-global profiler: while at least one is on, every request this
// worker serves runs under a legacy profiler with that config, and each
// request's events are appended to every global profiler on. Nested: stop()
// returns the events of the innermost one, one list per request.
void startGlobal(const torch::profiler::impl::ProfilerConfig& config);
torch::autograd::profiler::thread_event_lists stopGlobal();

class Profiler : public agent::Interceptor, public std::enable_shared_from_this<Profiler> {
 public:
  explicit Profiler(const agent::Agent& agent) : agent_(agent) {}

  void outgoingRequest(message::Message& request, const agent::Outgoing& call) override;
  void incomingResponse(message::Message& response, int src) override;
  std::shared_ptr<agent::CallScope> incomingRequest(message::Message& request, int src) override;
  bool scopesPlainRequests() const override;

  struct Call;  // a profiled call in flight (profiler.cpp)
  // Starts a call's range on this thread; null for kinds not profiled.
  static std::shared_ptr<Call> start(const agent::Agent& agent, const std::string& callKind,
                                     const std::string& function, int dst);
  // Ends the call's range; first adds `events` (the callee's) to its profile.
  static void finish(Call& call, std::vector<torch::autograd::profiler::LegacyEvent>&& events);

 private:
  std::shared_ptr<Call> take(uint64_t id);

  const agent::Agent& agent_;  // owns this interceptor
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<Call>> calls_;  // by request id
  std::atomic<size_t> inFlight_{0};  // calls_.size(), read without the lock
};

}  // namespace torchrpc::profiling
