#include "autograd/engine.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <set>
#include <unordered_set>

#include "autograd/autograd_messages.h"
#include "autograd/context.h"
#include "autograd/recorder.h"
#include "common/error.h"
#include "common/logging.h"
#include "message/payload.h"

namespace torchrpc::autograd {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::Node;
using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

namespace {

const char* const kBackwardFunction = "torchrpc.autograd.backward";

FuturePtr completed() {
  auto f = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
  f->markCompleted(c10::IValue());
  return f;
}

// One future for many: None when all succeed, else the first error.
FuturePtr whenAll(std::vector<FuturePtr> futures) {
  if (futures.empty()) return completed();
  auto result = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
  c10::List<FuturePtr> list(c10::FutureType::create(c10::AnyType::get()));
  for (auto& f : futures) list.push_back(f);
  c10::collectAll(list)->addCallback([result, futures](c10::ivalue::Future&) {
    for (const auto& f : futures) {
      if (f->hasError()) {
        result->setErrorIfNeeded(f->exception_ptr());
        return;
      }
    }
    result->markCompleted(c10::IValue());
  });
  return result;
}

// The edges whose gradients a pass from `roots` must capture: leaves
// (AccumulateGrad) and receive nodes. The engine runs only the nodes on
// paths to them.
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

// One local pass: accumulates the leaves' gradients into ctx and sends the
// receive nodes' gradients to their senders.
FuturePtr runPass(Agent& agent, const std::shared_ptr<Context>& ctx,
                  const torch::autograd::edge_list& roots, const torch::autograd::variable_list& grads,
                  bool keepGraph, bool retainGraph) {
  auto outputs = outputsOf(roots);
  if (outputs.empty()) return completed();
  torch::autograd::variable_list captured;
  {
    std::lock_guard<std::mutex> lock(ctx->passMutex());
    captured = torch::autograd::Engine::get_default_engine().execute(
        roots, grads, keepGraph, /*create_graph=*/false, /*accumulate_grad=*/false, outputs);
  }
  std::map<RecvRpcBackward*, std::pair<c10::intrusive_ptr<Node>, std::vector<std::optional<at::Tensor>>>>
      toSend;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!captured[i].defined()) continue;
    Node* n = outputs[i].function.get();
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      ctx->accumulate(acc->variable, captured[i]);
      continue;
    }
    auto* recv = static_cast<RecvRpcBackward*>(n);
    auto& entry = toSend[recv];
    if (!entry.first) {
      entry.first = outputs[i].function;
      entry.second.resize(recv->num_inputs());
    }
    entry.second[outputs[i].input_nr] = captured[i];
  }
  std::vector<FuturePtr> sent;
  for (auto& kv : toSend) {
    RecvRpcBackward* recv = kv.first;
    Message m = backwardMessage({ctx->id(), recv->sendId, retainGraph, std::move(kv.second.second)});
    sent.push_back(agent.send(recv->src, std::move(m), agent.options().defaultTimeoutSeconds,
                              "distributed backward", "context " + std::to_string(ctx->id())));
  }
  return whenAll(std::move(sent));
}

void sendCleanup(Agent& agent, const Context& ctx) {
  const std::string worker = agent.options().name;
  for (int rank : ctx.knownWorkers()) {
    Message m = cleanupMessage(ctx.id());
    auto f = agent.send(rank, std::move(m), agent.options().defaultTimeoutSeconds,
                        "release autograd context", "context " + std::to_string(ctx.id()));
    f->addCallback([worker](c10::ivalue::Future& done) {
      if (done.hasError()) {
        TORCHRPC_DEBUG(worker, "releasing an autograd context elsewhere failed: " << done.tryRetrieveErrorMessage());
      }
    });
  }
}

void respondWhenDone(const FuturePtr& done, uint64_t id, const std::string& worker,
                     Agent::Responder respond) {
  done->addCallback([id, worker, respond = std::move(respond)](c10::ivalue::Future& f) {
    if (f.hasError()) {
      respond(exceptionMessage(id, describeException(f.exception_ptr(), kBackwardFunction, worker)));
    } else {
      respond(ivalueMessage(MessageType::kScriptRet, id, c10::IValue()));
    }
  });
}

