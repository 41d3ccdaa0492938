#include "jit_ops/script_rref.h"

#include "common/error.h"
#include "common/spin.h"
#include "jit_ops/rpc_ops.h"
#include "message/payload.h"
#include "rref/rref_context.h"

namespace torchrpc::jit_ops {

namespace {

std::shared_ptr<rref::RRefContext> contextOf(const rref::RRef& r, const char* what) {
  auto ctx = r.context();
  if (!ctx) {
    throw common::RpcError(common::ErrorKind::kShutdown,
                   std::string("RRef.") + what + "(): RRef " + r.id().str() +
                       " belongs to a torchrpc session that has shut down; it cannot be used any more");
  }
  return ctx;
}

// The owner's value once created (rethrows the creation error), waiting at
// most `seconds` (0: no limit).
c10::IValue ownerValue(const rref::OwnerRRef& owner, const rref::RRefContext& ctx, double seconds,
                       const char* what) {
  if (!owner.waitValue(seconds)) {
    throw common::RpcError(common::ErrorKind::kTimeout, std::string("RRef.") + what + "(): the value of RRef " +
                                            owner.id().str() + " was not created on " +
                                            ctx.workerName() + " within " + common::secondsText(seconds) +
                                            " s (timeout= argument, default RpcOptions.rpc_timeout)");
  }
  return owner.value()->value();  // rethrows the creation error, which names the owner
}

}  // namespace

ScriptRRef::ScriptRRef(std::shared_ptr<rref::RRef> rref) : rref_(std::move(rref)) {
  TORCH_INTERNAL_ASSERT(rref_);
}

std::string ScriptRRef::ownerName() const {
  auto ctx = rref_->context();
  return ctx ? ctx->workerLabel(rref_->owner()) : "rank " + std::to_string(rref_->owner());
}

c10::IValue ScriptRRef::localValue() const {
  auto ctx = contextOf(*rref_, "local_value");
  TORCH_CHECK(rref_->isOwner(), "RRef.local_value() can only be called on the owner of an RRef; RRef ",
              rref_->id().str(), " is owned by ", ctx->workerLabel(rref_->owner()),
              " and this worker is ", ctx->workerName(), ". Use to_here() to copy the value here.");
  return ownerValue(static_cast<const rref::OwnerRRef&>(*rref_), *ctx,
                    ctx->defaultTimeoutSeconds(), "local_value");
}

c10::IValue ScriptRRef::toHere(double timeout) const {
  auto ctx = contextOf(*rref_, "to_here");
  const double seconds = resolveTimeout(timeout, ctx->defaultTimeoutSeconds());
  if (rref_->isOwner()) {
    return ownerValue(static_cast<const rref::OwnerRRef&>(*rref_), *ctx, seconds, "to_here");
  }
  auto user = std::static_pointer_cast<rref::UserRRef>(rref_);
  if (auto failure = user->creationError()) {
    throw common::RpcError(static_cast<common::ErrorKind>(failure->first),
                   "remote() of RRef " + user->id().str() + " on " + ctx->workerLabel(user->owner()) +
                       " failed: " + failure->second);
  }
  auto future = ctx->fetch(user, seconds);
  common::spinThenWait(*future);  // the agent's deadline completes it
  const auto& value = future->value();  // rethrows the owner's error
  const auto& elements = value.toTupleRef().elements();
  // (value) for an IValue; (pickle, tensors) for a Python object (rref_context.h)
  TORCH_CHECK(elements.size() == 1, "RRef.to_here(): the value of RRef ", user->id().str(), " on ",
              ctx->workerLabel(user->owner()),
              " is a Python object (made by a Python function), which TorchScript cannot receive. "
              "Create it with a TorchScript function or a builtin, or call to_here() from Python.");
  return elements[0];
}

c10::IValue scriptRRef(std::shared_ptr<rref::RRef> rref) {
  return c10::IValue(c10::make_intrusive<ScriptRRef>(std::move(rref)));
}

std::shared_ptr<rref::RRef> rrefOf(const c10::IValue& value) {
  if (!value.isObject()) return nullptr;
  const auto& type = c10::getCustomClassType<c10::intrusive_ptr<ScriptRRef>>();
  if (value.toObjectRef().type() != type) return nullptr;
  return value.toCustomClass<ScriptRRef>()->rref();
}

bool containsRRef(const c10::IValue& value) {
  if (value.isTensor() || value.isNone() || value.isInt() || value.isDouble() || value.isBool() ||
      value.isString()) {
    return false;  // the usual results, decided without a walk
  }
  bool found = false;
  value.visit([&found](const c10::IValue& v) {
    if (!found && rrefOf(v)) found = true;
    return found;  // true stops descending
  });
  return found;
}

void defineScriptRRef(torch::Library& m) {
  m.class_<ScriptRRef>("RRef")
      .def("to_here", &ScriptRRef::toHere, "the value, copied from the owner (on the owner: the value)",
           {torch::arg("timeout") = -1.0})
      .def("local_value", &ScriptRRef::localValue, "the value itself; owner only")
      .def("owner_name", &ScriptRRef::ownerName)
      .def("is_owner", &ScriptRRef::isOwner)
      .def("confirmed_by_owner", &ScriptRRef::confirmedByOwner)
      .def_pickle(
          // The sender: a fork of the RRef (see the header).
          [](const c10::intrusive_ptr<ScriptRRef>& self) -> std::vector<int64_t> {
            message::PickleScope* scope = message::PickleScope::current();
            TORCH_CHECK(scope,
                        "an RRef can only be pickled by torchrpc, as an argument or result of an RPC; it "
                        "cannot be saved (torch.jit.save) or copied by other means. Keep the owner's "
                        "name and create the RRef after loading instead.");
            auto ctx = contextOf(*self->rref(), "__getstate__");
            rref::ForkData fork = ctx->fork(self->rref());
            std::weak_ptr<rref::RRefContext> weak = ctx;
            scope->onAbort([weak, fork] {
              if (auto c = weak.lock()) c->cancelFork(fork);
            });
            return fork.toInts();
          },
          // The receiver: its RRef for the fork.
          [](std::vector<int64_t> state) -> c10::intrusive_ptr<ScriptRRef> {
            TORCH_CHECK(message::UnpickleScope::active(),
                        "an RRef can only be unpickled by torchrpc, from an RPC message");
            rref::ForkData fork = rref::ForkData::fromInts(state);
            auto ctx = rref::RRefContext::current();
            TORCH_CHECK(ctx, "received an RRef, but torchrpc is not running in this process");
            return c10::make_intrusive<ScriptRRef>(ctx->receive(fork));
          });
}

}  // namespace torchrpc::jit_ops
