#pragma once

// One local pass of the distributed backward (engine.h): torch's autograd
// engine runs the part of this worker's graph between the pass's roots and
// the edges where gradients leave it, which are the leaves (AccumulateGrad)
// and the receive nodes (RecvRpcBackward).
//
// A leaf's gradient accumulates into the context as it arrives, inside the
// engine's graph task, the way torch's AccumulateGrad and upstream's
// DistEngine do it:
//   - the leaf node's pre hooks run first, then its tensor hooks;
//   - the gradient is kept without a copy when nothing else holds it (the
//     layout rules of AccumulateGrad decide the rest);
//   - then the node's post hooks run, with the context current for torch
//     (ThreadLocalDistAutogradContext): DDP's Reducer is one such hook; it
//     averages the gradients in the context and finishes in a callback that
//     the engine runs before the pass returns.
// A receive node's gradients are returned, to be sent to their worker.
//
// Python nodes (custom autograd Functions, hooks) take the GIL themselves; the
// caller must not hold it. An exception from a node propagates as torch's
// engine raised it (a Python error keeps its class and text).

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <optional>
#include <vector>

#include "autograd/context.h"
#include "autograd/rpc_functions.h"

namespace torchrpc::autograd {

// The gradients a pass captured for one receive node, by the node's input.
struct RecvGradients {
  c10::intrusive_ptr<torch::autograd::Node> node;  // keeps the RecvRpcBackward alive
  std::vector<std::optional<at::Tensor>> grads;
};

// Runs the pass from `roots` with gradients `grads` (one each) in `ctx`;
// keepGraph keeps the graph's buffers for another pass. Returns the
// gradients for each receive node reached.
std::map<RecvRpcBackward*, RecvGradients> runLocalPass(Context& ctx, const torch::autograd::edge_list& roots,
                                                      const torch::autograd::variable_list& grads, bool keepGraph);

}  // namespace torchrpc::autograd
