#include "rref/rref_context.h"

#include <chrono>

#include "common/error.h"
#include "common/logging.h"
#include "message/payload.h"
#include "rref/rref_messages.h"
#include "script_dispatch/run_script.h"

namespace torchrpc::rref {

namespace {

// The answer to a request for a value whose creation failed: the owner's
// recorded error (it names the worker and the creating function), else the
// future's own.
Message creationFailure(uint64_t id, const OwnerRRef* owner, const c10::ivalue::Future& value,
                        const std::string& what, const std::string& worker) {
  auto error = owner ? owner->error() : std::nullopt;
  return exceptionMessage(id, error ? *error : describeException(value.exception_ptr(), what, worker));
}

// Protocol messages (fork requests, deletes, accepts) are tiny; a peer that
// does not answer within this long is gone or wedged.
constexpr double kProtocolTimeoutSeconds = 120.0;

std::pair<int, std::string> describeError(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const RpcError& e) {
    return {static_cast<int>(e.kind()), e.message()};
  } catch (const c10::Error& e) {
    return {static_cast<int>(ErrorKind::kGeneric), e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {static_cast<int>(ErrorKind::kGeneric), e.what()};
  } catch (...) {
    return {static_cast<int>(ErrorKind::kGeneric), "unknown error"};
  }
}

}  // namespace

namespace {
std::mutex currentMutex;
std::weak_ptr<RRefContext> currentContext;
}  // namespace

std::shared_ptr<RRefContext> RRefContext::create(std::shared_ptr<Agent> agent) {
  std::shared_ptr<RRefContext> ctx(new RRefContext(std::move(agent)));
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

RRefContext::RRefContext(std::shared_ptr<Agent> agent)
    : agent_(std::move(agent)), rank_(agent_->options().rank) {}

RRefContext::~RRefContext() = default;

void RRefContext::setPythonRunner(PythonRunner runner) { pythonRunner_ = std::move(runner); }
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

void RRefContext::installHandlers() {
  std::weak_ptr<RRefContext> weak = shared_from_this();
  const std::string worker = workerName();
  auto install = [&](MessageType type) {
    agent_->setHandler(type, [weak, worker, type](Message&& request, int callerRank,
                                                  Agent::Responder respond) {
      const uint64_t id = request.id;
      auto self = weak.lock();
      if (!self) {
        respond(exceptionMessage(id, RemoteException{"RuntimeError",
                                                     "RRefs are not served on " + worker +
                                                         " any more (torchrpc shut down)",
                                                     "", messageTypeName(type), worker}));
        return;
      }
      try {
        GlobalId a, b;
        switch (type) {
          // A copy of respond: the catch below answers with it if they throw.
          case MessageType::kRemoteCall:
            self->handleRemoteCall(std::move(request), callerRank, respond);
            return;
          case MessageType::kRRefFetch:
            self->handleFetch(std::move(request), respond);
            return;
          case MessageType::kRRefMethodCall:
            self->handleMethodCall(std::move(request), respond);
            return;
          case MessageType::kRRefUserDelete:
            parseIds(request, &a, &b);
            self->onUserDelete(a, b);
            break;
          case MessageType::kRRefForkRequest:
            parseIds(request, &a, &b);
            self->onForkRequest(a, b);
            break;
          case MessageType::kRRefChildAccept:
            parseIds(request, &a);
            self->onChildAccept(a);
            break;
          default:
            TORCH_CHECK(false, "not an RRef message: ", messageTypeName(type));
        }
        respond(ackMessage(id));
      } catch (...) {
        respond(exceptionMessage(
            id, describeException(std::current_exception(), messageTypeName(type), worker)));
      }
    });
  };
  install(MessageType::kRemoteCall);
  install(MessageType::kRRefFetch);
  agent_->setFastPath(MessageType::kRRefFetch, [weak](const Message& request, const Agent::Responder& respond) {
    auto self = weak.lock();
    return self && self->fetchAtOnce(request, respond);
  });
  install(MessageType::kRRefUserDelete);
  agent_->setFastPath(MessageType::kRRefUserDelete,
                      [weak](const Message& request, const Agent::Responder& respond) {
                        auto self = weak.lock();
                        return self && self->deleteAtOnce(request, respond);
                      });
  install(MessageType::kRRefForkRequest);
  install(MessageType::kRRefChildAccept);
  install(MessageType::kRRefMethodCall);
}

// ---- owner table -------------------------------------------------------------

RRefContext::OwnerEntry& RRefContext::ownerEntryLocked(const RRefId& id) {
  auto& entry = owners_[id];
  if (!entry.rref) {
    entry.rref = std::make_shared<OwnerRRef>(weak_from_this(), rank_, id);
    ownerObjects_[id] = entry.rref.get();
  }
  return entry;
}

std::shared_ptr<OwnerRRef> RRefContext::maybeEraseLocked(const RRefId& id) {
  auto it = owners_.find(id);
  if (it == owners_.end() || !it->second.forks.empty() || it->second.creating) return nullptr;
  auto rref = std::move(it->second.rref);
  owners_.erase(it);
  return rref;
}

void RRefContext::forgetOwner(const RRefId& id, const OwnerRRef* owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ownerObjects_.find(id);
  if (it != ownerObjects_.end() && it->second == owner) ownerObjects_.erase(it);
}

std::shared_ptr<OwnerRRef> RRefContext::createOwner(c10::IValue value) {
  auto owner = std::make_shared<OwnerRRef>(weak_from_this(), rank_, newId());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ownerObjects_[owner->id()] = owner.get();
  }
  owner->setValue(std::move(value));
  return owner;
}

// ---- remote() ------------------------------------------------------------------

void RRefContext::runCreation(const std::shared_ptr<OwnerRRef>& owner, Message&& call,
                              int callerRank, std::function<void()> done) {
  auto onValue = [owner, done](c10::IValue value) {
    owner->setValue(std::move(value));
    done();
  };
  auto onError = [owner, done](const RemoteException& error) {
    owner->setError(error);
    done();
  };
  if (call.type == MessageType::kPythonCall) {
    if (!pythonRunner_) {
      onError(RemoteException{"RuntimeError", "no Python runner installed on " + workerName(), "",
                              "<python call>", workerName()});
      return;
    }
    pythonRunner_(std::move(call), callerRank, onValue, onError);
    return;
  }
  Agent* agent = agent_.get();
  script_dispatch::run(
      std::move(call), agent_->registry(),
      [agent](std::function<void()> fn) { agent->pool().run(std::move(fn)); }, workerName(),
      [onValue, onError, worker = workerName()](Message&& response) {
        if (response.type == MessageType::kScriptRet) {
          c10::IValue value;
          try {
            value = messageIValue(response);
          } catch (...) {
            onError(describeException(std::current_exception(), "<decode result>", worker));
            return;
          }
          onValue(std::move(value));
        } else {
          onError(messageException(response));
        }
      });
}

std::shared_ptr<RRef> RRefContext::remote(int dst, Message&& call, double timeoutSeconds,
                                          const std::string& function) {
  const RRefId rrefId = newId();
  auto self = shared_from_this();
  if (dst == rank_) {
    // The owner is this worker: no message, the value is created on the pool.
    std::shared_ptr<OwnerRRef> owner;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& entry = ownerEntryLocked(rrefId);
      entry.creating = true;
      owner = entry.rref;
    }
    {
      std::lock_guard<std::mutex> lock(idleMutex_);
      ++inFlight_;
    }
    agent_->pool().run([self, owner, rrefId, call = std::move(call)]() mutable {
      self->runCreation(owner, std::move(call), self->rank_, [self, rrefId] {
        std::shared_ptr<OwnerRRef> drop;
        {
          std::lock_guard<std::mutex> lock(self->mutex_);
          auto it = self->owners_.find(rrefId);
          if (it != self->owners_.end()) it->second.creating = false;
          drop = self->maybeEraseLocked(rrefId);
        }
        drop.reset();
        std::lock_guard<std::mutex> lock(self->idleMutex_);
        if (--self->inFlight_ == 0) self->idleCv_.notify_all();
      });
    });
    return owner;
  }
  const ForkId forkId = newId();
  auto user = std::make_shared<UserRRef>(weak_from_this(), dst, rrefId, forkId, false);
  if (timeoutSeconds > 0) {
    user->setCreationDeadline(std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(timeoutSeconds)));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    users_[forkId] = user;
    pendingUsers_[forkId] = user;
  }
  std::weak_ptr<UserRRef> weakUser = user;
  try {
    sendTracked(dst, remoteCallMessage(rrefId, forkId, std::move(call)), timeoutSeconds,
                "remote", function, [self, forkId, weakUser](std::exception_ptr error) {
                  if (error) {
                    // The owner may never have seen the call; to_here reports this.
                    if (auto u = weakUser.lock()) {
                      auto [kind, message] = describeError(error);
                      u->setCreationError(kind, message);
                    }
                  }
                  self->confirmUser(forkId, error, -1);
                });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pendingUsers_.erase(forkId);
      users_.erase(forkId);
    }
    user->markDeleted();  // the owner never heard of it: nothing to delete
    throw;
  }
  return user;
}

