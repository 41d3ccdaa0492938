#include "autograd/engine.h"

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "autograd/autograd_messages.h"
#include "autograd/context.h"
#include "autograd/local_pass.h"
#include "autograd/recorder.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/python_held.h"
#include "common/waiting_thread.h"
#include "common/when_all.h"
#include "message/payload.h"

namespace torchrpc::autograd {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

namespace {

const char* const kBackwardFunction = "torchrpc.autograd.backward";

std::atomic<uint64_t> endedByReports{0}, endedByResponses{0};

// ---- termination at the root ------------------------------------------------
//
// The root's backward() completes when every pass it caused is done. Each pass
// reports {its id, the ids of the passes its messages start} to the root (see
// engine.h). The root's Tracker notes, per pass id, "started" (a report named
// it as a child, or the root sent it) and "done" (its own report, or the
// response to the root's message). All passes are done when no id has exactly
// one of the two: a pass not done has an ancestor that is started but not
// done, whatever order the reports arrive in.
class Tracker {
 public:
  Tracker(int64_t rootPass, std::shared_ptr<common::WaitingThread> waiter)
      : future(c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get())), waiter(std::move(waiter)) {
    note(rootPass, kStarted);
    // A profiled backward() (thread-local RecordFunction callbacks): the
    // root's later passes, on pool threads, run under the caller's state, so
    // the profile shows them as upstream's does.
    if (at::hasThreadLocalCallbacks()) callerState = std::make_shared<at::ThreadLocalState>();
  }
  // The last reference may go on an I/O thread, and the state may hold Python
  // objects (modes, saved-tensor hooks): freed on rpc-drop.
  ~Tracker() {
    if (callerState) common::dropAside(std::move(callerState));
  }

  void report(const PassReport& r) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      note(r.passId, kDone);
      for (int64_t c : r.children) note(c, kStarted);
      if (open_ != 0) return;
    }
    finish(/*byReports=*/true);
  }

  // Ends the backward (once: reports and responses race to it).
  void finish(bool byReports) {
    if (ended_.exchange(true)) return;
    (byReports ? endedByReports : endedByResponses).fetch_add(1);
    future->markCompleted(c10::IValue());
  }
  void fail(std::exception_ptr error) {
    if (!ended_.exchange(true)) future->setError(std::move(error));
  }

  const FuturePtr future;
  // The thread that waits for this backward (backward()).
  const std::shared_ptr<common::WaitingThread> waiter;
  std::shared_ptr<at::ThreadLocalState> callerState;  // null unless profiled

 private:
  static constexpr uint8_t kStarted = 1, kDone = 2;
  void note(int64_t pass, uint8_t flag) {
    uint8_t& state = passes_[pass];
    const bool wasOpen = state == kStarted || state == kDone;
    state |= flag;
    const bool isOpen = state == kStarted || state == kDone;
    open_ += static_cast<int>(isOpen) - static_cast<int>(wasOpen);
  }

  std::mutex mutex_;
  std::unordered_map<int64_t, uint8_t> passes_;
  int open_{0};
  std::atomic<bool> ended_{false};
};

// The root's open backward() calls, by backward id.
struct Trackers {
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<Tracker>> byId;
  std::atomic<int64_t> nextId{0};

  static Trackers& get() {
    static Trackers instance;
    return instance;
  }

  std::shared_ptr<Tracker> find(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = byId.find(id);
    return it == byId.end() ? nullptr : it->second;
  }

  // Registers a new backward; it leaves the table when its future completes.
  void add(int64_t id, const std::shared_ptr<Tracker>& tracker) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      byId[id] = tracker;
    }
    tracker->future->addCallback([this, id](c10::ivalue::Future&) {
      std::lock_guard<std::mutex> lock(mutex);
      byId.erase(id);
    });
  }
};

// Reports of a backward that already ended (done, or failed) are dropped.
void reportToTracker(int64_t backwardId, const PassReport& report) {
  if (auto t = Trackers::get().find(backwardId)) t->report(report);
}

// Unique within a backward: the rank of the worker that sends the message,
// and a count.
int64_t nextPassId(int rank) {
  static std::atomic<int64_t> count{0};
  return (static_cast<int64_t>(rank) << 40) | (count.fetch_add(1) & ((int64_t{1} << 40) - 1));
}

