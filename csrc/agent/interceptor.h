#pragma once

// Interceptor: the agent's one extension point for concepts that travel with
// calls without being calls themselves (distributed autograd, profiling). The
// agent calls each at the four places a call message passes; it may rewrite
// the message in place (wrap it in an envelope, or unwrap one). The agent does
// not know what an envelope means. Several nest: the one added last wraps
// outermost on the way out and unwraps first on the way in.

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>

#include "message/message.h"

namespace torchrpc::agent {

// The state a request brought with it, kept while the callee runs it.
class CallScope {
 public:
  virtual ~CallScope() = default;
  // Runs fn (the handler, or a continuation of it) under this scope, on the
  // current thread.
  virtual void run(const std::function<void()>& fn) = 0;
  // Callee, before the response leaves: may wrap it.
  virtual void outgoingResponse(message::Message& response) = 0;

  // The scope the calling thread's handler runs under, or null: a handler
  // that answers later (from a callback) runs its continuation under it
  // (Agent::continueOnPool). Defined in libtorchrpc, so that the Python
  // module's handlers see the same thread-local.
  static std::shared_ptr<CallScope> current();
  // Makes `scope` current on this thread for a block (Agent::dispatch).
  class Entered {
   public:
    explicit Entered(std::shared_ptr<CallScope> scope);
    ~Entered();
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;

   private:
    std::shared_ptr<CallScope> previous_;
  };
};

// What the caller's agent knows of a request it is sending.
struct Outgoing {
  int dst;
  const std::string& callKind;  // "rpc_sync", "rpc_async", "remote", "to_here", "rref", ...
  const std::string& function;  // what runs there, as errors name it
  const c10::intrusive_ptr<c10::ivalue::Future>& future;  // completes with the call, also on failure
};

class Interceptor {
 public:
  virtual ~Interceptor() = default;
  // Caller, on the sending thread, before the request is queued (request.id
  // is set).
  virtual void outgoingRequest(message::Message& request, const Outgoing& call) = 0;
  // Caller, before the response completes the call's future.
  virtual void incomingResponse(message::Message& response, int src) = 0;
  // Callee, on the pool thread, before the request is dispatched. Returns the
  // scope to run it under, or null when the request carries none.
  virtual std::shared_ptr<CallScope> incomingRequest(message::Message& request, int src) = 0;
  // Whether incomingRequest() would now give a request that came without an
  // envelope a scope (the server's global profiler). A fast path that would
  // run such a request's work outside the scope leaves it to the pool then.
  virtual bool scopesPlainRequests() const { return false; }
  // The agent shut down: drop what it was keeping for calls.
  virtual void stop() {}
};

}  // namespace torchrpc::agent
