#include "worker/worker.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "autograd/context.h"
#include "autograd/engine.h"
#include "common/logging.h"
#include "profiling/profiler.h"
#include "script_dispatch/inline_calls.h"
#include "common/error.h"

namespace torchrpc::worker {

std::string localHostId() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (boot && std::getline(boot, bootId)) id += "|" + bootId;
  char ns[256] = {0};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n > 0) id += "|" + std::string(ns, static_cast<size_t>(n));
  return id;
}

namespace {

// TORCHRPC_PEER_GRACE_SECONDS overrides AgentOptions::peerGraceSeconds (tests
// and operators shorten or lengthen how long a lost peer's RRefs are kept).
void applyGraceFromEnvironment(agent::AgentOptions& options) {
  const char* text = std::getenv("TORCHRPC_PEER_GRACE_SECONDS");
  if (text == nullptr || text[0] == '\0') return;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  TORCH_CHECK_VALUE(end != text && *end == '\0' && seconds >= 0, "TORCHRPC_PEER_GRACE_SECONDS must be a number of ",
                    "seconds >= 0; got '", text, "'");
  options.peerGraceSeconds = seconds;
}

// A peer found gone (PeerWatch): the RRef forks it held here, and the
// awaited RRef entries and autograd contexts its requests made, are released;
// a dynamic job's worker leaves the agent's table too.
void releaseGone(agent::Agent& agent, rref::RRefContext& rrefs, int rank) {
  rrefs.releasePeer(rank);
  if (agent.members().dynamic()) {
    // A dynamic job's worker that died never leaves: drop it here, so calls to it say so.
    agent.removePeer(rank, "stopped without leaving the job (its connection was lost and it cannot be reached)");
  }
  if (size_t contexts = autograd::Container::get().releasePeer(rank)) {
    TORCHRPC_WARN(agent.options().name, rrefs.workerLabel(rank) << " was lost without shutting down: released "
                                                               << contexts << " distributed autograd context(s)");
  }
}

}  // namespace

Worker::Worker(agent::AgentOptions options, c10::intrusive_ptr<c10d::Store> store, const Hook& beforeServing,
               const std::function<bool()>& interrupted) {
  if (options.hostId.empty()) options.hostId = localHostId();
  applyGraceFromEnvironment(options);
  const int rank = options.rank;
  const int worldSize = options.worldSize;
  rendezvous_ = std::make_unique<rendezvous::Rendezvous>(std::move(store), rank, worldSize);
  if (!rendezvous_->dynamic()) rendezvous_->claimKind();  // a dynamic job's worker claims it as it joins
  options.secret = rendezvous_->sharedSecret(options.secret, interrupted);
  agent_ = std::make_shared<agent::Agent>(options);
  try {
    auto [tcp, unixAddr] = agent_->listen();
    agent::PeerInfo me{options.name, rank, tcp, unixAddr, options.hostId};
    if (rendezvous_->dynamic()) {
      membership_ = std::make_unique<Membership>(agent_, *rendezvous_);
      agent_->setPeers(membership_->enter(me));
    } else {
      agent_->setPeers(rendezvous_->exchange(me, interrupted));
    }
    rrefs_ = rref::RRefContext::create(agent_);
    peerWatch_ = PeerWatch::create(agent_, [agent = agent_, rrefs = rrefs_](int rank) { releaseGone(*agent, *rrefs, rank); });
    // A short TorchScript or builtin call runs on the thread that read it (script_dispatch/inline_calls.h).
    for (auto type : {message::MessageType::kScriptCall, message::MessageType::kBuiltinCall}) {
      agent_->setFastPath(type, [a = agent_.get()](message::Message& request, int callerRank, const message::Reply& reply) {
        if (a->scopesPlainRequests() || !script_dispatch::runsInline(request, a->registry())) return false;
        a->serve(std::move(request), callerRank, reply);  // a plain request: no interceptor scopes it
        return true;
      });
    }
    autograd::install(*agent_);
    if (membership_) membership_->install();
    profiling::install(*agent_);  // after autograd: its envelope wraps autograd's
    if (beforeServing) beforeServing(*agent_, *rrefs_);
    agent_->startServing();
    agent::Agent::setCurrent(agent_);
    if (membership_) {
      const double rpcTimeout = agent_->options().defaultTimeoutSeconds;
      membership_->announce(rpcTimeout > 0 ? rpcTimeout : 60.0);  // every wait is bounded
    }
  } catch (...) {
    if (peerWatch_) peerWatch_->stop();
    agent_->shutdown();
    if (rrefs_) rrefs_->stop();
    membership_.reset();  // gives the token back
    throw;
  }
}