void RRefContext::handleRemoteCall(Message&& request, int callerRank, Agent::Responder respond) {
  RRefId rrefId;
  ForkId forkId;
  Message call = parseRemoteCall(std::move(request), &rrefId, &forkId);
  const uint64_t id = call.id;
  std::shared_ptr<OwnerRRef> owner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& entry = ownerEntryLocked(rrefId);
    entry.forks.insert(forkId);  // the caller's UserRRef (Early Fork Registration)
    entry.creating = true;
    owner = entry.rref;
  }
  TORCH_CHECK(!owner->value()->completed(), "RRef ", rrefId.str(), " was already created on ",
              workerName());
  {
    // A value being created counts as protocol work in flight (waitIdle,
    // graceful shutdown), also after its caller stopped waiting.
    std::lock_guard<std::mutex> lock(idleMutex_);
    ++inFlight_;
  }
  auto self = shared_from_this();
  runCreation(owner, std::move(call), callerRank, [self, rrefId, id, respond] {
    {
      std::shared_ptr<OwnerRRef> drop;
      {
        std::lock_guard<std::mutex> lock(self->mutex_);
        auto it = self->owners_.find(rrefId);
        if (it != self->owners_.end()) it->second.creating = false;
        drop = self->maybeEraseLocked(rrefId);
      }
    }
    respond(ackMessage(id));
    std::lock_guard<std::mutex> lock(self->idleMutex_);
    if (--self->inFlight_ == 0) self->idleCv_.notify_all();
  });
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
  return agent_->send(rref->owner(), idsMessage(MessageType::kRRefFetch, rref->id()),
                      timeoutSeconds, "to_here", "RRef " + rref->id().str());
}

