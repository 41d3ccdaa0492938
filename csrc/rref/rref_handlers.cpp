// The owner's handlers of the RRef protocol's requests (RRefContext's, see
// rref_context.h): creating a value, answering fetches and method calls, and
// the fork bookkeeping messages.

#include "common/error.h"
#include "common/logging.h"
#include "common/python_held.h"
#include "rref/rref_context.h"
#include "rref/rref_messages.h"

namespace torchrpc::rref {

namespace {

// The answer to a request for a value whose creation failed: the owner's
// recorded error (it names the worker and the creating function), else the
// future's own.
message::Message creationFailure(uint64_t id, const OwnerRRef* owner, const c10::ivalue::Future& value,
                        const std::string& what, const std::string& worker) {
  auto error = owner ? owner->error() : std::nullopt;
  return message::exceptionMessage(id, error ? *error : message::describeException(value.exception_ptr(), what, worker));
}

}  // namespace

void RRefContext::installHandlers() {
  std::weak_ptr<RRefContext> weak = shared_from_this();
  const std::string worker = workerName();
  // An exception a handler throws is its answer (Agent::serve).
  auto install = [&](message::MessageType type) {
    agent_->setHandler(type, [weak, worker, type](message::Message&& request, int callerRank, message::Reply reply) {
      auto self = weak.lock();
      if (!self) {
        reply.error(message::RemoteException{"RuntimeError",
                                    "RRefs are not served on " + worker + " any more (torchrpc shut down)", "",
                                    message::messageTypeName(type), worker});
        return;
      }
      GlobalId a, b;
      switch (type) {
        case message::MessageType::kRemoteCall:
          self->handleRemoteCall(std::move(request), callerRank, reply);
          return;
        case message::MessageType::kRRefFetch:
          self->handleFetch(std::move(request), callerRank, reply);
          return;
        case message::MessageType::kRRefMethodCall:
          self->handleMethodCall(std::move(request), callerRank, reply);
          return;
        case message::MessageType::kRRefUserDelete:
          parseIds(request, &a, &b);
          self->onUserDelete(a, b);
          break;
        case message::MessageType::kRRefForkRequest:
          parseIds(request, &a, &b);
          self->onForkRequest(a, b, callerRank);
          break;
        case message::MessageType::kRRefChildAccept:
          parseIds(request, &a);
          self->onChildAccept(a);
          break;
        default:
          TORCH_CHECK(false, "not an RRef message: ", message::messageTypeName(type));
      }
      reply(ackMessage(reply.id()));
    });
  };
  install(message::MessageType::kRemoteCall);
  agent_->setFastPath(message::MessageType::kRemoteCall, [weak](message::Message& request, int callerRank, const message::Reply& reply) {
    auto self = weak.lock();
    return self && self->remoteAtOnce(request, callerRank, reply);
  });
  install(message::MessageType::kRRefFetch);
  agent_->setFastPath(message::MessageType::kRRefFetch, [weak](message::Message& request, int, const message::Reply& reply) {
    auto self = weak.lock();
    return self && self->fetchAtOnce(request, reply);
  });
  install(message::MessageType::kRRefUserDelete);
  agent_->setFastPath(message::MessageType::kRRefUserDelete, [weak](message::Message& request, int, const message::Reply& reply) {
    auto self = weak.lock();
    return self && self->deleteAtOnce(request, reply);
  });
  install(message::MessageType::kRRefForkRequest);
  install(message::MessageType::kRRefChildAccept);
  install(message::MessageType::kRRefMethodCall);
}

std::shared_ptr<OwnerRRef> RRefContext::startRemote(message::Message& request, int callerRank, message::Message* call) {
  RRefId rrefId;
  ForkId forkId;
  *call = parseRemoteCall(std::move(request), &rrefId, &forkId);
  // The caller's UserRRef is registered at once (Early Fork Registration).
  uint64_t expiry = 0;
  auto owner = owners_->startCreation(rrefId, &forkId, callerRank, &expiry);
  if (expiry) expiries_.cancel(expiry);  // it was awaited: created now, it never expires
  return owner;
}

void RRefContext::createAndAck(const std::shared_ptr<OwnerRRef>& owner, message::Message&& call, int callerRank,
                               InFlight::Token token, const message::Reply& reply) {
  runCreation(owner, std::move(call), callerRank, std::move(token), [reply] { reply(ackMessage(reply.id())); });
}

void RRefContext::handleRemoteCall(message::Message&& request, int callerRank, const message::Reply& reply) {
  // A value being created counts in flight (waitIdle, graceful shutdown),
  // also after its caller stopped waiting.
  auto token = inFlight_.begin();
  message::Message call;
  auto owner = startRemote(request, callerRank, &call);
  createAndAck(owner, std::move(call), callerRank, std::move(token), reply);
}

bool RRefContext::remoteAtOnce(message::Message& request, int callerRank, const message::Reply& reply) {
  // The server's global profiler records a request's work under the scope
  // the pool's dispatch gives it: the creation must run there then.
  if (agent_->scopesPlainRequests()) return false;
  try {
    (void)remoteCallType(request);
  } catch (...) {
    return false;  // malformed: the pool's handler reports it
  }
  auto token = inFlight_.begin();
  message::Message call;
  std::shared_ptr<OwnerRRef> owner;
  try {
    owner = startRemote(request, callerRank, &call);
  } catch (...) {  // created already, or this context stopped
    reply.error(message::describeException(std::current_exception(), message::messageTypeName(message::MessageType::kRemoteCall),
                                           workerName()));
    return true;
  }
  agent_->pool().run([self = shared_from_this(), owner, call = std::move(call), callerRank, token, reply]() mutable {
    self->createAndAck(owner, std::move(call), callerRank, std::move(token), reply);
  });
  return true;
}

namespace {

// Runs method `call.name` of `owner`'s value (created, or failed) and answers.
void runMethod(const MethodCall& call, const OwnerRRef& owner, const RRefContext::PythonMethodRunner& runner,
               const std::string& worker, const message::Reply& reply) {
  const std::string what = call.name + "() of RRef " + call.rrefId.str();
  const auto& value = owner.value();
  if (value->hasError()) {
    reply(creationFailure(reply.id(), &owner, *value, what, worker));
    return;
  }
  TORCH_CHECK(runner, "cannot run ", what, ": ", worker,
              " runs no Python (a C++ worker); its RRefs' methods cannot be called through proxies, "
              "call its TorchScript functions instead");
  runner(reply.id(), value->value(), call.name, call.args, call.kwargs, reply);
}

}  // namespace

void RRefContext::handleMethodCall(message::Message&& request, int callerRank, const message::Reply& reply) {
  auto call = std::make_shared<const MethodCall>(parseMethodCall(request));
  // Created on demand, as for a fetch: the call may run before the REMOTE_CALL.
  auto owner = awaitedOwner(call->rrefId, callerRank);
  TORCH_CHECK(owner, "torchrpc shut down on ", workerName());
  if (owner->value()->completed()) {
    runMethod(*call, *owner, pythonMethodRunner_, workerName(), reply);
    return;
  }
  // Not created yet: no pool thread waits for it. The thread that creates it
  // (or expires the entry) queues the method on the pool, under this
  // request's scope (its autograd context), and that answers.
  auto scope = agent::CallScope::current();
  std::weak_ptr<RRefContext> weak = weak_from_this();
  std::weak_ptr<OwnerRRef> weakOwner = owner;  // the value's own callback must not keep it alive
  const std::string worker = workerName();
  owner->value()->addCallback([weak, weakOwner, call, scope, reply, worker](c10::ivalue::Future&) {
    auto self = weak.lock();
    auto held = weakOwner.lock();  // alive: it is completing its value now
    if (!self || !held) {
      reply.error(message::RemoteException{"RuntimeError", "torchrpc shut down on " + worker, "",
                                           call->name + "() of RRef " + call->rrefId.str(), worker});
      return;
    }
    self->agent_->continueOnPool(scope, [self, held, call, reply, worker] {
      try {
        runMethod(*call, *held, self->pythonMethodRunner_, worker, reply);
      } catch (...) {
        if (!reply.answered()) {
          reply.error(message::describeException(std::current_exception(),
                                                 call->name + "() of RRef " + call->rrefId.str(), worker));
        }
      }
    });
  });
}

bool RRefContext::fetchAtOnce(const message::Message& request, const message::Reply& reply) {
  RRefId rrefId;
  try {
    parseIds(request, &rrefId);
  } catch (...) {
    return false;  // the pool's handler reports it
  }
  // An unknown id (the fetch may come before the call that creates it) is
  // the pool's: creating its entry counts against the caller's cap.
  auto owner = owners_->find(rrefId);
  if (!owner) return false;
  answerFetch(rrefId, owner, reply, /*onPool=*/false);
  return true;
}

void RRefContext::handleFetch(message::Message&& request, int callerRank, const message::Reply& reply) {
  RRefId rrefId;
  parseIds(request, &rrefId);
  auto owner = awaitedOwner(rrefId, callerRank);
  TORCH_CHECK(owner, "torchrpc shut down on ", workerName());
  answerFetch(rrefId, owner, reply, /*onPool=*/true);
}

void RRefContext::answerFetch(const RRefId& rrefId, const std::shared_ptr<OwnerRRef>& owner, const message::Reply& reply,
                              bool onPool) {
  std::weak_ptr<RRefContext> weak = shared_from_this();
  std::weak_ptr<OwnerRRef> weakOwner = owner;
  const std::string worker = workerName();
  // Runs where the value is there: answers it, or an error.
  auto answer = [weak, weakOwner, reply, worker, rrefId](const c10::ivalue::Future& f) {
    const std::string what = "to_here of RRef " + rrefId.str();
    try {
      if (f.hasError()) {
        reply(creationFailure(reply.id(), weakOwner.lock().get(), f, what, worker));
        return;
      }
      auto self = weak.lock();
      TORCH_CHECK(self, "torchrpc shut down on ", worker);
      reply(self->encodeValue(reply.id(), f.constValue()));
    } catch (...) {
      reply.error(message::describeException(std::current_exception(), what, worker));
    }
  };
  // A value that exists is answered here, at once: addCallback runs the
  // callback inline then. One not created yet is answered by the thread that
  // completes it, so the fetch needs no pool thread of its own while the
  // creation runs (a wake-up on the caller's path).
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

// ---- handlers ----------------------------------------------------------------------

void RRefContext::onForkRequest(const RRefId& rrefId, const ForkId& forkId, int holder) {
  bool created = false;
  auto owner = owners_->addFork(rrefId, forkId, holder, &created);
  if (created) expireLater(owner);
}

void RRefContext::onUserDelete(const RRefId& rrefId, const ForkId& forkId) {
  bool known = false;
  auto drop = owners_->removeFork(rrefId, forkId, &known);
  if (!known) {
    TORCHRPC_DEBUG(workerName(), "USER_DELETE of unknown fork " << forkId.str() << " of RRef " << rrefId.str());
  }
  // `drop` may hold the last reference to the value: freed here, unlocked,
  // unless this is the I/O thread (deleteAtOnce) and that could take the GIL.
  if (agent_->onLoop()) releaseOwner(drop);
}

namespace {

// Whether freeing `v` needs no GIL and is cheap enough for the I/O thread:
// TorchScript values, tensors up to 1 MB, none of it held by Python (an
// `RRef(t)` of Python's, or a value Python fetched on its owner: see
// common/python_held.h).
bool freesAtOnce(const c10::IValue& v, int depth = 0) {
  if (depth > 4) return false;
  if (v.isNone() || v.isInt() || v.isDouble() || v.isBool() || v.isString()) return true;
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (common::pythonHeld(t)) return false;
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

bool RRefContext::deleteAtOnce(const message::Message& request, const message::Reply& reply) {
  GlobalId rrefId, forkId;
  try {
    parseIds(request, &rrefId, &forkId);
  } catch (...) {
    return false;  // the pool's handler reports it
  }
  auto owner = owners_->withFork(rrefId, forkId);
  if (!owner) return false;
  // A completed value stays what it is: still freeable below.
  const auto& value = owner->value();
  if (!value->completed() || value->hasError() || !freesAtOnce(value->constValue())) return false;
  owner.reset();  // the table's reference is the one that counts
  onUserDelete(rrefId, forkId);
  reply(ackMessage(reply.id()));
  return true;
}

void RRefContext::onChildAccept(const ForkId& forkId) {
  users_.releaseChild(forkId).reset();  // may be the last reference: sends USER_DELETE, unlocked
}

void RRefContext::userReleased(UserRRef& user) {
  if (!users_.forget(user.forkId())) return;  // stopped: nothing is sent any more
  if (!user.confirmed() || !user.markDeleted()) return;
  // The last handle often dies in Python, with the GIL held.
  sendTrackedSoon(user.owner(), idsMessage(message::MessageType::kRRefUserDelete, user.id(), user.forkId()), "USER_DELETE",
                  nullptr);
}

}  // namespace torchrpc::rref