void onBackward(Agent& agent, Message&& request, Agent::Responder respond) {
  const std::string& worker = agent.options().name;
  const uint64_t id = request.id;
  BackwardRequest r = parseBackward(std::move(request));
  auto ctx = Container::get().retrieve(r.contextId, worker);
  auto send = ctx->send(r.sendId);
  TORCH_CHECK(send, "distributed autograd context ", r.contextId, " on ", worker,
              " has no send function #", r.sendId);
  TORCH_CHECK(r.grads.size() == send->num_inputs(), "AUTOGRAD_BACKWARD brought ", r.grads.size(),
              " gradients for send function #", r.sendId, ", which sent ", send->num_inputs(), " tensors");
  torch::autograd::edge_list roots;
  torch::autograd::variable_list inputs;
  for (size_t i = 0; i < r.grads.size(); ++i) {
    if (!r.grads[i]) continue;
    roots.emplace_back(send, static_cast<uint32_t>(i));
    inputs.push_back(std::move(*r.grads[i]));
  }
  respondWhenDone(runPass(agent, ctx, roots, inputs, /*keepGraph=*/true, r.retainGraph), id, worker,
                  std::move(respond));
}

void onCleanup(Agent& agent, Message&& request, Agent::Responder respond) {
  const int64_t contextId = parseCleanup(request);
  if (auto ctx = Container::get().release(contextId)) sendCleanup(agent, *ctx);
  respond(ivalueMessage(MessageType::kScriptRet, request.id, c10::IValue()));
}

}  // namespace

void install(Agent& agent) {
  Container::get().clear();
  Container::get().setRank(agent.options().rank);
  agent.setInterceptor(std::make_shared<Recorder>(agent.options().rank, agent.options().name));
  Agent* a = &agent;  // handlers are owned by the agent: it outlives them
  auto guarded = [a](void (*fn)(Agent&, Message&&, Agent::Responder), const char* what) {
    return [a, fn, what](Message&& request, int, Agent::Responder respond) {
      const uint64_t id = request.id;
      try {
        fn(*a, std::move(request), respond);
      } catch (...) {
        respond(exceptionMessage(id, describeException(std::current_exception(), what, a->options().name)));
      }
    };
  };
  agent.setHandler(MessageType::kAutogradBackward, guarded(&onBackward, kBackwardFunction));
  agent.setHandler(MessageType::kAutogradCleanup, guarded(&onCleanup, "release autograd context"));
}

FuturePtr backward(Agent& agent, int64_t contextId, const std::vector<at::Tensor>& roots,
                   bool retainGraph) {
  const std::string& worker = agent.options().name;
  auto ctx = Container::get().retrieve(contextId, worker);
  TORCH_CHECK_VALUE(!roots.empty(), "torchrpc.autograd.backward needs at least one root tensor");
  torch::autograd::edge_list edges;
  torch::autograd::variable_list grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& r = roots[i];
    TORCH_CHECK_VALUE(r.defined() && r.requires_grad(), "torchrpc.autograd.backward: root #", i,
                      " does not require grad, so no gradient can flow from it");
    TORCH_CHECK_VALUE(r.numel() == 1, "torchrpc.autograd.backward: root #", i,
                      " has ", r.numel(), " elements; roots must be scalars (e.g. a loss); "
                      "reduce it first, for example with .sum()");
    edges.push_back(torch::autograd::impl::gradient_edge(r));
    grads.push_back(at::ones_like(r, LEGACY_CONTIGUOUS_MEMORY_FORMAT));
  }
  return runPass(agent, ctx, edges, grads, retainGraph, retainGraph);
}

void releaseContext(Agent& agent, int64_t contextId) {
  if (Container::currentId() == contextId) Container::setCurrentId(-1);
  if (auto ctx = Container::get().release(contextId)) sendCleanup(agent, *ctx);
}

}  // namespace torchrpc::autograd