Message RRefContext::encodeValue(uint64_t id, const c10::IValue& value) {
  if (value.isPyObject()) {
    TORCH_CHECK(pythonEncoder_, "no Python encoder installed on ", workerName());
    return pythonEncoder_(id, value);
  }
  return ivalueMessage(MessageType::kScriptRet, id, c10::ivalue::Tuple::create({value}));
}

RRefContext::FuturePtr RRefContext::methodCall(const std::shared_ptr<RRef>& rref, Message&& call,
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

void RRefContext::handleMethodCall(Message&& request, Agent::Responder respond) {
  const uint64_t id = request.id;
  MethodCall call = parseMethodCall(request);
  std::shared_ptr<OwnerRRef> owner;
  {
    // Created on demand, as for a fetch: the call may run before the REMOTE_CALL.
    std::lock_guard<std::mutex> lock(mutex_);
    owner = ownerEntryLocked(call.rrefId).rref;
  }
  const std::string what = call.name + "() of RRef " + call.rrefId.str();
  // Waited for here, not in a callback as handleFetch does: the method must
  // run on this thread, where the call's autograd context is current.
  if (!owner->waitValue(defaultTimeoutSeconds())) {
    respond(exceptionMessage(id, RemoteException{"torchrpc.errors.RpcTimeoutError",
                                                 "the value of RRef " + call.rrefId.str() + " was not created on " +
                                                     workerName() + " within " +
                                                     std::to_string(defaultTimeoutSeconds()) + " s",
                                                 "", what, workerName()}));
    return;
  }
  const auto& value = owner->value();
  if (value->hasError()) {
    respond(creationFailure(id, owner.get(), *value, what, workerName()));
    return;
  }
  TORCH_CHECK(pythonMethodRunner_, "cannot run ", what, ": ", workerName(),
              " runs no Python (a C++ worker); its RRefs' methods cannot be called through proxies, "
              "call its TorchScript functions instead");
  pythonMethodRunner_(id, value->value(), call.name, call.args, call.kwargs, std::move(respond));
}

bool RRefContext::fetchAtOnce(const Message& request, const Agent::Responder& respond) {
  RRefId rrefId;
  std::shared_ptr<OwnerRRef> owner;
  try {
    parseIds(request, &rrefId);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return false;
    // Created on demand: the fetch may come before the call that creates it.
    owner = ownerEntryLocked(rrefId).rref;
  } catch (...) {
    return false;  // the pool's handler reports it
  }
  answerFetch(request.id, rrefId, owner, respond, /*onPool=*/false);
  return true;
}

void RRefContext::handleFetch(Message&& request, Agent::Responder respond) {
  RRefId rrefId;
  parseIds(request, &rrefId);
  std::shared_ptr<OwnerRRef> owner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    owner = ownerEntryLocked(rrefId).rref;
  }
  answerFetch(request.id, rrefId, owner, respond, /*onPool=*/true);
}

