// Distributed autograd from TorchScript, as upstream's builtins:
//
//   torchrpc::get_gradients(int context_id) -> Dict(Tensor, Tensor)
//   torchrpc::dist_backward(int context_id, Tensor[] roots, bool retain_graph=False) -> ()
//
// Inside @torch.jit.script code, torchrpc.autograd.get_gradients and
// torchrpc.autograd.backward compile to these (torchrpc/jit_ops.py). The
// backward pass blocks its thread until every worker is done, as the eager
// call does.

#include <torch/library.h>

#include "autograd/context.h"
#include "autograd/engine.h"
#include "jit_ops/rpc_ops.h"

namespace torchrpc::jit_ops {

namespace {

c10::Dict<at::Tensor, at::Tensor> getGradients(int64_t contextId) {
  auto agent = requireAgent("autograd.get_gradients");
  c10::Dict<at::Tensor, at::Tensor> out;
  for (auto& [leaf, grad] : autograd::Container::get().retrieve(contextId, agent->options().name)->gradients()) {
    out.insert(leaf, grad);
  }
  return out;
}

void distBackward(int64_t contextId, std::vector<at::Tensor> roots, bool retainGraph) {
  auto agent = requireAgent("autograd.backward");
  autograd::backward(*agent, contextId, roots, retainGraph)->value();  // rethrows the pass's error
}

}  // namespace

void defineAutogradOps(torch::Library& m) {
  m.def("torchrpc::get_gradients(int context_id) -> Dict(Tensor, Tensor)", &getGradients);
  m.def(torch::schema("torchrpc::dist_backward(int context_id, Tensor[] roots, bool retain_graph=False) -> ()",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &distBackward);
}

}  // namespace torchrpc::jit_ops
