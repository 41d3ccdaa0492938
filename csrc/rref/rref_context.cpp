#include "rref/rref_context.h"

#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <chrono>

#include "agent/self_call.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/python_held.h"
#include "message/payload.h"
#include "profiling/profiler.h"
#include "rref/rref_messages.h"

namespace torchrpc::rref {

namespace {

// Protocol messages (fork requests, deletes, accepts) are tiny; a peer that
// does not answer within this long is gone or wedged.
constexpr double kProtocolTimeoutSeconds = 120.0;
// How long an awaited RRef waits for its creation when this worker's default
// timeout is 0 (none): a bound is needed, the entry was made by a peer's say-so.
constexpr double kAwaitedFallbackSeconds = 60.0;

}  // namespace

namespace {
std::mutex currentMutex;
std::weak_ptr<RRefContext> currentContext;
}  // namespace

std::shared_ptr<RRefContext> RRefContext::create(std::shared_ptr<agent::Agent> agent) {
  std::shared_ptr<RRefContext> ctx(new RRefContext(std::move(agent)));
  ctx->owners_ = std::make_unique<OwnerTable>(ctx, ctx->rank_);
  ctx->installHandlers();
  std::lock_guard<std::mutex> lock(currentMutex);
  currentContext = ctx;
  return ctx;
}

std::shared_ptr<RRefContext> RRefContext::current() {
  std::shared_ptr<RRefContext> ctx;
  {
    std::lock_guard<std::mutex> lock(currentMutex);
    ctx = currentContext.lock();
  }
  return ctx && !ctx->stopped_ ? ctx : nullptr;
}

RRefContext::RRefContext(std::shared_ptr<agent::Agent> agent)
    : agent_(std::move(agent)), rank_(agent_->options().rank), expiries_(agent_->options().name) {}

RRefContext::~RRefContext() = default;

void RRefContext::setPythonEncoder(PythonEncoder encoder) { pythonEncoder_ = std::move(encoder); }
void RRefContext::setPythonMethodRunner(PythonMethodRunner runner) { pythonMethodRunner_ = std::move(runner); }

std::string RRefContext::workerLabel(int rank) const {
  try {
    return agent_->peer(rank).name;
  } catch (const std::exception&) {
    return "rank " + std::to_string(rank);
  }
}

GlobalId RRefContext::newId() { return GlobalId{rank_, nextLocal_.fetch_add(1)}; }

// ---- owner table -------------------------------------------------------------

void RRefContext::forgetOwner(const RRefId& id, const OwnerRRef* owner) { owners_->forgetObject(id, owner); }

std::shared_ptr<OwnerRRef> RRefContext::createOwner(c10::IValue value) {
  auto owner = std::make_shared<OwnerRRef>(weak_from_this(), rank_, newId());
  owners_->addObject(owner);
  owner->setValue(std::move(value));
  return owner;
}

// ---- remote() ------------------------------------------------------------------

void RRefContext::runCreation(const std::shared_ptr<OwnerRRef>& owner, message::Message&& call, int callerRank,
                              InFlight::Token token, std::function<void()> done) {
  std::weak_ptr<RRefContext> weak = weak_from_this();
  auto held = std::make_shared<InFlight::Token>(std::move(token));
  auto finish = [weak, id = owner->id(), held, done] {
    if (auto self = weak.lock()) self->owners_->endCreation(id).reset();  // may drop the entry's RRef
    if (done) done();
    held->reset();
  };
  message::Reply keep(
      call.id, workerName(),
      [owner, finish](c10::IValue value) {
        owner->setValue(std::move(value));
        finish();
      },
      [owner, finish](const message::RemoteException& error) {
        owner->setError(error);
        finish();
      });
  agent_->serve(std::move(call), callerRank, std::move(keep));
}

std::shared_ptr<RRef> RRefContext::remote(int dst, message::Message&& call, double timeoutSeconds,
                                          const std::string& function) {
  const RRefId rrefId = newId();
  if (dst == rank_) {
    // The owner is this worker: no message, the value is created on the pool
    // from copies of the arguments (agent/self_call.h).
    try {
      call = agent::copyForSelf(std::move(call));
    } catch (const c10::Error& e) {
      std::rethrow_exception(common::makeRpcError(
          common::ErrorKind::kInvalidArgument,
          "remote " + workerName() + " -> " + workerName() + " '" + function + "': " + e.what_without_backtrace()));
    }
    auto owner = owners_->startCreation(rrefId, nullptr, rank_);
    auto token = inFlight_.begin();
    std::function<void()> create = [self = shared_from_this(), owner, token, call = std::move(call)]() mutable {
      self->runCreation(owner, std::move(call), self->rank_, std::move(token));
    };
    // Profiled: one range until the value exists, and the creation's own
    // events recorded in the caller's profile (its thread state goes along).
    if (auto recorded = profiling::localCall(*agent_, "remote", function, owner->value())) {
      owner->setCreation(recorded);
      create = at::wrapPropagateTLSState(std::move(create));
    }
    agent_->pool().run(std::move(create));
    return owner;
  }
  const ForkId forkId = newId();
  auto user = std::make_shared<UserRRef>(weak_from_this(), dst, rrefId, forkId, false);
  if (timeoutSeconds > 0) {
    user->setCreationDeadline(std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(timeoutSeconds)));
  }
  users_.add(user, /*pending=*/true);
  std::weak_ptr<UserRRef> weakUser = user;
  auto sent = sendTracked(dst, remoteCallMessage(rrefId, forkId, std::move(call)), timeoutSeconds, "remote",
                          function, [self = shared_from_this(), forkId, weakUser](std::exception_ptr error) {
                            if (error) {
                              // The owner may never have seen the call; to_here reports this.
                              if (auto u = weakUser.lock()) {
                                auto parts = common::errorParts(error);
                                u->setCreationError(static_cast<int>(parts.kind), parts.message);
                                u->created(error);
                              }
                            }
                            self->confirmUser(forkId, error, -1);
                          },
                          /*thenWhereAnswered=*/true);
  if (auto refused = agent::refusedBeforeSending(sent)) {
    users_.remove(forkId);
    user->markDeleted();  // the owner never heard of it: nothing to delete
    std::rethrow_exception(refused);
  }
  if (profiling::profiled()) user->setCreation(sent);  // RRef._get_profiling_future
  return user;
}

