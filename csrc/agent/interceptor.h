#pragma once

// Interceptor: the agent's one extension point for concepts that travel with
// calls without being calls themselves (distributed autograd). The agent calls
// it at the four places a call message passes; it may rewrite the message in
// place (wrap it in an envelope, or unwrap one). The agent does not know what
// an envelope means, only that an interceptor is installed.

#include <functional>
#include <memory>

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
  // that answers later (from a callback) runs its continuation under it.
  static std::shared_ptr<CallScope> current() { return current_; }
  // Makes `scope` current on this thread for a block (Agent::dispatch).
  class Entered {
   public:
    explicit Entered(std::shared_ptr<CallScope> scope) : previous_(std::move(current_)) {
      current_ = std::move(scope);
    }
    ~Entered() { current_ = std::move(previous_); }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;

   private:
    std::shared_ptr<CallScope> previous_;
  };

 private:
  static inline thread_local std::shared_ptr<CallScope> current_;
};

class Interceptor {
 public:
  virtual ~Interceptor() = default;
  // Caller, on the sending thread, before the request is queued.
  virtual void outgoingRequest(message::Message& request, int dst) = 0;
  // Caller, before the response completes the call's future.
  virtual void incomingResponse(message::Message& response, int src) = 0;
  // Callee, on the pool thread, before the request is dispatched. Returns the
  // scope to run it under, or null when the request carries none.
  virtual std::shared_ptr<CallScope> incomingRequest(message::Message& request, int src) = 0;
  // The agent shut down: drop what it was keeping for calls.
  virtual void stop() {}
};

}  // namespace torchrpc::agent
