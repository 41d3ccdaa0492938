#pragma once

// Recorder: the forward half of distributed autograd, as the agent's
// Interceptor (agent/interceptor.h).
//
// A request sent while the sending thread is in a context travels in an
// AUTOGRAD_CALL envelope: the context id, the id of the send function
// recorded for the request's tensors that require grad (if any), and which of
// the tensors those are. The callee adopts the context (creating it on first
// sight), gives those tensors a RecvRpcBackward as grad_fn, and runs the
// request with the context current on its thread, so nested calls are
// recorded too. Its response comes back in an AUTOGRAD_RET envelope built the
// same way, in the other direction.
//
// A builtin operator's call whose tensors need no grad travels outside the
// context, as upstream's. A call to oneself keeps the local autograd graph
// connected (agent/self_call.h clones the tensors that require grad), so its
// envelope only carries the context.

#include <memory>
#include <string>

#include "agent/interceptor.h"

namespace torchrpc::autograd {

class Recorder : public agent::Interceptor {
 public:
  Recorder(int rank, std::string worker) : rank_(rank), worker_(std::move(worker)) {}

  void outgoingRequest(message::Message& request, const agent::Outgoing& call) override;
  void incomingResponse(message::Message& response, int src) override;
  std::shared_ptr<agent::CallScope> incomingRequest(message::Message& request, int src) override;
  void stop() override;  // releases every context of this process

  const std::string& worker() const { return worker_; }

 private:
  const int rank_;
  const std::string worker_;
};

}  // namespace torchrpc::autograd