// ---- to_here() -------------------------------------------------------------------

RRefContext::FuturePtr RRefContext::fetch(const std::shared_ptr<UserRRef>& rref,
                                          double timeoutSeconds) {
  if (!rref->confirmed()) {
    if (auto deadline = rref->creationDeadline()) {
      double left = std::chrono::duration<double>(*deadline - std::chrono::steady_clock::now()).count();
      if (timeoutSeconds <= 0 || left < timeoutSeconds) timeoutSeconds = std::max(left, 1e-3);
    }
  }
  return agent_->send(rref->owner(), idsMessage(message::MessageType::kRRefFetch, rref->id()),
                      timeoutSeconds, "to_here", "RRef " + rref->id().str());
}

message::Message RRefContext::encodeValue(uint64_t id, const c10::IValue& value) {
  if (value.isPyObject()) {
    TORCH_CHECK(pythonEncoder_, "no Python encoder installed on ", workerName());
    return pythonEncoder_(id, value);
  }
  return message::ivalueMessage(message::MessageType::kScriptRet, id, c10::ivalue::Tuple::create({value}));
}

RRefContext::FuturePtr RRefContext::methodCall(const std::shared_ptr<RRef>& rref, message::Message&& call,
                                               const std::string& name, double timeoutSeconds,
                                               const std::string& callKind) {
  TORCH_CHECK(rref->context().get() == this,
              "this RRef belongs to an earlier torchrpc session (before shutdown); it cannot be used");
  TORCH_CHECK(!rref->isOwner(), "RREF_METHOD_CALL of an owner RRef");
  auto future = agent_->send(rref->owner(), std::move(call), timeoutSeconds, callKind,
                             name + "() of RRef " + rref->id().str());
  // The owner keeps the value while this worker's RRef lives: until the answer.
  future->addCallback([keep = rref](c10::ivalue::Future&) {});
  return future;
}