void RRefContext::answerFetch(uint64_t id, const RRefId& rrefId, const std::shared_ptr<OwnerRRef>& owner,
                              const Agent::Responder& respond, bool onPool) {
  std::weak_ptr<RRefContext> weak = shared_from_this();
  std::weak_ptr<OwnerRRef> weakOwner = owner;
  const std::string worker = workerName();
  // Runs where the value is there: answers it, or an error.
  auto answer = [weak, weakOwner, id, respond, worker, rrefId](const c10::ivalue::Future& f) {
    try {
      if (f.hasError()) {
        respond(creationFailure(id, weakOwner.lock().get(), f, "to_here of RRef " + rrefId.str(), worker));
        return;
      }
      auto self = weak.lock();
      TORCH_CHECK(self, "torchrpc shut down on ", worker);
      respond(self->encodeValue(id, f.constValue()));
    } catch (...) {
      respond(exceptionMessage(
          id, describeException(std::current_exception(), "to_here of RRef " + rrefId.str(), worker)));
    }
  };
  // A value that exists is answered here, at once: addCallback runs the
  // callback inline then. One not created yet is answered by the thread that
  // completes it, as a fetch handled on the pool always was. Only
  // registering here saves that fetch a pool thread of its own: while the
  // creation ran on the first, the fetch needed a second one, a wake-up
  // (~50 us here) on the caller's path in about half the process pairs
  // (remote() + to_here() of a script function read 96-113 instead of
  // 41-55 us, for the pair's lifetime).
  auto adding = std::make_shared<std::atomic<bool>>(true);  // the callback runs here, inline
  owner->value()->addCallback([weak, answer, onPool, adding](c10::ivalue::Future& f) {
    // Off the pool (the I/O thread), a Python value or an error, which may
    // need the GIL, is answered on the pool.
    if (adding->load() && !onPool && (f.hasError() || f.constValue().isPyObject())) {
      auto value = c10::intrusive_ptr<c10::ivalue::Future>::reclaim_copy(&f);
      if (auto self = weak.lock()) self->agent_->pool().run([answer, value] { answer(*value); });
      return;
    }
    answer(f);
  });
  adding->store(false);
}

// ---- forks -------------------------------------------------------------------------

ForkData RRefContext::fork(const std::shared_ptr<RRef>& rref, int requestTo) {
  TORCH_CHECK(rref->context().get() == this,
              "this RRef belongs to an earlier torchrpc session (before shutdown); it cannot be sent");
  const ForkId forkId = newId();
  std::lock_guard<std::mutex> lock(mutex_);
  if (rref->isOwner()) {
    auto& entry = owners_[rref->id()];
    if (!entry.rref) entry.rref = std::static_pointer_cast<OwnerRRef>(rref);
    entry.forks.insert(forkId);
  } else {
    auto user = std::static_pointer_cast<UserRRef>(rref);
    TORCH_CHECK(!user->deleted(), "RRef ", rref->id().str(),
                " was already released (torchrpc is shutting down); it cannot be sent");
    pendingChildren_[forkId] = rref;
  }
  const bool answered = !rref->isOwner() && requestTo == rref->owner();
  return ForkData{rref->owner(), rref->id(), forkId, rank_, answered};
}