// The pass being run: which backward it belongs to, and who asked for it.
struct PassInfo {
  int rootRank{-1};
  int64_t backwardId{-1};
  int64_t passId{-1};
  int callerRank{-1};  // the worker whose message started it (the root for the root's pass)
};

// Tells the root that `pass` is done (see runPass), unless the pass's response
// will: it answers the root and started nothing.
void reportPass(agent::Agent& agent, const PassInfo& pass, const PassReport& report) {
  const bool startedAny = !report.children.empty();
  const int self = agent.options().rank;
  if (self == pass.rootRank) {
    reportToTracker(pass.backwardId, report);
    return;
  }
  if (pass.callerRank == pass.rootRank && !startedAny) return;
  auto f = agent.send(pass.rootRank, passDoneMessage(pass.backwardId, report),
                      agent.options().defaultTimeoutSeconds, "distributed backward",
                      "report of backward #" + std::to_string(pass.backwardId));
  const std::string worker = agent.options().name;
  f->addCallback([worker](c10::ivalue::Future& done) {
    // The root still learns of the end through the responses; only later.
    if (done.hasError()) {
      TORCHRPC_DEBUG(worker, "a distributed backward's pass report failed: " << done.tryRetrieveErrorMessage());
    }
  });
}

// One local pass: accumulates the leaves' gradients into ctx and sends the
// receive nodes' gradients to their senders.
//
// Then it reports to the root: on the root itself, straight to its Tracker;
// else inside the last message it sends to the root, or, when it sends none,
// in an AUTOGRAD_PASS_DONE; a pass that the root asked for and that sends
// nothing reports with its response.
FuturePtr runPass(agent::Agent& agent, const std::shared_ptr<Context>& ctx,
                  const torch::autograd::edge_list& roots, const torch::autograd::variable_list& grads,
                  bool keepGraph, bool retainGraph, const PassInfo& pass) {
  auto toSend = runLocalPass(*ctx, roots, grads, keepGraph);
  const int self = agent.options().rank;
  PassReport report{pass.passId, {}};
  RecvRpcBackward* lastToRoot = nullptr;
  for (auto& kv : toSend) {
    report.children.push_back(nextPassId(self));
    if (kv.first->src == pass.rootRank && self != pass.rootRank) lastToRoot = kv.first;
  }
  // The root hears of the children before any of them can answer.
  if (self == pass.rootRank) reportPass(agent, pass, report);
  std::vector<FuturePtr> sent;
  size_t i = 0;
  for (auto& kv : toSend) {
    RecvRpcBackward* recv = kv.first;
    // The engine captured this node's gradients instead of running it: the
    // profile still shows it, as upstream's, where it sends them.
    RECORD_FUNCTION_WITH_SCOPE(at::RecordScope::BACKWARD_FUNCTION, recv->name(), std::vector<c10::IValue>());
    const int64_t child = report.children[i++];
    BackwardRequest request{ctx->id(), recv->sendId, retainGraph, std::move(kv.second.grads),
                            pass.rootRank, pass.backwardId, child, std::nullopt};
    if (recv == lastToRoot) request.report = report;
    auto f = agent.send(recv->src, backwardMessage(std::move(request)),
                        agent.options().defaultTimeoutSeconds, "distributed backward",
                        "context " + std::to_string(ctx->id()));
    if (self == pass.rootRank) {
      // On the root, a response means that pass is done (and all it caused).
      f->addCallback([backwardId = pass.backwardId, child](c10::ivalue::Future& done) {
        if (!done.hasError()) reportToTracker(backwardId, {child, {}});
      });
    }
    sent.push_back(std::move(f));
  }
  if (self != pass.rootRank && lastToRoot == nullptr) reportPass(agent, pass, report);
  return common::whenAll(std::move(sent));
}

void sendCleanup(agent::Agent& agent, const Context& ctx) {
  const std::string worker = agent.options().name;
  for (int rank : ctx.knownWorkers()) {
    message::Message m = cleanupMessage(ctx.id());
    auto f = agent.send(rank, std::move(m), agent.options().defaultTimeoutSeconds,
                        "release autograd context", "context " + std::to_string(ctx.id()));
    f->addCallback([worker](c10::ivalue::Future& done) {
      if (done.hasError()) {
        TORCHRPC_DEBUG(worker, "releasing an autograd context elsewhere failed: " << done.tryRetrieveErrorMessage());
      }
    });
  }
}