Worker::~Worker() {
  if (!stopped_) stop(/*graceful=*/false, 0);
}

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Interrupted {};  // stop()'s `interrupted` said so: the meeting ends here

}  // namespace

double Worker::stepSeconds() const {
  const double rpc = agent_->options().defaultTimeoutSeconds;
  return rpc > 0 ? rpc : 60.0;
}

std::exception_ptr Worker::leaveGracefully(double timeoutSeconds, const std::function<bool()>& interrupted,
                                           std::vector<rref::OwnerTable::EntryInfo>* leaked) {
  const std::string& me = agent_->options().name;
  // Without a limit (<= 0) only the waits for this worker's calls and for the
  // others to arrive are unbounded; the steps after the meeting are not.
  const bool limited = timeoutSeconds > 0;
  const double steps = limited ? timeoutSeconds : stepSeconds();
  const std::string limit = common::secondsText(steps) + " s";
  if (size_t left = agent_->waitPending(timeoutSeconds)) {
    return common::makeRpcError(common::ErrorKind::kTimeout, "shutdown on " + me + ": " + std::to_string(left) +
                                                 " call(s) still pending after " + limit);
  }
  // The meeting under way, when it began and what it may take (<= 0: no limit).
  auto phaseStart = std::chrono::steady_clock::now();
  double phaseSeconds = timeoutSeconds;
  std::exception_ptr failure;
  std::set<int> dead;  // workers the meetings went on without
  try {
    // A dead worker never arrives: the meetings skip the ones known gone.
    auto gone = [watch = peerWatch_, &interrupted](int rank) {
      if (interrupted && interrupted()) throw Interrupted{};
      return watch->gone(rank);
    };
    dead = rendezvous_->barrier("shutdown", timeoutSeconds, gone);
    if (!limited) phaseStart = std::chrono::steady_clock::now();  // the steps' time counts from the meeting
    // No grace at shutdown: the RRef forks a dead worker held are released now.
    for (int rank : dead) rrefs_->releasePeer(rank);
    // Everyone is done calling: release this worker's user RRefs.
    failure = releaseRRefs(phaseStart + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                            std::chrono::duration<double>(steps)),
                           limit);
    phaseStart = std::chrono::steady_clock::now();
    phaseSeconds = steps;
    auto late = rendezvous_->barrier("rref-shutdown", steps, gone);
    dead.insert(late.begin(), late.end());
    leakedOwners(leaked);
    if (agent_->options().rank == 0) rendezvous_->releaseKind();  // everyone left the store
  } catch (const Interrupted&) {
    return common::makeRpcError(common::ErrorKind::kShutdown,
                                "shutdown on " + me + ": interrupted while waiting for the other workers; stopped "
                                "without them (their calls to " + me + " fail)");
  } catch (...) {
    // A meeting failed: its timeout, or the store gone (its host exited)
    // well before it.
    const double waited = secondsSince(phaseStart);
    const std::string why = common::errorParts(std::current_exception()).message;
    if (phaseSeconds <= 0 || waited < 0.9 * phaseSeconds) {
      return common::makeRpcError(
          common::ErrorKind::kPeerUnreachable,
          "shutdown on " + me + ": the rendezvous store stopped answering after " + common::secondsText(waited) + " s (" +
              why + "). With tcp:// and env:// rank 0 (" + rrefs_->workerLabel(0) +
              ") hosts it, and it has probably exited without shutdown(); the other workers cannot meet. Shut "
              "them down with shutdown(graceful=False).");
    }
    return common::makeRpcError(common::ErrorKind::kTimeout, "shutdown on " + me + ": not every worker reached shutdown within " +
                                                                 common::secondsText(phaseSeconds) + " s (" + why + ")");
  }
  if (failure) return failure;
  return deadPeersFailure(dead);
}

