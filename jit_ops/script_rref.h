#pragma once

// The TorchScript RRef: the custom class torch.classes.torchrpc.RRef (type
// __torch__.torch.classes.torchrpc.RRef), a handle on the same C++ RRef
// (csrc/rref) that Python's torchrpc.RRef wraps, owner or user.
//
//   to_here(float timeout=-1.) -> Any   the value, copied from the owner
//   owner_name() -> str
//   is_owner() -> bool
//   confirmed_by_owner() -> bool        the owner knows this user (owner: true)
//   local_value() -> Any                owner only
//
// Upstream gives its RRef a special JIT type (RRefType, RRef[T]) that the
// compiler knows; an extension cannot add one, so ours is a custom class and
// its values are untyped: refine them with isinstance or assert.
//
// Lifetime: the object holds a shared_ptr to the RRef; Python wrappers and
// TorchScript objects of the same RRef share it, so converting between them
// is free and the reference count the owner sees is that of the C++ RRef
// (one fork per worker that holds it, see rref_context.h).
//
// Pickling (how it travels inside script/builtin call payloads). The
// class's def_pickle hooks are the protocol's fork and receive:
//   __getstate__  RRefContext::fork() on the sender; the state is the fork
//                 data. Allowed only inside a message's PickleScope
//                 (message/payload.h), which undoes the fork if the rest of
//                 the payload fails to pickle; anything else (torch.jit.save
//                 of a module holding an RRef, copy.deepcopy) is refused.
//   __setstate__  RRefContext::receive() on the receiver, only inside
//                 messageIValue()'s UnpickleScope.
// Fork data names the owner, the ids and the parent (the sender), never the
// destination, so the hooks need no more than the pickling thread knows; the
// alternative (walking the IValue tree to swap RRefs for fork tuples before
// pickling) would have to rebuild typed containers such as List[RRef].
//
// Threads: every method may be called from any thread. to_here() and
// local_value() block their thread until the value arrives or the timeout
// passes (a TorchScript callee that calls them holds its pool thread
// meanwhile, unlike fut.wait()).

#include <torch/custom_class.h>

#include <memory>

#include "rref/rref.h"

namespace torchrpc::jit_ops {

class ScriptRRef : public torch::CustomClassHolder {
 public:
  explicit ScriptRRef(std::shared_ptr<rref::RRef> rref);

  const std::shared_ptr<rref::RRef>& rref() const { return rref_; }

  c10::IValue toHere(double timeout) const;
  c10::IValue localValue() const;
  std::string ownerName() const;
  bool isOwner() const { return rref_->isOwner(); }
  bool confirmedByOwner() const { return rref_->confirmedByOwner(); }

 private:
  std::shared_ptr<rref::RRef> rref_;
};

// The TorchScript object of an RRef.
c10::IValue scriptRRef(std::shared_ptr<rref::RRef> rref);
// The RRef of a TorchScript RRef object; null for any other value.
std::shared_ptr<rref::RRef> rrefOf(const c10::IValue& value);
// Whether `value` is, or contains (in tuples, lists, dicts), an RRef object.
bool containsRRef(const c10::IValue& value);

// Registers the class on the torchrpc library (from its TORCH_LIBRARY block,
// before any op whose schema names the class).
void defineScriptRRef(torch::Library& m);

}  // namespace torchrpc::jit_ops
