#pragma once

// The payload formats that C++ produces and reads: IValues (script and builtin
// calls, their results) in plain_codec.h's form when they are plain values,
// else pickled with torch::jit::pickle, tensors going into the message's
// tensor list either way; EXCEPTION carries a fixed tuple. Python
// calls use Python's own pickle and never pass through here.

#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <vector>

#include "message/message.h"

namespace torchrpc::message {

// Encodes `value` into a message: plain_codec.h's form, or a pickle (inside a
// PickleScope, see below).
Message ivalueMessage(MessageType type, uint64_t id, const c10::IValue& value);

// Throws what checkTypeTag (message/pickle_check.h) finds wrong with `tag`.
void requireTypeTag(const std::string& tag);
// torch's type parser for a pickle's type tags, once requireTypeTag passes the tag.
c10::TypePtr boundedTypeParser(const std::string& tag);
// Decodes a message (a pickle inside an UnpickleScope). Objects of TorchScript custom
// classes (torch.classes.*) are rebuilt with their class's __setstate__.
// `awaited`, if given, receives the futures the value must wait for before it
// is used (UnpickleScope::awaitBeforeUse); without it, nothing waits.
c10::IValue messageIValue(const Message& message,
                          std::vector<c10::intrusive_ptr<c10::ivalue::Future>>* awaited = nullptr);

// ---- custom-class objects inside payloads ----------------------------------
//
// A TorchScript custom class object travels through its def_pickle hooks
// (__getstate__ on the sender, __setstate__ on the receiver). For an RRef
// (jit_ops/script_rref.h) those hooks are protocol steps: pickling registers a
// fork, unpickling creates the receiver's RRef. The hooks ask these scopes
// whether they run for a message (and may then act) or for anything else,
// e.g. torch.jit.save, which they refuse. Thread-local; they nest.

// Open on this thread while ivalueMessage() pickles. Steps registered with
// onAbort() run if pickling fails (the message will never be sent).
class PickleScope {
 public:
  PickleScope();
  ~PickleScope();
  PickleScope(const PickleScope&) = delete;
  PickleScope& operator=(const PickleScope&) = delete;
  // Pickling succeeded: the abort steps are dropped.
  void commit();
  void onAbort(std::function<void()> undo);
  // The innermost open scope on this thread, or null.
  static PickleScope* current();

 private:
  PickleScope* outer_;
  bool committed_{false};
  std::vector<std::function<void()>> undo_;
};

// Open on this thread while messageIValue() unpickles.
class UnpickleScope {
 public:
  UnpickleScope();
  ~UnpickleScope();
  UnpickleScope(const UnpickleScope&) = delete;
  UnpickleScope& operator=(const UnpickleScope&) = delete;
  static bool active();
  // A hook's object is not ready for use until `future` completes (an RRef
  // whose owner has not confirmed it yet): the innermost open scope keeps it
  // for its messageIValue() caller.
  static void awaitBeforeUse(c10::intrusive_ptr<c10::ivalue::Future> future);
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> takeAwaited() { return std::move(awaited_); }

 private:
  UnpickleScope* outer_;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> awaited_;
};

// What a callee reports when a call fails.
struct RemoteException {
  std::string type;       // "ValueError", "mymodule.MyError", "RuntimeError"
  std::string message;    // str(exception)
  std::string traceback;  // the callee's traceback text, may be empty
  std::string function;   // what was being run ("f", "aten::add.Tensor")
  std::string worker;     // callee worker name
};

// RemoteException::function of a result that could not be sent back (the
// callee no longer knows the function): the caller names its call instead.
inline constexpr const char* kSendingTheResult = "<sending the result>";

Message exceptionMessage(uint64_t id, const RemoteException& e);
RemoteException messageException(const Message& message);

// Classifies an exception caught while running a call (c10::Error, a TorchScript
// raise, std::exception) into type and message.
RemoteException describeException(std::exception_ptr error, std::string function,
                                  std::string worker);

}  // namespace torchrpc::message