std::exception_ptr Worker::deadPeersFailure(const std::set<int>& dead) const {
  if (dead.empty()) return nullptr;
  const auto reasons = peerWatch_->goneRanks();
  std::string names;
  for (int rank : dead) {
    auto reason = reasons.find(rank);
    names += (names.empty() ? "" : ", ") + rrefs_->workerLabel(rank) + " (rank " + std::to_string(rank) + ": " +
             (reason != reasons.end() ? reason->second : "found dead by another worker") + ")";
  }
  return common::makeRpcError(
      common::ErrorKind::kPeerUnreachable,
      "shutdown on " + agent_->options().name + ": " + names +
          " died without shutting down, so the job did not end cleanly; the other workers met without it, released "
          "their RRefs and stopped. RRefs it owned are lost; check its log for why it exited.");
}

std::exception_ptr Worker::releaseRRefs(std::chrono::steady_clock::time_point deadline, const std::string& limit) {
  auto leftSeconds = [&] {
    return std::max(0.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
  };
  for (int pass = 0; pass < 2; ++pass) {
    rrefs_->releaseAllUsers();
    size_t messages = rrefs_->waitIdle(leftSeconds());
    size_t calls = agent_->waitPending(leftSeconds());
    if (messages || calls) {
      return common::makeRpcError(common::ErrorKind::kTimeout,
                                  "shutdown on " + agent_->options().name + ": " + std::to_string(messages) +
                                      " RRef protocol message(s) and " + std::to_string(calls) +
                                      " call(s) still unanswered after " + limit);
    }
  }
  return nullptr;
}

void Worker::leakedOwners(std::vector<rref::OwnerTable::EntryInfo>* leaked) const {
  for (auto& entry : rrefs_->snapshot().owners) {
    if (!std::get<1>(entry).empty()) leaked->push_back(std::move(entry));
  }
}

std::exception_ptr Worker::leaveDynamic(double timeoutSeconds, std::vector<rref::OwnerTable::EntryInfo>* leaked) {
  const std::string& me = agent_->options().name;
  const bool limited = timeoutSeconds > 0;  // as leaveGracefully's
  const double steps = limited ? timeoutSeconds : stepSeconds();
  const std::string limit = common::secondsText(steps) + " s";
  const auto started = std::chrono::steady_clock::now();
  if (size_t left = agent_->waitPending(timeoutSeconds)) {
    return common::makeRpcError(common::ErrorKind::kTimeout, "shutdown on " + me + ": " + std::to_string(left) +
                                                                 " call(s) still pending after " + limit);
  }
  const auto deadline = (limited ? started : std::chrono::steady_clock::now()) +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(steps));
  std::exception_ptr failure = releaseRRefs(deadline, limit);
  leakedOwners(leaked);
  try {
    auto told = membership_->leave(std::max(0.1, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count()));
    return failure ? failure : told;
  } catch (...) {
    return common::makeRpcError(common::ErrorKind::kPeerUnreachable,
                                "shutdown on " + me + ": cannot leave the job through the rendezvous store (" +
                                    common::errorParts(std::current_exception()).message +
                                    "). With tcp:// and env:// the store lives in the process of rank 0: if it "
                                    "exited, the job's other workers can only stop with shutdown(graceful=False).");
  }
}

Worker::StopReport Worker::stop(bool graceful, double timeoutSeconds, const std::function<bool()>& interrupted) {
  TORCH_CHECK(!stopped_, "this worker was stopped already");
  stopped_ = true;
  StopReport report;
  if (graceful) {
    const auto started = std::chrono::steady_clock::now();
    report.failure = membership_ ? leaveDynamic(timeoutSeconds, &report.leaked)
                                 : leaveGracefully(timeoutSeconds, interrupted, &report.leaked);
    // What peers asked of this worker is answered before its GOODBYE closes
    // the connections: a dynamic job's members may call it until it left
    // (the last call may be the one that asked it to stop).
    const double left = timeoutSeconds > 0 ? timeoutSeconds - secondsSince(started) : stepSeconds();
    if (size_t unanswered = agent_->quiesce(left)) {
      TORCHRPC_WARN(agent_->options().name, "shutdown: " << unanswered << " request(s) from other workers still "
                                                         << "unanswered after " << (timeoutSeconds > 0 ? timeoutSeconds : left)
                                                         << " s; their callers get an error naming this worker");
    }
  }
  peerWatch_->stop();
  agent_->shutdown();
  rrefs_->stop();
  return report;
}

void Worker::shutdown(double timeoutSeconds) {
  auto report = stop(/*graceful=*/true, timeoutSeconds);
  if (report.failure) std::rethrow_exception(report.failure);
}

}  // namespace torchrpc::worker
