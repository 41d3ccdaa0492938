#include "autograd/rpc_functions.h"

#include <torch/csrc/autograd/functions/utils.h>

namespace torchrpc::autograd {

SendRpcBackward::SendRpcBackward(const std::vector<at::Tensor>& tensors)
    : Node(torch::autograd::collect_next_edges(tensors)) {
  for (const auto& t : tensors) add_input_metadata(t);
}

torch::autograd::variable_list SendRpcBackward::apply(torch::autograd::variable_list&& grads) {
  return std::move(grads);  // the receiver's gradients, on to the sent tensors' history
}

RecvRpcBackward::RecvRpcBackward(int64_t contextId_, int src_, int64_t sendId_)
    : contextId(contextId_), src(src_), sendId(sendId_) {}

torch::autograd::variable_list RecvRpcBackward::apply(torch::autograd::variable_list&&) {
  TORCH_CHECK(false,
              "this tensor came over torchrpc inside distributed autograd context ", contextId,
              "; its gradients flow back with torchrpc.autograd.backward(context_id, [loss]), "
              "not with loss.backward() or torch.autograd.grad()");
}

}  // namespace torchrpc::autograd
