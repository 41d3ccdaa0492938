#include "agent/agent.h"

#include <ATen/ops/from_blob.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

#include "agent/core_spread.h"
#include "agent/self_call.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/python_held.h"
#include "message/payload.h"
#include "script_dispatch/run_script.h"
#include "transport/socket.h"

namespace torchrpc::agent {

namespace {

constexpr double kGoodbyeTimeoutSeconds = 1.0;

std::chrono::steady_clock::time_point deadlineAfter(double seconds) {
  if (seconds <= 0) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

thread_local std::shared_ptr<CallScope> currentScope;

// Two interceptors' scopes of one request: `outer`'s envelope held `inner`'s.
// The handler runs under both; the response is wrapped inner first.
class NestedScope : public CallScope {
 public:
  NestedScope(std::shared_ptr<CallScope> outer, std::shared_ptr<CallScope> inner)
      : outer_(std::move(outer)), inner_(std::move(inner)) {}
  void run(const std::function<void()>& fn) override {
    outer_->run([&] { inner_->run(fn); });
  }
  void outgoingResponse(message::Message& response) override {
    inner_->outgoingResponse(response);
    outer_->outgoingResponse(response);
  }

 private:
  const std::shared_ptr<CallScope> outer_;
  const std::shared_ptr<CallScope> inner_;
};

// A PYTHON_RET payload as a uint8 tensor that owns the bytes (no copy).
at::Tensor bytesTensor(std::string&& bytes) {
  auto* owned = new std::string(std::move(bytes));
  return at::from_blob(owned->data(), {static_cast<int64_t>(owned->size())},
                       [owned](void*) { delete owned; },
                       at::TensorOptions().dtype(at::kByte));
}

// A response the agent does not decode: (payload as a uint8 tensor, tensors).
c10::IValue rawResponse(message::Message&& m) {
  c10::List<at::Tensor> tensors;
  for (auto& t : m.tensors) tensors.push_back(std::move(t));
  return c10::ivalue::Tuple::create({bytesTensor(std::move(m.payload)), std::move(tensors)});
}

}  // namespace

std::shared_ptr<CallScope> CallScope::current() { return currentScope; }
CallScope::Entered::Entered(std::shared_ptr<CallScope> scope) : previous_(std::move(currentScope)) {
  currentScope = std::move(scope);
}
CallScope::Entered::~Entered() { currentScope = std::move(previous_); }

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      members_(options_.rank, options_.worldSize),
      started_(std::chrono::steady_clock::now()),
      pending_(options_.name, options_.optionsType) {
  TORCH_CHECK(options_.numWorkerThreads > 0, "num_worker_threads must be positive");
  registry_.setConcurrency(options_.numWorkerThreads);
  loop_ = std::make_unique<transport::Loop>(options_.name);
  // Idle pool threads that wait for the next request read it themselves.
  pool_ = std::make_unique<ThreadPool>(options_.numWorkerThreads, options_.name,
                                       [loop = loop_.get()] { loop->pollOnce(); });
  listener_ = std::make_unique<transport::Listener>(*loop_, options_.name,
                                                     [this](int fd, const std::string& desc) { accept(fd, desc); });
}

Agent::~Agent() { shutdown(); }

std::pair<std::string, std::string> Agent::listen() {
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "%d-%08x", static_cast<int>(::getpid()), rd());
  std::string tcp = listener_->listenTcp(options_.listenHost);
  std::string unixAddr = listener_->listenUnix("torchrpc-" + std::string(suffix));
  return {tcp, unixAddr};
}

void Agent::setPeers(std::vector<PeerInfo> peers) { members_.set(std::move(peers)); }

void Agent::setHandler(message::MessageType type, Handler handler, std::string what) {
  if (what.empty()) what = message::messageTypeName(type);
  handlers_[static_cast<uint16_t>(type)] = {std::move(handler), std::move(what)};
}

void Agent::setFastPath(message::MessageType type, FastPath fastPath) {
  fastPaths_[static_cast<uint16_t>(type)] = std::move(fastPath);
}

namespace {
std::mutex currentMutex;
std::shared_ptr<Agent> currentAgent;
}  // namespace

std::shared_ptr<Agent> Agent::current() {
  std::lock_guard<std::mutex> lock(currentMutex);
  return currentAgent;
}

void Agent::setCurrent(std::shared_ptr<Agent> agent) {
  std::lock_guard<std::mutex> lock(currentMutex);
  currentAgent = std::move(agent);
}

void Agent::startServing() {
  loop_->defer([this] {
    serving_ = true;
    auto held = std::move(held_);
    held_.clear();
    for (auto& h : held) onMessageFromLoop(h.conn, std::move(h.message), std::move(h.ticket));
  });
}

PeerInfo Agent::peer(int rank) const {
  if (auto p = members_.find(rank)) return *p;
  std::string departed = members_.departed(rank);
  TORCH_CHECK(false, departed.empty() ? "no worker with rank " + std::to_string(rank) + " in the job" : departed);
}

std::string Agent::peerLabel(const PeerInfo& p) const {
  if (p.rank == options_.rank) return p.name;
  bool local = !p.hostId.empty() && p.hostId == options_.hostId;
  return p.name + " (" + (local ? p.unixAddress : p.tcpAddress) + ")";
}

size_t Agent::connectionCount() const {
  std::lock_guard<std::mutex> lock(connectionsMutex_);
  return connections_.size();
}

Agent::FuturePtr Agent::send(int dst, message::Message&& request, double timeoutSeconds,
                             const std::string& callKind, const std::string& function) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  const uint64_t id = pending_.nextId();
  request.id = id;
  auto peer = members_.find(dst);
  std::string description = callKind + " #" + std::to_string(id) + " " + options_.name + " -> " +
                            (peer ? peerLabel(*peer) : "rank " + std::to_string(dst)) + " '" + function + "'";
  auto fail = [&](common::ErrorKind kind, const std::string& why) {
    future->setError(common::makeRpcError(kind, description + ": " + why));
    return future;
  };
  if (shuttingDown_.load()) return fail(common::ErrorKind::kShutdown, "torchrpc is shutting down on " + options_.name);
  if (!peer) {
    // A worker of a dynamic job that left: the caller could not know.
    std::string departed = members_.departed(dst);
    if (!departed.empty()) return fail(common::ErrorKind::kPeerUnreachable, departed);
    return fail(common::ErrorKind::kInvalidArgument, "no worker with rank " + std::to_string(dst));
  }
  try {
    const Outgoing outgoing{dst, callKind, function, future};
    for (auto& interceptor : interceptors_) interceptor->outgoingRequest(request, outgoing);
  } catch (...) {
    return fail(common::ErrorKind::kInvalidArgument, common::errorParts(std::current_exception()).message);
  }
  Pending::Call call{future, dst, 0, description, timeoutSeconds, std::chrono::steady_clock::now(),
                     deadlineAfter(timeoutSeconds)};
  if (dst == options_.rank) {
    // A call to oneself: straight to the pool, with copies (self_call.h).
    try {
      request = copyForSelf(std::move(request));
    } catch (const c10::Error& e) {
      return fail(common::ErrorKind::kInvalidArgument, e.what_without_backtrace());
    }
    pending_.add(id, std::move(call));
    pool_->run([this, request = std::move(request)]() mutable {
      message::Reply reply(request.id, options_.name, [this](message::Message&& r) {
        const uint64_t id = r.id;
        try {
          r = copyForSelf(std::move(r));
        } catch (const c10::Error& e) {
          r = resultCannotTravel(id, e.what_without_backtrace());
        }
        onResponse(std::move(r), options_.rank, 0);
      });
      dispatch(std::move(request), options_.rank, std::move(reply));
    });
    return future;
  }
  auto conn = connectionTo(*peer, timeoutSeconds);
  if (conn.error) {
    return fail(common::ErrorKind::kPeerUnreachable, "cannot connect: " + conn.error.what() + ". Is " + peer->name +
                                                 " still running? Check its log.");
  }
  call.connectionId = conn.value->id();
  auto deadline = call.deadline;
  pending_.add(id, std::move(call));
  // A pool thread never waits for a peer to read: it queues (connection.h).
  if (common::Error err = conn.value->send(std::move(request), deadline, nullptr, !ThreadPool::onPoolThread())) {
    // A message the wire refuses (e.g. an unsupported tensor) is the caller's mistake.
    common::ErrorKind kind = err.code() == common::Error::Code::kInvalid ? common::ErrorKind::kInvalidArgument : common::ErrorKind::kPeerUnreachable;
    if (auto failed = pending_.take(id)) {
      failed->future->setErrorIfNeeded(common::makeRpcError(kind, description + ": " + err.what()));
    }
  }
  return future;
}