// What a failed AUTOGRAD_BACKWARD answers. A failure here (the local pass, or
// sending its gradients) says "Error on Node <rank>: ", as upstream's does; a
// later pass's failure already names its worker and is relayed as it came
// (an empty worker: the caller adds no "raised on" of its own).
message::RemoteException backwardFailure(const std::exception_ptr& error, int rank, const std::string& worker) {
  const common::ErrorParts parts = common::errorParts(error);
  if (parts.kind == common::ErrorKind::kRemote) {
    return message::RemoteException{parts.remoteType, parts.message, parts.remoteTraceback, kBackwardFunction, ""};
  }
  auto failure = message::describeException(error, kBackwardFunction, worker);
  failure.message = "Error on Node " + std::to_string(rank) + ": " + failure.message;
  return failure;
}

void replyWhenDone(const FuturePtr& done, const agent::Agent& agent, const message::Reply& reply) {
  done->addCallback([rank = agent.options().rank, worker = agent.options().name, reply](c10::ivalue::Future& f) {
    if (f.hasError()) {
      reply.error(backwardFailure(f.exception_ptr(), rank, worker));
    } else {
      reply.value(c10::IValue());
    }
  });
}

FuturePtr startBackward(agent::Agent& agent, message::Message&& request, int callerRank) {
  const std::string& worker = agent.options().name;
  BackwardRequest r = parseBackward(std::move(request));
  if (r.report) reportToTracker(r.backwardId, *r.report);
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
  PassInfo pass{r.rootRank, r.backwardId, r.passId, callerRank};
  std::shared_ptr<Tracker> tracker;
  if (r.rootRank == agent.options().rank) tracker = Trackers::get().find(r.backwardId);
  std::optional<at::ThreadLocalStateGuard> profiled;
  if (tracker && tracker->callerState) profiled.emplace(*tracker->callerState);
  return runPass(agent, ctx, roots, inputs, /*keepGraph=*/true, r.retainGraph, pass);
}

void onBackward(agent::Agent& agent, message::Message&& request, int callerRank, const message::Reply& reply) {
  FuturePtr done;
  try {
    done = startBackward(agent, std::move(request), callerRank);
  } catch (...) {
    reply.error(backwardFailure(std::current_exception(), agent.options().rank, agent.options().name));
    return;
  }
  replyWhenDone(done, agent, reply);
}

void onCleanup(agent::Agent& agent, message::Message&& request, int, const message::Reply& reply) {
  const int64_t contextId = parseCleanup(request);
  if (auto ctx = Container::get().release(contextId)) sendCleanup(agent, *ctx);
  reply.value(c10::IValue());
}

}  // namespace

void install(agent::Agent& agent) {
  Container::get().clear();
  Container::get().setRank(agent.options().rank);
  agent.addInterceptor(std::make_shared<Recorder>(agent.options().rank, agent.options().name));
  agent::Agent* a = &agent;  // handlers are owned by the agent: it outlives them
  // An exception a handler throws is its answer (Agent::serve).
  agent.setHandler(
      message::MessageType::kAutogradBackward,
      [a](message::Message&& request, int callerRank, message::Reply reply) { onBackward(*a, std::move(request), callerRank, reply); },
      kBackwardFunction);
  agent.setHandler(
      message::MessageType::kAutogradCleanup,
      [a](message::Message&& request, int callerRank, message::Reply reply) { onCleanup(*a, std::move(request), callerRank, reply); },
      "release autograd context");
  // A pass of a backward whose thread waits here runs on that thread, if it
  // is free (common/waiting_thread.h); otherwise on the pool, as any request.
  agent.setFastPath(message::MessageType::kAutogradBackward, [a](message::Message& request, int callerRank, const message::Reply& reply) {
    if (a->scopesPlainRequests()) return false;
    const auto root = peekBackwardRoot(request);
    if (!root || root->first != a->options().rank) return false;
    const auto tracker = Trackers::get().find(root->second);
    if (!tracker || !tracker->waiter) return false;
    return tracker->waiter->offer([&] {
      return [a, callerRank, request = std::move(request), reply]() mutable {
        a->serve(std::move(request), callerRank, std::move(reply));  // a plain request: no interceptor scopes it
      };
    });
  });
  // Reports are tiny and may end a backward(): answered on the I/O thread.
  agent.setFastPath(message::MessageType::kAutogradPassDone, [a](message::Message& request, int, const message::Reply& reply) {
    try {
      auto [backwardId, report] = parsePassDone(request);
      reportToTracker(backwardId, report);
      reply.value(c10::IValue());
    } catch (...) {
      reply.error(message::describeException(std::current_exception(), "AUTOGRAD_PASS_DONE", a->options().name));
    }
    return true;
  });
}

