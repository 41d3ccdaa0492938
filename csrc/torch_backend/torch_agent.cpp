#include "torch_backend/torch_agent.h"

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/distributed/rpc/utils.h>

#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/error.h"
#include "message/payload.h"
#include "torch_backend/envelope.h"
#include "worker/worker.h"

namespace torchrpc::torch_backend {

namespace {

// What the TORCH_REQUEST handler does, in the errors of a request it cannot read.
constexpr const char* kServes = "a torch.distributed.rpc request";

using Clock = std::chrono::steady_clock;

// join() and sync() with no bound, and an agent started with rpc_timeout 0
// (no timeout): every wait still ends.
constexpr double kLongestWaitSeconds = 1800.0;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double secondsLeft(Clock::time_point deadline) {
  return std::max(0.001, std::chrono::duration<double>(deadline - Clock::now()).count());
}

// Answers `reply` with what upstream's callback produced for request `id`:
// its response, or its error as upstream's EXCEPTION message. Never throws.
void respond(upstream::JitFuture& result, uint64_t id, const message::Reply& reply, const std::string& worker) {
  try {
    c10::intrusive_ptr<upstream::Message> response =
        result.hasError() ? upstream::createExceptionResponse(result.tryRetrieveErrorMessage(), static_cast<int64_t>(id))
                          : result.value().toCustomClass<upstream::Message>();
    response->setId(static_cast<int64_t>(id));
    reply.message(wrap(message::MessageType::kTorchResponse, *response, id));
  } catch (...) {
    reply.error(message::describeException(std::current_exception(), "sending the response", worker));
  }
}

// The text of upstream's future error for a torchrpc call that failed.
std::string upstreamError(const std::exception_ptr& error) {
  common::ErrorParts parts = common::errorParts(error);
  if (parts.kind != common::ErrorKind::kTimeout) return parts.message;
  // Upstream's error type: its RRefs check it. The message already says
  // upstream's phrase ("RPC ran for more than set timeout", agent/pending.cpp).
  return upstream::makeRPCError(parts.message, upstream::RPCErrorType::TIMEOUT);
}

// Whether upstream's callback runs Python for a request of this type (its
// UDF, or the pickling of a Python RRef's value).
bool runsPython(upstream::MessageType type) {
  using T = upstream::MessageType;
  return type == T::PYTHON_CALL || type == T::PYTHON_REMOTE_CALL || type == T::PYTHON_RREF_FETCH_CALL;
}

}  // namespace

TorchAgent::TorchAgent(c10::intrusive_ptr<c10d::Store> store, agent::AgentOptions options,
                       std::unique_ptr<upstream::RequestCallback> callback, PythonHooks python)
    : RpcAgent(upstream::WorkerInfo(options.name, static_cast<upstream::worker_id_t>(options.rank)),
               std::move(callback),
               std::chrono::milliseconds(static_cast<int64_t>(options.defaultTimeoutSeconds * 1000))),
      name_(options.name),
      startTimeoutSeconds_(options.defaultTimeoutSeconds),
      python_(std::move(python)),
      inlineCalls_(python_.scriptFunction),
      serverStats_(std::make_shared<ServerStats>()) {
  TORCH_CHECK_VALUE(options.worldSize <= 0 || (options.rank >= 0 && options.rank < options.worldSize), "rank ",
                    options.rank, " is not in [0, world_size=", options.worldSize, ")");
  if (options.hostId.empty()) options.hostId = worker::localHostId();
  rendezvous_ = std::make_unique<rendezvous::Rendezvous>(std::move(store), options.rank, options.worldSize);
  if (!rendezvous_->dynamic()) rendezvous_->claimKind();  // a dynamic job's worker claims it as it joins
  options.secret = rendezvous_->sharedSecret(options.secret);
  agent_ = std::make_shared<agent::Agent>(options);
  try {
    auto [tcp, unixAddr] = agent_->listen();
    tcpAddress_ = tcp;
    agent::PeerInfo me{options.name, options.rank, tcp, unixAddr, options.hostId};
    if (rendezvous_->dynamic()) {
      membership_ = std::make_unique<worker::Membership>(agent_, *rendezvous_);
      agent_->setPeers(membership_->enter(me));
      membership_->install();
    } else {
      agent_->setPeers(rendezvous_->exchange(me));
    }
    agent_->setHandler(
        message::MessageType::kTorchRequest,
        [this](message::Message&& request, int, message::Reply reply) { serve(std::move(request), std::move(reply)); },
        kServes);
    agent_->setFastPath(message::MessageType::kTorchRequest,
                        [this](message::Message& request, int, const message::Reply& reply) {
                          return serveCandidate(request, reply);
                        });
    // A dynamic job's worker that died never leaves: the members drop it, so calls to it say so.
    peerWatch_ = worker::PeerWatch::create(agent_, [agent = std::weak_ptr<agent::Agent>(agent_)](int rank) {
      auto a = agent.lock();
      if (a && a->members().dynamic()) {
        a->removePeer(rank, "stopped without leaving the job (its connection was lost and it cannot be reached)");
      }
    });
  } catch (...) {
    agent_->shutdown();
    membership_.reset();  // gives the membership token back
    throw;
  }
}

TorchAgent::~TorchAgent() { shutdown(); }

void TorchAgent::startImpl() {
  // Upstream set its type resolver (a TorchScript type parser, which recurses
  // once per level of a type tag) just before start(): it now parses only
  // tags that message::requireTypeTag passes.
  if (auto upstreams = getTypeResolver()) {
    setTypeResolver(std::make_shared<upstream::TypeResolver>([upstreams](const c10::QualifiedName& name) {
      message::requireTypeTag(name.qualifiedName());
      return (*upstreams)(name);
    }));
  }
  agent_->startServing();
  if (membership_) membership_->announce(defaultWaitSeconds());
}

void TorchAgent::shutdownImpl() {
  if (stopped_.exchange(true)) return;
  peerWatch_->stop();
  // Fails what is pending (their futures complete on the pool before it stops).
  agent_->shutdown();
}

c10::intrusive_ptr<upstream::JitFuture> TorchAgent::send(const upstream::WorkerInfo& to,
                                                         c10::intrusive_ptr<upstream::Message> message,
                                                         const float rpcTimeoutSeconds,
                                                         const upstream::DeviceMap& deviceMap) {
  const std::string what = upstreamTypeName(message->type());
  TORCH_CHECK(message->isRequest(), "TorchAgent::send sends requests only; got ", what, " to ", to.name_);
  TORCH_CHECK(deviceMap.empty(), "rpc ", name_, " -> ", to.name_, " '", what,
              "': the TORCHRPC backend sends CPU tensors only, so it takes no device map");
  TORCH_CHECK(rpcAgentRunning_.load(), "rpc ", name_, " -> ", to.name_, " '", what,
              "': RPC is no longer running on ", name_, " (the TORCHRPC agent is shut down)");
  const double timeout = rpcTimeoutSeconds == upstream::kUnsetRpcTimeout
                             ? static_cast<double>(getRpcTimeout().count()) / 1000.0
                             : static_cast<double>(rpcTimeoutSeconds);
  if (python_.sending) python_.sending();
  auto out = c10::make_intrusive<upstream::JitFuture>(at::AnyClassType::get());
  {
    std::lock_guard<std::mutex> lock(callsMutex_);
    ++clientCalls_;
  }
  auto in = agent_->send(to.id_, wrap(message::MessageType::kTorchRequest, *message), timeout, "rpc", what);
  if (in->completed()) {  // refused before sending: the caller's thread completes it
    complete(*out, *in);
    return out;
  }
  in->addCallback([this, out, waiter = SyncWait::takeFor(out)](c10::ivalue::Future& done) mutable {
    // This runs on the I/O thread, the deadline sweeper, or a pool thread
    // that holds the loop's turn (transport/loop.h pollOnce): upstream's
    // callbacks run user code, which must not stall reading, so always on
    // another thread: the rpc_sync's caller if it waits for it, else the
    // pool. `out` moves there: once Python took its value and let go of it,
    // its last reference must not be dropped here.
    auto result = c10::intrusive_ptr<c10::ivalue::Future>::reclaim_copy(&done);
    if (waiter && waiter->offer([&] {
          return [this, out = std::move(out), result] { complete(*out, *result); };
        })) {
      return;
    }
    agent_->pool().run([this, out = std::move(out), result] { complete(*out, *result); });
  });
  return out;
}

void TorchAgent::complete(upstream::JitFuture& out, c10::ivalue::Future& in) {
  if (python_.onPoolThread) python_.onPoolThread();  // upstream's callbacks take the GIL
  try {
    if (in.hasError()) {
      out.setErrorIfNeeded(std::make_exception_ptr(std::runtime_error(upstreamError(in.exception_ptr()))));
    } else {
      c10::intrusive_ptr<upstream::Message> response = unwrapResponse(in.value());
      if (response->type() == upstream::MessageType::EXCEPTION) {
        const auto& text = response->payload();
        out.setErrorIfNeeded(std::make_exception_ptr(std::runtime_error(std::string(text.begin(), text.end()))));
      } else {
        auto storages = response->getStorages();
        out.markCompleted(c10::IValue(std::move(response)), std::move(storages));
      }
    }
  } catch (...) {
    out.setErrorIfNeeded(std::current_exception());
  }
  callDone();
}

void TorchAgent::callDone() {
  std::lock_guard<std::mutex> lock(callsMutex_);
  if (--clientCalls_ == 0) callsDone_.notify_all();
}

void TorchAgent::serve(message::Message&& request, message::Reply reply) {
  if (python_.onPoolThread) python_.onPoolThread();
  const uint64_t id = request.id;
  c10::intrusive_ptr<upstream::Message> m = unwrapRequest(std::move(request));  // a throw: the agent answers it
  process(*m, id, reply);
}

bool TorchAgent::serveCandidate(message::Message& request, const message::Reply& reply) {
  if (!InlineScriptCalls::candidate(request)) return false;
  const uint64_t id = request.id;
  try {  // nothing escapes the I/O thread
    c10::intrusive_ptr<upstream::Message> m = unwrapRequest(std::move(request));
    auto seen = inlineCalls_.see(*m);
    if (seen.runsHere()) {
      script_dispatch::countInlineCall();
      processScriptCall(*m, id, reply, seen);
      return true;
    }
    agent_->pool().run([this, m = std::move(m), id, reply, seen = std::move(seen)]() mutable {
      if (python_.onPoolThread) python_.onPoolThread();
      seen.callee = inlineCalls_.made(seen, *m);
      processScriptCall(*m, id, reply, seen);
    });
  } catch (...) {
    if (!reply.answered()) reply.error(message::describeException(std::current_exception(), kServes, name_));
  }
  return true;
}

void TorchAgent::processScriptCall(upstream::Message& request, uint64_t id, const message::Reply& reply,
                                   InlineScriptCalls::Sighting& seen) {
  ++serverStats_->calls;
  auto response = inlineCalls_.run(seen);
  if (response) {
    response->setId(static_cast<int64_t>(id));
    reply.message(wrap(message::MessageType::kTorchResponse, *response, id));
  }
  --serverStats_->calls;
  if (!response) process(request, id, reply);
}

void TorchAgent::process(upstream::Message& request, uint64_t id, const message::Reply& reply) {
  request.setId(static_cast<int64_t>(id));
  // A profiled request (RUN_WITH_PROFILING_REQ, always the outermost
  // wrapper) leaves its profiler callback on the thread when the call
  // completes at once; pool threads are reused (the hot one especially), so
  // each later request would record every op once more, and no caller could
  // read its events. The thread gets its state back afterwards. Every other
  // request restores what it sets (upstream's guards): saving the whole
  // state for those cost about a tenth of a tiny call.
  std::optional<at::ThreadLocalStateGuard> isolated;
  if (request.type() == upstream::MessageType::RUN_WITH_PROFILING_REQ) isolated.emplace(at::ThreadLocalState());
  auto stats = serverStats_;  // a late callback may outlive this agent
  ++stats->calls;
  c10::intrusive_ptr<upstream::JitFuture> result;
  try {
    auto run = [&] { result = (*cb_)(request, {}); };
    if (runsPython(request.type()) && python_.inPythonTurn) {
      python_.inPythonTurn(run);
    } else {
      run();
    }
  } catch (const std::exception& e) {
    --stats->calls;
    reply.message(
        wrap(message::MessageType::kTorchResponse, *upstream::createExceptionResponse(e, static_cast<int64_t>(id)), id));
    return;
  }
  if (result->completed()) {
    --stats->calls;
    respond(*result, id, reply, name_);
    return;
  }
  ++stats->asyncCalls;
  result->addCallback([stats, id, reply, worker = name_](upstream::JitFuture& done) {
    --stats->asyncCalls;
    --stats->calls;
    respond(done, id, reply, worker);
  });
}

bool TorchAgent::waitCalls(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(callsMutex_);
  return callsDone_.wait_until(lock, deadline, [this] { return clientCalls_ == 0; });
}

int64_t TorchAgent::clientCalls() {
  std::lock_guard<std::mutex> lock(callsMutex_);
  return clientCalls_;
}

double TorchAgent::defaultWaitSeconds() const {
  return startTimeoutSeconds_ > 0 ? startTimeoutSeconds_ : kLongestWaitSeconds;
}

std::string TorchAgent::workerLabel(int rank) const {
  auto peer = agent_->members().find(rank);
  return peer ? peer->name + " (rank " + std::to_string(rank) + ")" : "rank " + std::to_string(rank);
}

void TorchAgent::join(bool shutdown, float timeout) {
  const double seconds = timeout > 0 ? timeout : defaultWaitSeconds();
  const std::string limit = common::secondsText(seconds) + " s";
  const auto deadline = after(seconds);
  if (!isStaticGroup()) {  // no meeting: each worker of a dynamic job leaves on its own
    TORCH_CHECK(waitCalls(deadline), "join on ", name_, ": ", clientCalls(), " call(s) still in flight after ", limit);
    if (shutdown) leave(deadline, limit);
    return;
  }
  const std::string tag = "torch-backend/join/" + std::to_string(meetings_++);
  auto gone = [watch = peerWatch_](int rank) { return watch->gone(rank); };
  std::set<int> dead;  // workers the meetings went on without
  try {
    for (int round = 0;; ++round) {
      TORCH_CHECK(waitCalls(deadline), clientCalls(), " call(s) of ", name_, " still in flight after ", limit);
      auto tally = rendezvous_->tally(tag + "/" + std::to_string(round), clientCalls(), secondsLeft(deadline), gone);
      dead.insert(tally.gone.begin(), tally.gone.end());
      if (tally.sum == 0) break;
    }
    // Nobody stops serving while another worker may still count a call.
    if (shutdown) {
      auto late = rendezvous_->barrier(tag + "/done", secondsLeft(deadline), gone);
      dead.insert(late.begin(), late.end());
      if (agent_->options().rank == 0) rendezvous_->releaseKind();  // everyone left the store
    }
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "join on ", name_, " did not finish within ", limit, " (timeout=", timeout,
                ", 0: the rpc_timeout): ", e.what());
  }
  if (dead.empty()) return;
  std::string names;
  for (int rank : dead) names += (names.empty() ? "" : ", ") + workerLabel(rank);
  TORCH_CHECK(false, "join on ", name_, ": ", names,
              " died without shutting down; the other workers met without it. Check its log for why it exited.");
}