std::exception_ptr refusedBeforeSending(const Agent::FuturePtr& future) {
  if (!future->completed() || !future->hasError()) return nullptr;
  auto error = future->exception_ptr();
  return common::errorParts(error).kind == common::ErrorKind::kInvalidArgument ? error : nullptr;
}

bool Agent::sendsAtOnce(int dst, uint64_t bytes) const {
  if (dst == options_.rank) return true;
  auto link = members_.link(dst);
  if (!link) return false;
  std::lock_guard<std::mutex> lock(link->mutex);
  return link->conn && link->conn->acceptsWithoutWaiting(bytes);
}

bool Agent::onLoop() const { return loop_->inLoop(); }

bool Agent::scopesPlainRequests() const {
  for (const auto& interceptor : interceptors_) {
    if (interceptor->scopesPlainRequests()) return true;
  }
  return false;
}

void Agent::onResponse(message::Message&& m, int src, uint64_t connectionId) {
  auto call = pending_.take(m.id, connectionId);
  if (!call) {
    TORCHRPC_DEBUG(options_.name, "dropping a response #" << m.id << " ("
                                      << message::messageTypeName(m.type) << ") from rank " << src
                                      << ": no call of that id is pending on that connection (it failed already)");
    return;
  }
  complete(*call, std::move(m), src);
  // Python may have taken the value meanwhile (giving its tensors Python
  // objects) and let go of the future: freeing it here would take the GIL.
  common::release(call->future);
}