namespace {

FuturePtr beginBackward(agent::Agent& agent, int64_t contextId, const std::vector<at::Tensor>& roots,
                        bool retainGraph, std::shared_ptr<common::WaitingThread> waiter) {
  const std::string& worker = agent.options().name;
  auto ctx = Container::get().retrieve(contextId, worker);
  // RuntimeError with upstream's phrases, as torch.distributed.autograd.backward raises.
  TORCH_CHECK(!roots.empty(), "torchrpc.autograd.backward needs at least one root tensor "
              "(No tensors provided for gradient computation)");
  torch::autograd::edge_list edges;
  torch::autograd::variable_list grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& r = roots[i];
    TORCH_CHECK(r.defined() && r.requires_grad(), "torchrpc.autograd.backward: root #", i,
                " does not require grad, so no gradient can flow from it (requires_grad not set on root)");
    TORCH_CHECK(r.numel() == 1, "torchrpc.autograd.backward: root #", i, " has ", r.numel(),
                " elements; roots must be scalars (e.g. a loss); reduce it first, for example with .sum() "
                "(root #", i, " is not a scalar, all roots need to be scalar)");
    TORCH_CHECK(r.grad_fn(), "torchrpc.autograd.backward: root #", i, " is a leaf: no operation made it, "
                "so there is no graph to run backward through (root #", i,
                " does not have a valid gradient function)");
    edges.push_back(torch::autograd::impl::gradient_edge(r));
    grads.push_back(at::ones_like(r, LEGACY_CONTIGUOUS_MEMORY_FORMAT));
  }
  const int self = agent.options().rank;
  PassInfo pass{self, Trackers::get().nextId.fetch_add(1), nextPassId(self), self};
  auto tracker = std::make_shared<Tracker>(pass.passId, std::move(waiter));
  Trackers::get().add(pass.backwardId, tracker);
  // The responses still end the backward too: they carry the errors (a pass
  // that fails or a worker that dies never reports).
  FuturePtr responses;
  try {
    responses = runPass(agent, ctx, edges, grads, retainGraph, retainGraph, pass);
  } catch (...) {
    tracker->fail(std::current_exception());  // drops it from Trackers
    throw;
  }
  responses->addCallback([tracker](c10::ivalue::Future& f) {
    if (f.hasError()) {
      tracker->fail(f.exception_ptr());
    } else {
      tracker->finish(/*byReports=*/false);
    }
  });
  return tracker->future;
}

}  // namespace

FuturePtr backward(agent::Agent& agent, int64_t contextId, const std::vector<at::Tensor>& roots,
                   bool retainGraph, const std::function<void()>& onSleep) {
  auto waiter = std::make_shared<common::WaitingThread>(agent.options().name, kBackwardFunction);
  auto toPool = [&agent](common::WaitingThread::Task task) { agent.pool().run(std::move(task)); };
  FuturePtr done;
  try {
    done = beginBackward(agent, contextId, roots, retainGraph, waiter);
  } catch (...) {
    waiter->close(toPool);  // a pass another worker started meanwhile still runs
    throw;
  }
  waiter->serveUntil(*done, onSleep, toPool);
  return done;
}

std::pair<uint64_t, uint64_t> backwardEndings() {
  return {endedByReports.load(), endedByResponses.load()};
}

void releaseContext(agent::Agent& agent, int64_t contextId) {
  if (Container::currentId() == contextId) Container::setCurrentId(-1);
  if (auto ctx = Container::get().release(contextId)) sendCleanup(agent, *ctx);
}

}  // namespace torchrpc::autograd
