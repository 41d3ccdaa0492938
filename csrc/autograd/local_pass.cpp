#include "autograd/local_pass.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>

#include <set>
#include <unordered_map>
#include <unordered_set>

namespace torchrpc::autograd {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;
using NodePtr = decltype(Edge::function);
using DistContextPtr = std::shared_ptr<torch::distributed::autograd::DistAutogradContext>;
using CaptureHook = torch::autograd::GraphTask::ExecInfo::Capture::GradCaptureHook;

namespace {

// The edges whose gradients the pass must capture: leaves (AccumulateGrad)
// and receive nodes. The engine runs only the nodes on paths to them.
torch::autograd::edge_list outputsOf(const torch::autograd::edge_list& roots) {
  torch::autograd::edge_list outputs;
  std::set<std::pair<const Node*, uint32_t>> taken;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  auto consider = [&](const Edge& e) {
    Node* n = e.function.get();
    if (!n) return;
    if (dynamic_cast<AccumulateGrad*>(n) || dynamic_cast<RecvRpcBackward*>(n)) {
      if (taken.emplace(n, e.input_nr).second) outputs.push_back(e);
      return;
    }
    if (seen.insert(n).second) stack.push_back(n);
  };
  for (const auto& r : roots) consider(r);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) consider(e);
  }
  return outputs;
}

// Runs as the engine captures a leaf's gradient (see local_pass.h); its
// result is what the engine keeps as captured.
class AccumulateIntoContext : public CaptureHook {
 public:
  AccumulateIntoContext(NodePtr leaf, Context& ctx) : leaf_(std::move(leaf)), ctx_(ctx) {}

  at::Tensor operator()(const at::Tensor& grad) override {
    auto* acc = static_cast<AccumulateGrad*>(leaf_.get());
    torch::distributed::autograd::ThreadLocalDistAutogradContext current{DistContextPtr(ctx_.store())};
    variable_list grads{grad};
    for (const auto& hook : acc->pre_hooks()) grads = (*hook)(grads);
    // Undefined when no gradient reached the leaf; its hooks still run, as in torch.
    if (grads[0].defined()) {
      // References to the gradient that are not someone else's: `grads`, the
      // engine's captured slot and the node's input buffer. With no other, the
      // context keeps the tensor itself instead of a copy.
      ctx_.accumulate(acc->variable, grads[0], /*expectedRefs=*/3);
    }
    for (const auto& hook : acc->post_hooks()) (*hook)(variable_list{}, grads);
    return grads[0];
  }

 private:
  const NodePtr leaf_;
  Context& ctx_;  // outlives the pass
};

// The pass's graph root: hands each root edge its gradient, as torch's
// GraphRoot does, and first gives the leaves' captures their hook. It runs
// inside the engine's graph task before any other node, which is the only
// place that reaches the task's captures.
class PassRoot : public Node {
 public:
  PassRoot(const torch::autograd::edge_list& roots, variable_list grads, std::vector<NodePtr> leaves, Context& ctx)
      : Node(torch::autograd::edge_list(roots)), grads_(std::move(grads)), leaves_(std::move(leaves)), ctx_(ctx) {
    add_input_metadata(trigger());
  }
  std::string name() const override { return "torchrpc::autograd::PassRoot"; }

  variable_list apply(variable_list&&) override {
    const auto* info = torch::autograd::get_current_graph_task_exec_info();
    TORCH_INTERNAL_ASSERT(info, "a distributed backward pass ran outside its graph task");
    for (const auto& leaf : leaves_) {
      auto it = info->find(leaf.get());
      if (it == info->end() || !it->second.captures_) continue;
      for (auto& capture : *it->second.captures_) {
        capture.DO_NOT_USE_DEPRECATED_register_capture_hook(std::make_unique<AccumulateIntoContext>(leaf, ctx_));
      }
    }
    return std::move(grads_);
  }

  // The engine starts a graph from a gradient for its root's input; this
  // root's input is a dummy.
  static const at::Tensor& trigger() {
    static const at::Tensor t = at::zeros({1});
    return t;
  }

 private:
  variable_list grads_;
  const std::vector<NodePtr> leaves_;
  Context& ctx_;
};

}  // namespace

std::map<RecvRpcBackward*, RecvGradients> runLocalPass(Context& ctx, const torch::autograd::edge_list& roots,
                                                      const variable_list& grads, bool keepGraph) {
  std::map<RecvRpcBackward*, RecvGradients> toSend;
  const auto outputs = outputsOf(roots);
  // Nothing to capture: the engine would otherwise run every node, leaves included.
  if (outputs.empty()) return toSend;
  std::vector<NodePtr> leaves;
  for (const auto& e : outputs) {
    if (dynamic_cast<AccumulateGrad*>(e.function.get())) leaves.push_back(e.function);
  }
  NodePtr root(c10::make_intrusive<PassRoot>(roots, grads, std::move(leaves), ctx));
  variable_list captured;
  {
    std::lock_guard<std::mutex> lock(ctx.passMutex());
    // torch::autograd::Engine's own execute, not the Python engine's override:
    // that one restores a failed Python node's error into the calling
    // thread's Python state and leaves it there, where a pool thread's next
    // Python call trips over it. The exception itself carries the error.
    auto& engine = torch::autograd::Engine::get_default_engine();
    captured = engine.Engine::execute({Edge(root, 0)}, {PassRoot::trigger()}, keepGraph, /*create_graph=*/false,
                                      /*accumulate_grad=*/false, outputs);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto* recv = dynamic_cast<RecvRpcBackward*>(outputs[i].function.get());
    if (!recv || !captured[i].defined()) continue;
    auto& entry = toSend[recv];
    if (!entry.node) {
      entry.node = outputs[i].function;
      entry.grads.resize(recv->num_inputs());
    }
    entry.grads[outputs[i].input_nr] = captured[i];
  }
  return toSend;
}

}  // namespace torchrpc::autograd