void Agent::complete(Pending::Call& call, message::Message&& m, int src) {
  try {
    for (auto it = interceptors_.rbegin(); it != interceptors_.rend(); ++it) (*it)->incomingResponse(m, src);
    switch (m.type) {
      case message::MessageType::kScriptRet: {
        c10::IValue value = message::messageIValue(m);
        m.tensors.clear();  // before Python sees them (agent.h)
        call.future->markCompleted(std::move(value));
        return;
      }
      case message::MessageType::kPythonRet: {
        std::string refused = options_.policy.refuseResponse(m.type, options_.name);
        if (!refused.empty()) {  // script-only: a peer's pickle is never handed on to be unpickled
          call.future->setError(common::makeRpcError(common::ErrorKind::kRemote, call.description + ": " + refused,
                                                      script_dispatch::kPolicyRefusal));
          return;
        }
        call.future->markCompleted(rawResponse(std::move(m)));
        return;
      }
      case message::MessageType::kTorchResponse:  // upstream's message: the backend decodes it
        call.future->markCompleted(rawResponse(std::move(m)));
        return;
      case message::MessageType::kException: {
        message::RemoteException e = message::messageException(m);
        // No worker: a relayed error whose message names where it was raised.
        std::string text = e.message;
        if (!e.worker.empty()) {
          // A result that could not be sent back: the callee no longer knew the function, so name the call.
          text = e.function == message::kSendingTheResult
                     ? call.description + ": " + text + " (raised on " + e.worker + ")"
                     : text + " (raised on " + e.worker + " while running '" + e.function + "')";
        }
        call.future->setError(common::makeRpcError(common::ErrorKind::kRemote, std::move(text), e.type, e.traceback));
        return;
      }
      default:
        break;
    }
    call.future->setError(common::makeRpcError(common::ErrorKind::kGeneric, call.description +
                                                                 ": unexpected response type " +
                                                                 message::messageTypeName(m.type)));
  } catch (const std::exception& e) {
    call.future->setErrorIfNeeded(common::makeRpcError(
        common::ErrorKind::kGeneric, call.description + ": cannot decode the response: " + e.what()));
  }
}