// ---- forks -------------------------------------------------------------------------

ForkData RRefContext::fork(const std::shared_ptr<RRef>& rref, int requestTo) {
  TORCH_CHECK(rref->context().get() == this,
              "this RRef belongs to an earlier torchrpc session (before shutdown); it cannot be sent");
  const ForkId forkId = newId();
  if (rref->isOwner()) {
    // Sent in a request, the fork's holder is known; in a response it is not.
    owners_->addForkOf(std::static_pointer_cast<OwnerRRef>(rref), forkId,
                       requestTo >= 0 ? requestTo : OwnerTable::kUnknownHolder);
  } else {
    TORCH_CHECK(!std::static_pointer_cast<UserRRef>(rref)->deleted(), "RRef ", rref->id().str(),
                " was already released (torchrpc is shutting down); it cannot be sent");
    users_.holdChild(forkId, rref, requestTo);
  }
  const bool answered = !rref->isOwner() && requestTo == rref->owner();
  return ForkData{rref->owner(), rref->id(), forkId, rank_, answered};
}

std::shared_ptr<RRef> RRefContext::receive(const ForkData& fork) {
  if (fork.owner == rank_) {
    auto owner = awaitedOwner(fork.rrefId, fork.parent);
    TORCH_CHECK(owner, "torchrpc shut down on ", workerName(), ": RRef ", fork.rrefId.str(), " cannot be received");
    if (fork.parent == rank_) {
      // Sent to ourselves: the fork added while pickling has no user.
      owners_->removeFork(fork.rrefId, fork.forkId).reset();  // not the last reference: `owner` holds it
    } else if (!fork.answered) {
      // A user sent the owner its own RRef: the parent may let go of its copy.
      sendTrackedSoon(fork.parent, idsMessage(message::MessageType::kRRefChildAccept, fork.forkId), "CHILD_ACCEPT",
                      nullptr);
    }
    return owner;
  }
  const bool parentIsOwner = fork.parent == fork.owner;
  auto user = std::make_shared<UserRRef>(weak_from_this(), fork.owner, fork.rrefId, fork.forkId,
                                         /*confirmed=*/parentIsOwner);
  users_.add(user, /*pending=*/!parentIsOwner);
  if (!parentIsOwner) {
    // A request carrying it runs once the owner confirmed it, as upstream's do
    // (in the callee, confirmed_by_owner() is then true).
    message::UnpickleScope::awaitBeforeUse(user->creation());
    sendTrackedSoon(fork.owner, idsMessage(message::MessageType::kRRefForkRequest, fork.rrefId, fork.forkId),
                    "FORK_REQUEST",
                    [self = shared_from_this(), forkId = fork.forkId, parent = fork.parent](std::exception_ptr error) {
                      self->confirmUser(forkId, error, parent);
                    });
  }
  return user;
}

void RRefContext::releaseWhenAnswered(const FuturePtr& call, const std::vector<ForkData>& forks) {
  std::vector<ForkId> answered;
  for (const auto& f : forks) {
    if (f.answered) answered.push_back(f.forkId);  // the others wait for CHILD_ACCEPT
  }
  if (answered.empty()) return;
  std::weak_ptr<RRefContext> weak = weak_from_this();
  call->addCallback([weak, answered = std::move(answered)](c10::ivalue::Future& done) {
    auto self = weak.lock();
    if (!self) return;
    if (done.hasError() && common::errorParts(done.exception_ptr()).kind == common::ErrorKind::kTimeout) {
      return;  // maybe still queued on the owner
    }
    for (const auto& forkId : answered) self->onChildAccept(forkId);
  });
}

