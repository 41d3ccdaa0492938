#include "autograd/context.h"

#include <algorithm>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include "common/python_held.h"
#include "common/spin.h"

namespace torchrpc::autograd {

namespace {
thread_local int64_t currentContextId = -1;
constexpr size_t kRememberReleased = 4096;
}  // namespace

int64_t Context::addSend(c10::intrusive_ptr<SendRpcBackward> send) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t id = nextSendId_++;
  sends_.emplace(id, std::move(send));
  return id;
}

c10::intrusive_ptr<SendRpcBackward> Context::send(int64_t sendId) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sends_.find(sendId);
  return it == sends_.end() ? nullptr : it->second;
}

void Context::addRecv(c10::intrusive_ptr<RecvRpcBackward> recv) {
  std::lock_guard<std::mutex> lock(mutex_);
  recvs_.push_back(std::move(recv));
}

Context::Graph Context::graph() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Graph g;
  for (const auto& [id, send] : sends_) g.sends.emplace_back(id, send);
  std::sort(g.sends.begin(), g.sends.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < recvs_.size(); ++i) g.recvs.emplace_back(static_cast<int64_t>(i), recvs_[i]);
  g.knownWorkers = knownWorkers_;
  return g;
}

void Context::addKnownWorker(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  knownWorkers_.insert(rank);
}

std::set<int> Context::knownWorkers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return knownWorkers_;
}

void Context::accumulate(const at::Tensor& leaf, const at::Tensor& grad, size_t expectedRefs) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A c10::Dict is a handle: this one is the store's own map. Writers of the
  // map are this function and torch's DistAutogradContext (on the thread of
  // the pass that holds passMutex_), never at once.
  auto grads = store_->getGradients();
  at::Tensor old;
  auto it = grads.find(leaf);
  if (it != grads.end()) old = it->value();
  at::AutoGradMode noGraph(false);  // the gradient must not keep the backward graph that made it
  torch::autograd::AccumulateGrad::accumulateGrad(leaf, old, grad, expectedRefs, [&](at::Tensor&& updated) {
    grads.insert_or_assign(leaf, std::move(updated));
  });
}

std::optional<at::Tensor> Context::gradientOf(const at::Tensor& leaf) const {
  auto grads = store_->getGradients();
  auto it = grads.find(leaf);
  if (it == grads.end()) return std::nullopt;
  return it->value();
}

std::vector<std::pair<at::Tensor, at::Tensor>> Context::gradients() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (const auto& kv : store_->getGradients()) out.emplace_back(kv.key(), kv.value());
  return out;
}

Container& Container::get() {
  static Container* container = new Container();  // never destroyed: threads may outlive main
  return *container;
}

void Container::setRank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  rankPrefix_ = static_cast<int64_t>(rank) << 48;
}

std::shared_ptr<Context> Container::create() {
  TORCH_CHECK(currentContextId == -1, "this thread is already in distributed autograd context ",
              currentContextId, "; torchrpc.autograd.context() blocks cannot be nested "
              "(Already have an autograd context id for this thread)");
  auto ctx = std::make_shared<Context>([&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return rankPrefix_ + next_++;
  }());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    contexts_.emplace(ctx->id(), ctx);
    common::setTrainingSpin(true);
  }
  currentContextId = ctx->id();
  return ctx;
}

std::shared_ptr<Context> Container::getOrCreate(int64_t id, int src) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (released_.count(id)) return nullptr;
  auto it = contexts_.find(id);
  if (it != contexts_.end()) return it->second;
  size_t& made = madePerPeer_[src];
  TORCH_CHECK(made < kMaxContextsPerPeer, "distributed autograd context ", id, " cannot be created: rank ", src,
              " already has ", made, " live contexts on this worker (the cap is ", kMaxContextsPerPeer,
              " per peer); end `with torchrpc.autograd.context()` blocks, which releases them");
  ++made;
  madeFor_[id] = src;
  auto& slot = contexts_[id];
  slot = std::make_shared<Context>(id);
  common::setTrainingSpin(true);
  return slot;
}

void Container::uncountLocked(int64_t id) {
  auto it = madeFor_.find(id);
  if (it == madeFor_.end()) return;
  auto count = madePerPeer_.find(it->second);
  if (count != madePerPeer_.end() && --count->second == 0) madePerPeer_.erase(count);
  madeFor_.erase(it);
}

size_t Container::releasePeer(int rank) {
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, src] : madeFor_) {
      if (src == rank) ids.push_back(id);
    }
    for (const auto& kv : contexts_) {
      const auto made = madeFor_.find(kv.first);
      const bool counted = made != madeFor_.end() && made->second == rank;  // listed above
      if ((kv.first >> 48) == rank && !counted) ids.push_back(kv.first);
    }
  }
  size_t released = 0;
  // Dropped unlocked, on the rpc-drop thread: PeerWatch's timer thread runs
  // this and must not wait for the GIL, which a gradient Python holds takes.
  for (int64_t id : ids) {
    if (auto ctx = release(id)) {
      ++released;
      common::dropAside(std::move(ctx));
    }
  }
  return released;
}

std::shared_ptr<Context> Container::find(int64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

std::shared_ptr<Context> Container::retrieve(int64_t id, const std::string& worker) const {
  auto ctx = find(id);
  // RuntimeError with upstream's phrase, as torch.distributed.autograd raises.
  TORCH_CHECK(ctx, "distributed autograd context ", id, " does not exist on ", worker,
              ": it was released (its `with torchrpc.autograd.context()` block ended), "
              "or this worker took no part in it (Could not find autograd context with id: ", id, ")");
  return ctx;
}

std::shared_ptr<Context> Container::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (released_.insert(id).second) {
    releasedOrder_.push_back(id);
    if (releasedOrder_.size() > kRememberReleased) {
      released_.erase(releasedOrder_.front());
      releasedOrder_.pop_front();
    }
  }
  uncountLocked(id);
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return nullptr;
  auto ctx = std::move(it->second);
  contexts_.erase(it);
  common::setTrainingSpin(!contexts_.empty());
  return ctx;
}

std::vector<int64_t> Container::liveIds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> ids;
  for (const auto& kv : contexts_) ids.push_back(kv.first);
  return ids;
}

void Container::clear() {
  std::unordered_map<int64_t, std::shared_ptr<Context>> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  dropped.swap(contexts_);
  madeFor_.clear();
  madePerPeer_.clear();
  common::setTrainingSpin(false);
  released_.clear();
  releasedOrder_.clear();
  next_ = 0;
}

int64_t Container::currentId() { return currentContextId; }
void Container::setCurrentId(int64_t id) { currentContextId = id; }

}  // namespace torchrpc::autograd