void Agent::dispatch(message::Message&& request, int callerRank, message::Reply reply) {
  std::shared_ptr<CallScope> scope;
  try {
    // Outermost envelope first; each scope nests inside the one before.
    for (auto it = interceptors_.rbegin(); it != interceptors_.rend(); ++it) {
      auto inner = (*it)->incomingRequest(request, callerRank);
      scope = !inner ? scope : !scope ? inner : std::make_shared<NestedScope>(scope, inner);
    }
  } catch (...) {
    reply.error(message::describeException(std::current_exception(), message::messageTypeName(request.type), options_.name));
    return;
  }
  if (!scope) {
    serve(std::move(request), callerRank, std::move(reply));
    return;
  }
  // The handler, its continuations and its response all belong to the scope.
  message::Reply scoped = reply.through([scope](message::Message& r) { scope->outgoingResponse(r); });
  scope->run([&] {
    CallScope::Entered entered(scope);
    serve(std::move(request), callerRank, std::move(scoped), scope);
  });
}

void Agent::serve(message::Message&& request, int callerRank, message::Reply reply, const std::shared_ptr<CallScope>& scope) {
  const message::MessageType type = request.type;
  const std::string* what = nullptr;
  // The one check of a request's kind (callee_policy.h), before any handler decodes it.
  if (auto refused = options_.policy.refuseRequest(type, options_.name)) {
    reply.error(*refused);
    return;
  }
  try {
    if (type == message::MessageType::kScriptCall || type == message::MessageType::kBuiltinCall) {
      script_dispatch::run(std::move(request), registry_, options_.policy,
                           [this, scope](std::function<void()> fn) { continueOnPool(scope, std::move(fn)); },
                           options_.name, reply);
      return;
    }
    auto it = handlers_.find(static_cast<uint16_t>(type));
    if (it == handlers_.end()) {
      reply.error(message::RemoteException{"RuntimeError",
                                  std::string("worker ") + options_.name + " cannot handle " +
                                      message::messageTypeName(type) + " requests (no handler installed)",
                                  "", message::messageTypeName(type), options_.name});
      return;
    }
    what = &it->second.second;
    it->second.first(std::move(request), callerRank, reply);
  } catch (...) {
    if (!reply.answered()) {
      reply.error(message::describeException(std::current_exception(), what ? *what : message::messageTypeName(type), options_.name));
    }
  }
}

void Agent::continueOnPool(std::shared_ptr<CallScope> scope, std::function<void()> fn) {
  if (!scope) {
    pool_->run(std::move(fn));
    return;
  }
  pool_->run([scope = std::move(scope), fn = std::move(fn)] {
    scope->run([&] {
      CallScope::Entered entered(scope);
      fn();
    });
  });
}

message::Message Agent::resultCannotTravel(uint64_t id, const std::string& why) const {
  return message::exceptionMessage(
      id, message::RemoteException{"ValueError", "its result cannot be sent back: " + why, "",
                                   message::kSendingTheResult, options_.name});
}

