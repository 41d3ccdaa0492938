#include "optim/optimizer.h"

#include <ATen/core/function.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "agent/agent.h"
#include "autograd/context.h"

namespace torchrpc::optim {

namespace {

struct Registered {
  c10::intrusive_ptr<c10::ivalue::Object> optimizer;
  std::vector<at::Tensor> params;
};

std::mutex registryMutex;
std::unordered_map<int64_t, std::shared_ptr<Registered>> registry;
int64_t nextId = 0;
std::mutex stepMutex;  // one step at a time on this worker

std::string workerName() {
  auto agent = agent::Agent::current();
  return agent ? agent->options().name : std::string("this worker");
}

}  // namespace

int64_t registerOptimizer(c10::intrusive_ptr<c10::ivalue::Object> optimizer,
                          std::vector<at::Tensor> params) {
  TORCH_CHECK(optimizer->type()->findMethod("step"),
              "a functional optimizer needs a step(gradients) method; ",
              optimizer->type()->repr_str(), " has none");
  std::lock_guard<std::mutex> lock(registryMutex);
  int64_t id = nextId++;
  registry.emplace(id, std::make_shared<Registered>(Registered{std::move(optimizer), std::move(params)}));
  return id;
}

void unregisterOptimizer(int64_t id) {
  std::shared_ptr<Registered> dropped;
  std::lock_guard<std::mutex> lock(registryMutex);
  auto it = registry.find(id);
  if (it == registry.end()) return;
  dropped = std::move(it->second);
  registry.erase(it);
}

void step(int64_t id, int64_t contextId) {
  std::shared_ptr<Registered> opt;
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    auto it = registry.find(id);
    TORCH_CHECK_VALUE(it != registry.end(), "no optimizer #", id, " on ", workerName(),
                      ": its DistributedOptimizer was deleted");
    opt = it->second;
  }
  auto ctx = autograd::Container::get().retrieve(contextId, workerName());
  c10::List<std::optional<at::Tensor>> grads;
  for (const auto& p : opt->params) grads.push_back(ctx->gradientOf(p));
  std::lock_guard<std::mutex> lock(stepMutex);
  torch::jit::Stack stack{c10::IValue(opt->optimizer), c10::IValue(std::move(grads))};
  opt->optimizer->type()->getMethod("step").run(stack);
}

TORCH_LIBRARY_FRAGMENT(torchrpc, m) {
  m.def("optimizer_step(int optimizer_id, int context_id) -> ()", &step);
}

}  // namespace torchrpc::optim