void RRefContext::cancelFork(const ForkData& fork) {
  if (fork.owner == rank_) {
    owners_->removeFork(fork.rrefId, fork.forkId).reset();  // dropped here, unlocked
  } else {
    users_.releaseChild(fork.forkId).reset();
  }
}

void RRefContext::confirmUser(const ForkId& forkId, std::exception_ptr error, int parent) {
  auto user = users_.takePending(forkId);
  if (error && parent >= 0) {
    TORCHRPC_WARN(workerName(), "fork " << forkId.str() << " of an RRef owned by "
                                        << (user ? workerLabel(user->owner()) : "?")
                                        << " was not confirmed: " << common::errorParts(error).message);
  }
  // Confirmed even on error, so that it can be released (its USER_DELETE
  // then fails the same way, quietly).
  auto creation = user ? user->confirm() : nullptr;
  if (parent >= 0) {
    sendTracked(parent, idsMessage(message::MessageType::kRRefChildAccept, forkId), kProtocolTimeoutSeconds, "rref",
                "CHILD_ACCEPT", nullptr);
  }
  user.reset();  // may be the last reference: sends USER_DELETE
  if (creation) creation->markCompleted(c10::IValue());
}

// ---- sending -------------------------------------------------------------------------

RRefContext::FuturePtr RRefContext::sendTracked(int dst, message::Message&& m, double timeoutSeconds,
                                                const std::string& callKind, const std::string& what,
                                                std::function<void(std::exception_ptr)> then, bool thenWhereAnswered) {
  auto token = inFlight_.begin();
  auto future = agent_->send(dst, std::move(m), timeoutSeconds, callKind, what);
  std::weak_ptr<RRefContext> weak = shared_from_this();
  future->addCallback([weak, token, then = std::move(then), thenWhereAnswered](c10::ivalue::Future& f) mutable {
    auto self = weak.lock();
    if (!self || !then) return;  // nothing follows (USER_DELETE, CHILD_ACCEPT): no pool hop
    std::exception_ptr error = f.hasError() ? f.exception_ptr() : nullptr;
    auto task = [self, token, then = std::move(then), error] {
      try {
        then(error);
      } catch (const std::exception& e) {
        TORCHRPC_WARN(self->workerName(), "RRef protocol step failed: " << e.what());
      }
    };
    // A follow-up that may send (and so connect) runs on the pool, never on
    // the I/O thread; one that only sets state runs where the answer came.
    if (self->stopped_ || thenWhereAnswered) {
      task();
    } else {
      self->agent_->pool().run(std::move(task));
    }
  });
  return future;
}

void RRefContext::sendTrackedSoon(int dst, message::Message&& m, const std::string& what,
                                  std::function<void(std::exception_ptr)> then) {
  // At once where that cannot wait: waking a pool thread for it took the
  // core from the thread that goes on (often the next call's issuer).
  if (!agent_->onLoop() && agent_->sendsAtOnce(dst, m.payload.size())) {
    sendTracked(dst, std::move(m), kProtocolTimeoutSeconds, "rref", what, std::move(then));
    return;
  }
  auto token = inFlight_.begin();  // counted from now, so waitIdle() cannot miss it
  agent_->pool().run([self = shared_from_this(), token, dst, m = std::move(m), what, then]() mutable {
    self->sendTracked(dst, std::move(m), kProtocolTimeoutSeconds, "rref", what, then);
  });
}

// ---- bounds on what peers make on demand ---------------------------------------------

double RRefContext::awaitedLifetimeSeconds() const {
  const double configured = defaultTimeoutSeconds();
  return configured > 0 ? configured : kAwaitedFallbackSeconds;
}

std::shared_ptr<OwnerRRef> RRefContext::awaitedOwner(const RRefId& id, int requester) {
  bool created = false;
  auto owner = owners_->awaited(id, requester, &created);
  if (created) expireLater(owner);
  return owner;
}