void Agent::respondOn(const std::shared_ptr<transport::Connection>& conn, message::Message&& response,
                      const transport::Ticket& ticket) {
  const uint64_t id = response.id;
  CoreSpread::leave();  // this pool task has done its work: see core_spread.h
  // A response never waits for the peer to read (its ticket bounds how many queue).
  common::Error err = conn->send(std::move(response), std::chrono::steady_clock::time_point::max(), ticket);
  if (err && err.code() == common::Error::Code::kInvalid) {
    err = conn->send(resultCannotTravel(id, err.what()), std::chrono::steady_clock::time_point::max(), ticket);
  }
  if (!err || err.code() == common::Error::Code::kClosed) return;  // a closed connection failed the caller's call
  // The caller would wait out its timeout for this response: close the
  // connection instead, which fails its pending calls at once, saying why.
  TORCHRPC_WARN(options_.name, "closing " << conn->description() << ": cannot send the response to request #" << id
                                          << ": " << err.what());
  conn->close("the response to request #" + std::to_string(id) + " could not be sent: " + err.what());
}

void Agent::onMessageFromLoop(const std::shared_ptr<transport::Connection>& conn, message::Message&& m,
                              transport::Ticket ticket) {
  if (!serving_) {
    held_.push_back({conn, std::move(m), std::move(ticket)});
    return;
  }
  if (conn->peerRank() < 0) {  // the connection reads no frame before the handshake
    conn->close("protocol error: a frame before the handshake");
    return;
  }
  if (m.type == message::MessageType::kGoodbye) {
    saidGoodbye_.insert(conn->id());
    return;
  }
  if (message::isResponse(m.type)) {
    onResponse(std::move(m), conn->peerRank(), conn->id());
    return;
  }
  if (message::isRequest(m.type)) {
    // The ticket leaves with the response (the reply answers once): it counts
    // against the connection's caps until the response is written.
    message::Reply reply(m.id, options_.name, [this, conn, ticket = std::move(ticket)](message::Message&& r) mutable {
      respondOn(conn, std::move(r), std::exchange(ticket, nullptr));
    });
    auto fast = fastPaths_.find(static_cast<uint16_t>(m.type));
    int caller = conn->peerRank();
    if (fast != fastPaths_.end() && fast->second(m, caller, reply)) return;
    pool_->run([this, caller, m = std::move(m), reply = std::move(reply)]() mutable {
      dispatch(std::move(m), caller, std::move(reply));
    });
    return;
  }
  conn->close(std::string("protocol error: unexpected ") + message::messageTypeName(m.type));
}

size_t Agent::waitPending(double timeoutSeconds) {
  return pending_.waitEmpty(deadlineAfter(timeoutSeconds));
}

size_t Agent::quiesce(double timeoutSeconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, timeoutSeconds)));
  while (true) {
    bool quiet = true;
    size_t unanswered = 0;
    {
      std::lock_guard<std::mutex> lock(connectionsMutex_);
      for (const auto& kv : connections_) {
        quiet = kv.second->quiet() && quiet;
        unanswered += kv.second->unanswered();
      }
    }
    if (quiet) return 0;
    // Polled: only a graceful shutdown waits here, and for a few responses.
    if (std::chrono::steady_clock::now() >= deadline) return std::max<size_t>(unanswered, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Agent::shutdown() {
  if (stopped_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(currentMutex);
    if (currentAgent.get() == this) currentAgent.reset();
  }
  shuttingDown_.store(true);
  listener_->close();
  std::vector<std::shared_ptr<transport::Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    for (auto& kv : connections_) conns.push_back(kv.second);
  }
  for (auto& conn : conns) {
    message::Message bye;
    bye.type = message::MessageType::kGoodbye;
    // Best effort: the connection closes next either way.
    (void)conn->send(std::move(bye), deadlineAfter(kGoodbyeTimeoutSeconds));
    conn->close("torchrpc shut down on " + options_.name);
  }
  pending_.failAll(common::ErrorKind::kShutdown,
                   "torchrpc shut down on " + options_.name + " before a response arrived");
  if (!pool_->stop(/*timeoutSeconds=*/10.0)) {
    (void)pool_.release();  // its detached threads still use it
  }
  loop_->stop();
  pending_.stop();
  for (auto& interceptor : interceptors_) interceptor->stop();
  for (auto& link : members_.links()) {
    std::lock_guard<std::mutex> lock(link->mutex);
    link->conn.reset();
  }
}

}  // namespace torchrpc::agent
