#pragma once

// Distributed autograd contexts.
//
// A Context is one `with torchrpc.autograd.context()` block, seen from one
// worker: the send functions this worker recorded (by id, for the backward
// messages that will name them), the workers it sent requests to (they learn
// of the release through it), and the gradients its leaves accumulated.
//
// The gradients live in a torch::distributed::autograd::DistAutogradContext
// (libtorch's own, used here only as the store): torch code that runs inside a
// backward pass and looks for "the current distributed autograd context", as
// DDP's Reducer does to average gradients, finds this one (local_pass.h sets it
// while leaves accumulate), and accumulation follows torch's rules (a gradient
// nobody else holds is kept without a copy, layouts as AccumulateGrad). The
// worker that opens the block creates the context; the others create theirs,
// with the same id, when the first request of that context reaches them.
//
// Container: the contexts of this process and the current context of each
// thread (thread-local: the `with` block's thread, and the pool thread that
// runs a request of a context, see recorder.h). While it holds any context,
// the process's waits poll for longer (setTrainingSpin, common/spin.h).

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/autograd/context/context.h>

#include <cstdint>
#include <memory>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autograd/rpc_functions.h"

namespace torchrpc::autograd {

class Context {
 public:
  explicit Context(int64_t id)
      : id_(id), store_(std::make_shared<torch::distributed::autograd::DistAutogradContext>(id)) {}
  int64_t id() const { return id_; }

  // Forward pass.
  int64_t addSend(c10::intrusive_ptr<SendRpcBackward> send);
  c10::intrusive_ptr<SendRpcBackward> send(int64_t sendId) const;  // null if unknown
  // A receive function made for a request or response of this context (kept
  // until the context is released, as upstream keeps them).
  void addRecv(c10::intrusive_ptr<RecvRpcBackward> recv);
  void addKnownWorker(int rank);
  std::set<int> knownWorkers() const;

  // What this context recorded, for inspection (torchrpc.autograd._retrieve_context):
  // send and receive functions by id, in the order they were made.
  struct Graph {
    std::vector<std::pair<int64_t, c10::intrusive_ptr<torch::autograd::Node>>> sends, recvs;
    std::set<int> knownWorkers;
  };
  Graph graph() const;

  // Backward pass. One local pass at a time per context (passMutex), so that
  // gradients accumulate in order.
  std::mutex& passMutex() { return passMutex_; }
  // Adds `grad` to the leaf's gradient as torch's AccumulateGrad does:
  // without a copy when `grad` has no more than `expectedRefs` references
  // (they are the caller's), else a copy that follows the leaf's layout.
  void accumulate(const at::Tensor& leaf, const at::Tensor& grad, size_t expectedRefs);
  // The store of the gradients (see above), for torch code that looks for
  // the current context.
  const std::shared_ptr<torch::distributed::autograd::DistAutogradContext>& store() const { return store_; }
  // The gradient accumulated for `leaf`, if any.
  std::optional<at::Tensor> gradientOf(const at::Tensor& leaf) const;
  // (leaf, accumulated gradient) pairs.
  std::vector<std::pair<at::Tensor, at::Tensor>> gradients() const;

 private:
  const int64_t id_;
  mutable std::mutex mutex_;
  int64_t nextSendId_{0};
  std::unordered_map<int64_t, c10::intrusive_ptr<SendRpcBackward>> sends_;
  std::vector<c10::intrusive_ptr<RecvRpcBackward>> recvs_;
  std::set<int> knownWorkers_;
  const std::shared_ptr<torch::distributed::autograd::DistAutogradContext> store_;
  std::mutex passMutex_;
};

class Container {
 public:
  // Contexts one peer's requests may have made here and not released yet.
  static constexpr size_t kMaxContextsPerPeer = 4096;

  static Container& get();

  // The worker's rank; context ids are (rank << 48) + a counter.
  void setRank(int rank);
  // A new context, current on this thread. Throws if the thread has one.
  std::shared_ptr<Context> create();
  // The context with this id, created for peer `src`'s request if this
  // worker has not seen it yet; null if it was released here already (a
  // request that arrives after the context's cleanup message must not bring
  // it back: nothing would release it again). Throws, naming the cap, if
  // `src` made kMaxContextsPerPeer live contexts here already.
  std::shared_ptr<Context> getOrCreate(int64_t id, int src);
  // Null if unknown (never seen, or released).
  std::shared_ptr<Context> find(int64_t id) const;
  // Throws a clear error naming the worker if unknown.
  std::shared_ptr<Context> retrieve(int64_t id, const std::string& worker) const;
  // Removes it and remembers it as released; returns it (null if it was not there).
  std::shared_ptr<Context> release(int64_t id);
  // Peer `rank` is gone: releases the contexts its requests made here and
  // those it opened (their cleanup would come from it); returns how many.
  size_t releasePeer(int rank);
  std::vector<int64_t> liveIds() const;
  void clear();

  // This thread's context id, or -1.
  static int64_t currentId();
  static void setCurrentId(int64_t id);

 private:
  mutable std::mutex mutex_;
  int64_t rankPrefix_{0};
  int64_t next_{0};
  std::unordered_map<int64_t, std::shared_ptr<Context>> contexts_;
  // Contexts made for a peer's request: id -> that peer, and the count per peer.
  std::unordered_map<int64_t, int> madeFor_;
  std::unordered_map<int, size_t> madePerPeer_;
  // The ids released most recently (bounded), in release order.
  std::deque<int64_t> releasedOrder_;
  std::unordered_set<int64_t> released_;

  // Forgets that `id` was made for a peer; mutex_ held.
  void uncountLocked(int64_t id);
};

// Makes `id` the thread's current context for a scope.
class CurrentContextGuard {
 public:
  explicit CurrentContextGuard(int64_t id) : previous_(Container::currentId()) {
    Container::setCurrentId(id);
  }
  ~CurrentContextGuard() { Container::setCurrentId(previous_); }
  CurrentContextGuard(const CurrentContextGuard&) = delete;
  CurrentContextGuard& operator=(const CurrentContextGuard&) = delete;

 private:
  int64_t previous_;
};

}  // namespace torchrpc::autograd