namespace {

// Fails a value that will never be created, which answers every request
// waiting for it (fetches, method calls) with `why`.
void failAwaited(OwnerRRef& owner, const std::string& type, const std::string& why, const std::string& worker) {
  if (owner.value()->completed()) return;
  owner.setError(message::RemoteException{type, why, "", "waiting for RRef " + owner.id().str(), worker});
}

}  // namespace

void RRefContext::expireLater(const std::shared_ptr<OwnerRRef>& owner) {
  const double seconds = awaitedLifetimeSeconds();
  std::weak_ptr<RRefContext> weak = weak_from_this();
  std::weak_ptr<OwnerRRef> weakOwner = owner;
  const auto timer = expiries_.after(seconds, [weak, weakOwner, id = owner->id(), seconds] {
    auto self = weak.lock();
    auto current = weakOwner.lock();
    if (!self || !current) return;  // answered and dropped already
    auto expired = self->owners_->expire(id, current.get());
    if (!expired) return;  // its creation started meanwhile
    failAwaited(*expired, "torchrpc.errors.RpcTimeoutError",
                "RRef " + id.str() + " was asked for, but the call that creates it did not reach " +
                    self->workerName() + " within " + common::secondsText(seconds) +
                    " s (the owner's rpc_timeout); was the remote() that makes it sent, and is its sender alive?",
                self->workerName());
  });
  // Its creation may have started meanwhile: then it never expires.
  if (!owners_->setExpiry(owner->id(), owner.get(), timer)) expiries_.cancel(timer);
}

void RRefContext::releasePeer(int rank) {
  size_t forks = 0;
  auto erased = owners_->releasePeer(rank, &forks);
  auto children = users_.releaseChildrenOf(rank);  // sent to it, never to be confirmed
  const std::string peer = workerLabel(rank);
  for (auto& owner : erased) {
    failAwaited(*owner, "torchrpc.errors.PeerUnreachableError",
                "RRef " + owner->id().str() + " was asked for by " + peer +
                    ", which was lost before the call that creates it reached " + workerName(),
                workerName());
  }
  if (forks || !erased.empty() || !children.empty()) {
    TORCHRPC_WARN(workerName(), peer << " was lost without shutting down: released the " << forks
                                     << " RRef fork(s) it held here and " << children.size()
                                     << " sent to it unconfirmed; " << erased.size()
                                     << " owner entr(ies) it alone kept were dropped");
  }
  // Unlocked. PeerWatch's timer thread runs this, and must not wait for the GIL.
  for (auto& owner : erased) releaseOwner(owner);
  erased.clear();
  children.clear();
}

// ---- shutdown and introspection -----------------------------------------------------

void RRefContext::releaseAllUsers() {
  for (auto& u : users_.live()) {
    if (!u->confirmed() || !u->markDeleted()) continue;
    // An owner that is gone fails it; nothing is left to release there.
    sendTracked(u->owner(), idsMessage(message::MessageType::kRRefUserDelete, u->id(), u->forkId()), kProtocolTimeoutSeconds,
                "rref", "USER_DELETE", nullptr);
  }
}

size_t RRefContext::waitIdle(double timeoutSeconds) {
  const auto start = std::chrono::steady_clock::now();
  const size_t left = inFlight_.waitIdle(timeoutSeconds);
  // What the protocol let go of may still be on its way to rpc-drop (releaseOwner).
  const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
  common::waitDropped(std::max(0.0, timeoutSeconds - spent.count()));
  return left;
}

void RRefContext::stop() {
  stopped_ = true;
  expiries_.stop();
  auto owners = owners_->clear();
  auto users = users_.clear();
  // Dropped here, unlocked; user destructors see the cleared table and send nothing.
}

RRefContext::Snapshot RRefContext::snapshot() const {
  Snapshot s;
  s.owners = owners_->entries();
  s.localOwners = owners_->objects();
  s.users = users_.users();
  s.pendingUsers = users_.pendingUsers();
  s.pendingChildren = users_.children();
  s.inFlight = inFlight_.count();
  return s;
}

}  // namespace torchrpc::rref
