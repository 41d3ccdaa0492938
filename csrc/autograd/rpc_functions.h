#pragma once

// The two autograd nodes that stand for an RPC in the graph. Their names are
// upstream's, which users see as grad_fn.name().
//
//   SendRpcBackward  on the worker that sent tensors requiring grad. Its next
//                    edges are those tensors' gradient edges; the distributed
//                    backward pass starts a local pass from it when the
//                    receiver sends the gradients back (AUTOGRAD_BACKWARD).
//   RecvRpcBackward  on the worker that received them: the received tensors'
//                    grad_fn. The backward pass never runs it; it captures the
//                    gradients that reach it and sends them to `src`.

#include <torch/csrc/autograd/function.h>

#include <cstdint>

namespace torchrpc::autograd {

class SendRpcBackward : public torch::autograd::Node {
 public:
  // `tensors` are the sent tensors that require grad, in message order.
  explicit SendRpcBackward(const std::vector<at::Tensor>& tensors);
  std::string name() const override { return "torch::distributed::autograd::SendRpcBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
};

class RecvRpcBackward : public torch::autograd::Node {
 public:
  // The context, the worker that sent the tensors and its send function's id.
  RecvRpcBackward(int64_t contextId, int src, int64_t sendId);
  std::string name() const override { return "torch::distributed::autograd::RecvRpcBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;

  const int64_t contextId;
  const int src;
  const int64_t sendId;
};

}  // namespace torchrpc::autograd