void TorchAgent::leave(Clock::time_point deadline, const std::string& limit) {
  if (std::exception_ptr failed = membership_->leave(secondsLeft(deadline))) {
    TORCH_CHECK(false, "shutdown of ", name_, ": leaving the job: ", common::errorParts(failed).message);
  }
  // The members no longer send here; answer what they sent before.
  while (serverStats_->calls.load() > 0) {
    TORCH_CHECK(Clock::now() < deadline, "shutdown of ", name_, ": ", serverStats_->calls.load(),
                " request(s) it serves still running after ", limit);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void TorchAgent::sync() {
  const auto deadline = after(defaultWaitSeconds());
  TORCH_CHECK(waitCalls(deadline), "sync on ", name_, ": ", clientCalls(), " call(s) still in flight after ",
              common::secondsText(defaultWaitSeconds()), " s");
  if (!isStaticGroup()) return;  // a dynamic job has no fixed set of workers to meet
  auto gone = [watch = peerWatch_](int rank) { return watch->gone(rank); };
  rendezvous_->barrier("torch-backend/sync/" + std::to_string(meetings_++), secondsLeft(deadline), gone);
}

const upstream::WorkerInfo& TorchAgent::infoOf(int rank, const std::string& name) const {
  std::lock_guard<std::mutex> lock(infosMutex_);
  auto& info = infos_[{rank, name}];
  if (!info) info = std::make_unique<upstream::WorkerInfo>(name, static_cast<upstream::worker_id_t>(rank));
  return *info;
}

namespace {

std::string knownNames(const agent::Members& members) {
  std::string known;
  for (const auto& peer : members.list()) known += (known.empty() ? "" : ", ") + peer.name;
  return known;
}

}  // namespace

const upstream::WorkerInfo& TorchAgent::getWorkerInfo(const std::string& workerName) const {
  const agent::Members& members = agent_->members();
  const int rank = members.rankOf(workerName);
  if (rank >= 0) return infoOf(rank, workerName);
  const std::string departed = members.departed(workerName);
  // Upstream's phrase ("could not find destination"), which its programs match.
  TORCH_CHECK(departed.empty(), "could not find destination worker '", workerName, "': ", departed);
  TORCH_CHECK(false, "could not find destination worker '", workerName, "' in the job; its workers are ",
              knownNames(members));
}

const upstream::WorkerInfo& TorchAgent::getWorkerInfo(upstream::worker_id_t id) const {
  const agent::Members& members = agent_->members();
  if (auto peer = members.find(id)) return infoOf(id, peer->name);
  const std::string departed = members.departed(id);
  TORCH_CHECK(departed.empty(), "could not find destination worker of rank ", id, ": ", departed);
  TORCH_CHECK(false, "could not find destination worker of rank ", id, " in the job; its workers are ",
              knownNames(members));
}

std::vector<upstream::WorkerInfo> TorchAgent::getWorkerInfos() const {
  std::vector<upstream::WorkerInfo> infos;
  for (const auto& peer : agent_->members().list()) infos.push_back(infoOf(peer.rank, peer.name));
  return infos;
}

void TorchAgent::addGilWaitTime(const std::chrono::microseconds gilWaitTime) {
  gilWaitMicros_ += static_cast<uint64_t>(gilWaitTime.count());
  ++gilWaits_;
}

std::unordered_map<std::string, std::string> TorchAgent::getMetrics() {
  // Upstream's keys (TensorPipe's agent reports the same).
  const size_t threads = agent_->options().numWorkerThreads;
  const size_t busy = stopped_.load() ? 0 : agent_->pool().busy();
  std::unordered_map<std::string, std::string> metrics{
      {"agent.thread_pool_size", std::to_string(threads)},
      {"agent.num_idle_threads", std::to_string(threads - std::min(threads, busy))},
      {"agent.client_active_calls", std::to_string(clientCalls())},
      {"agent.server_active_calls", std::to_string(serverStats_->calls.load())},
      {"agent.server_active_async_calls", std::to_string(serverStats_->asyncCalls.load())},
  };
  if (isGILProfilingEnabled()) {  // upstream's rpc._enable_gil_profiling
    const uint64_t waits = gilWaits_.load();
    metrics["agent.gil_average_wait_time_us"] = std::to_string(waits ? gilWaitMicros_.load() / waits : 0);
  }
  return metrics;
}

std::unordered_map<std::string, std::string> TorchAgent::getDebugInfo() {
  auto info = getMetrics();
  info["agent.backend"] = "TORCHRPC";
  info["agent.connections"] = std::to_string(agent_->connectionCount());
  info["agent.pending_requests"] = std::to_string(agent_->pendingCount());
  info["agent.address"] = tcpAddress_;
  return info;
}

namespace {
thread_local SyncWait* untaken = nullptr;  // this thread's SyncWait that no send() took yet
}  // namespace

SyncWait::SyncWait(TorchAgent& agent)
    : agent_(agent.torchrpcAgent()),
      waiter_(std::make_shared<common::WaitingThread>(agent.name_, "rpc_sync")) {
  if (untaken == nullptr) untaken = this;  // else a pending one's send comes first: this call waits the plain way
}

SyncWait::~SyncWait() { close(); }

std::shared_ptr<common::WaitingThread> SyncWait::takeFor(c10::intrusive_ptr<upstream::JitFuture> out) {
  SyncWait* sync = std::exchange(untaken, nullptr);
  if (sync == nullptr) return nullptr;
  sync->out_ = std::move(out);
  return sync->waiter_;
}

void SyncWait::wait(const std::function<void()>& onSleep) {
  if (untaken == this) untaken = nullptr;
  if (out_) waiter_->serveUntil(*out_, onSleep, toPool());
}

void SyncWait::close() {
  if (untaken == this) untaken = nullptr;
  waiter_->close(toPool());
}

std::function<void(common::WaitingThread::Task)> SyncWait::toPool() const {
  return [agent = agent_](common::WaitingThread::Task task) { agent->pool().run(std::move(task)); };
}

}  // namespace torchrpc::torch_backend