std::shared_ptr<RRef> RRefContext::receive(const ForkData& fork) {
  if (fork.owner == rank_) {
    std::shared_ptr<OwnerRRef> owner, drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& entry = ownerEntryLocked(fork.rrefId);
      owner = entry.rref;
      if (fork.parent == rank_) {
        // Sent to ourselves: the fork added while pickling has no user.
        entry.forks.erase(fork.forkId);
        drop = maybeEraseLocked(fork.rrefId);
      }
    }
    if (fork.parent != rank_ && !fork.answered) {
      // A user sent the owner its own RRef: the parent may let go of its copy.
      sendTrackedLater(fork.parent, idsMessage(MessageType::kRRefChildAccept, fork.forkId),
                       "CHILD_ACCEPT", nullptr);
    }
    return owner;
  }
  const bool parentIsOwner = fork.parent == fork.owner;
  auto user = std::make_shared<UserRRef>(weak_from_this(), fork.owner, fork.rrefId, fork.forkId,
                                         /*confirmed=*/parentIsOwner);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    users_[fork.forkId] = user;
    if (!parentIsOwner) pendingUsers_[fork.forkId] = user;
  }
  if (!parentIsOwner) {
    auto self = shared_from_this();
    ForkId forkId = fork.forkId;
    int parent = fork.parent;
    sendTrackedLater(fork.owner, idsMessage(MessageType::kRRefForkRequest, fork.rrefId, fork.forkId),
                     "FORK_REQUEST", [self, forkId, parent](std::exception_ptr error) {
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
    if (done.hasError() &&
        describeError(done.exception_ptr()).first == static_cast<int>(ErrorKind::kTimeout)) {
      return;  // maybe still queued on the owner
    }
    for (const auto& forkId : answered) self->onChildAccept(forkId);
  });
}

void RRefContext::cancelFork(const ForkData& fork) {
  std::shared_ptr<OwnerRRef> dropOwner;
  std::shared_ptr<RRef> dropChild;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fork.owner == rank_) {
      auto it = owners_.find(fork.rrefId);
      if (it != owners_.end()) it->second.forks.erase(fork.forkId);
      dropOwner = maybeEraseLocked(fork.rrefId);
    } else {
      auto it = pendingChildren_.find(fork.forkId);
      if (it != pendingChildren_.end()) {
        dropChild = std::move(it->second);
        pendingChildren_.erase(it);
      }
    }
  }
}

void RRefContext::confirmUser(const ForkId& forkId, std::exception_ptr error, int parent) {
  std::shared_ptr<UserRRef> user;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pendingUsers_.find(forkId);
    if (it != pendingUsers_.end()) {
      user = std::move(it->second);
      pendingUsers_.erase(it);
    }
  }
  if (error && parent >= 0) {
    TORCHRPC_WARN(workerName(), "fork " << forkId.str() << " of an RRef owned by "
                                        << (user ? workerLabel(user->owner()) : "?")
                                        << " was not confirmed: " << describeError(error).second);
  }
  // Confirmed even on error, so that it can be released (its USER_DELETE
  // then fails the same way, quietly).
  if (user) user->confirm();
  if (parent >= 0) {
    sendTracked(parent, idsMessage(MessageType::kRRefChildAccept, forkId), kProtocolTimeoutSeconds,
                "rref", "CHILD_ACCEPT", nullptr);
  }
  user.reset();  // may be the last reference: sends USER_DELETE
}

// ---- handlers ----------------------------------------------------------------------

void RRefContext::onForkRequest(const RRefId& rrefId, const ForkId& forkId) {
  std::lock_guard<std::mutex> lock(mutex_);
  ownerEntryLocked(rrefId).forks.insert(forkId);
}

void RRefContext::onUserDelete(const RRefId& rrefId, const ForkId& forkId) {
  std::shared_ptr<OwnerRRef> drop;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owners_.find(rrefId);
    if (it == owners_.end() || it->second.forks.erase(forkId) == 0) {
      TORCHRPC_DEBUG(workerName(), "USER_DELETE of unknown fork " << forkId.str() << " of RRef "
                                                                  << rrefId.str());
      return;
    }
    drop = maybeEraseLocked(rrefId);
  }
  // `drop` may hold the last reference to the value: freed here, unlocked.
}

namespace {

// Whether freeing `v` needs no GIL and is cheap enough for the I/O thread:
// TorchScript values (no Python object inside), tensors up to 1 MB.
bool freesAtOnce(const c10::IValue& v, int depth = 0) {
  if (depth > 4) return false;
  if (v.isNone() || v.isInt() || v.isDouble() || v.isBool() || v.isString()) return true;
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    return !t.defined() || !t.has_storage() || t.storage().nbytes() <= (1u << 20);
  }
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (!freesAtOnce(e, depth + 1)) return false;
    }
    return true;
  }
  if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (!freesAtOnce(e, depth + 1)) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

bool RRefContext::deleteAtOnce(const Message& request, const Agent::Responder& respond) {
  GlobalId rrefId, forkId;
  try {
    parseIds(request, &rrefId, &forkId);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return false;
    auto it = owners_.find(rrefId);
    if (it == owners_.end() || !it->second.forks.count(forkId) || !it->second.rref) return false;
    // A completed value stays what it is: still freeable below.
    const auto& value = it->second.rref->value();
    if (!value->completed() || value->hasError() || !freesAtOnce(value->constValue())) return false;
  } catch (...) {
    return false;  // the pool's handler reports it
  }
  onUserDelete(rrefId, forkId);
  respond(ackMessage(request.id));
  return true;
}

void RRefContext::onChildAccept(const ForkId& forkId) {
  std::shared_ptr<RRef> drop;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pendingChildren_.find(forkId);
    if (it == pendingChildren_.end()) return;
    drop = std::move(it->second);
    pendingChildren_.erase(it);
  }
  drop.reset();  // may be the last reference: sends USER_DELETE, unlocked
}

void RRefContext::userReleased(UserRRef& user) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = users_.find(user.forkId());
    if (it != users_.end() && it->second.expired()) users_.erase(it);
    if (stopped_) return;
  }
  if (!user.confirmed() || !user.markDeleted()) return;
  // Sent from the pool: the last handle often dies in Python, with the GIL
  // held, and sending may block (connecting, backpressure).
  {
    std::lock_guard<std::mutex> lock(idleMutex_);
    ++inFlight_;  // counted from now, so waitIdle() cannot miss it
  }
  auto self = shared_from_this();
  agent_->pool().run([self, owner = user.owner(), rrefId = user.id(), forkId = user.forkId()] {
    try {
      self->sendTracked(owner, idsMessage(MessageType::kRRefUserDelete, rrefId, forkId),
                        kProtocolTimeoutSeconds, "rref", "USER_DELETE", nullptr);
    } catch (const std::exception& e) {
      TORCHRPC_WARN(self->workerName(), "cannot send USER_DELETE of RRef " << rrefId.str() << ": "
                                                                         << e.what());
    }
    std::lock_guard<std::mutex> lock(self->idleMutex_);
    if (--self->inFlight_ == 0) self->idleCv_.notify_all();
  });
}

// ---- sending -------------------------------------------------------------------------

void RRefContext::sendTracked(int dst, Message&& m, double timeoutSeconds,
                              const std::string& callKind, const std::string& what,
                              std::function<void(std::exception_ptr)> then) {
  {
    std::lock_guard<std::mutex> lock(idleMutex_);
    ++inFlight_;
  }
  auto done = [this] {
    std::lock_guard<std::mutex> lock(idleMutex_);
    if (--inFlight_ == 0) idleCv_.notify_all();
  };
  FuturePtr future;
  try {
    future = agent_->send(dst, std::move(m), timeoutSeconds, callKind, what);
  } catch (...) {
    done();
    throw;
  }
  std::weak_ptr<RRefContext> weak = shared_from_this();
  future->addCallback([weak, then = std::move(then)](c10::ivalue::Future& f) mutable {
    auto self = weak.lock();
    if (!self) return;
    if (!then) {  // nothing follows (USER_DELETE, CHILD_ACCEPT): no pool hop
      std::lock_guard<std::mutex> lock(self->idleMutex_);
      if (--self->inFlight_ == 0) self->idleCv_.notify_all();
      return;
    }
    std::exception_ptr error = f.hasError() ? f.exception_ptr() : nullptr;
    auto task = [self, then = std::move(then), error] {
      try {
        then(error);
      } catch (const std::exception& e) {
        TORCHRPC_WARN(self->workerName(), "RRef protocol step failed: " << e.what());
      }
      std::lock_guard<std::mutex> lock(self->idleMutex_);
      if (--self->inFlight_ == 0) self->idleCv_.notify_all();
    };
    // Never on the I/O thread: a follow-up may send (and block on backpressure).
    if (self->stopped_) {
      task();
    } else {
      self->agent_->pool().run(std::move(task));
    }
  });
}

void RRefContext::sendTrackedLater(int dst, Message&& m, const std::string& what,
                                   std::function<void(std::exception_ptr)> then) {
  {
    std::lock_guard<std::mutex> lock(idleMutex_);
    ++inFlight_;
  }
  auto self = shared_from_this();
  agent_->pool().run([self, dst, m = std::move(m), what, then = std::move(then)]() mutable {
    try {
      self->sendTracked(dst, std::move(m), kProtocolTimeoutSeconds, "rref", what, then);
    } catch (...) {
      TORCHRPC_WARN(self->workerName(), "cannot send " << what << " to " << self->workerLabel(dst)
                                                       << ": " << describeError(std::current_exception()).second);
      try {
        if (then) then(std::current_exception());
      } catch (...) {
      }
    }
    std::lock_guard<std::mutex> lock(self->idleMutex_);
    if (--self->inFlight_ == 0) self->idleCv_.notify_all();
  });
}

// ---- shutdown and introspection -----------------------------------------------------

void RRefContext::releaseAllUsers() {
  std::vector<std::shared_ptr<UserRRef>> live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : users_) {
      if (auto u = kv.second.lock()) live.push_back(std::move(u));
    }
  }
  for (auto& u : live) {
    if (!u->confirmed() || !u->markDeleted()) continue;
    try {
      sendTracked(u->owner(), idsMessage(MessageType::kRRefUserDelete, u->id(), u->forkId()),
                  kProtocolTimeoutSeconds, "rref", "USER_DELETE", nullptr);
    } catch (const std::exception& e) {
      TORCHRPC_WARN(workerName(), "cannot send USER_DELETE of RRef " << u->id().str() << ": "
                                                                     << e.what());
    }
  }
}

size_t RRefContext::waitIdle(double timeoutSeconds) {
  std::unique_lock<std::mutex> lock(idleMutex_);
  idleCv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                   [this] { return inFlight_ == 0; });
  return inFlight_;
}

void RRefContext::stop() {
  std::unordered_map<RRefId, OwnerEntry, GlobalIdHash> owners;
  std::unordered_map<ForkId, std::shared_ptr<UserRRef>, GlobalIdHash> pendingUsers;
  std::unordered_map<ForkId, std::shared_ptr<RRef>, GlobalIdHash> pendingChildren;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    owners.swap(owners_);
    pendingUsers.swap(pendingUsers_);
    pendingChildren.swap(pendingChildren_);
  }
  // Dropped here, unlocked; user destructors see stopped_ and send nothing.
}

RRefContext::Snapshot RRefContext::snapshot() const {
  Snapshot s;
  std::vector<std::shared_ptr<UserRRef>> keep;  // dropped after the lock (destructors lock)
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, entry] : owners_) {
    std::vector<std::string> forks;
    for (const auto& f : entry.forks) forks.push_back(f.str());
    const auto& v = entry.rref->value();
    s.owners.emplace_back(id.str(), std::move(forks), v->completed() && !v->hasError(),
                          v->completed() && v->hasError());
  }
  for (const auto& kv : ownerObjects_) s.localOwners.push_back(kv.first.str());
  for (const auto& [forkId, weak] : users_) {
    if (auto u = weak.lock()) {
      s.users.emplace_back(u->id().str(), forkId.str(), u->owner(), u->confirmed(), u->deleted());
      keep.push_back(std::move(u));
    }
  }
  for (const auto& kv : pendingUsers_) s.pendingUsers.push_back(kv.first.str());
  for (const auto& kv : pendingChildren_) s.pendingChildren.push_back(kv.first.str());
  {
    std::lock_guard<std::mutex> idle(idleMutex_);
    s.inFlight = inFlight_;
  }
  return s;
}

}  // namespace torchrpc::rref
