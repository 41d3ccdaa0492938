#pragma once

// The payload formats that C++ produces and reads: IValues (script and builtin
// calls, their results, HELLO) are pickled with torch::jit::pickle, tensors
// going into the message's tensor list; EXCEPTION carries a fixed tuple. Python
// calls use Python's own pickle and never pass through here.

#include <ATen/core/ivalue.h>

#include <string>

#include "message/message.h"

namespace torchrpc {

Message ivalueMessage(MessageType type, uint64_t id, const c10::IValue& value);
c10::IValue messageIValue(const Message& message);

// What a callee reports when a call fails.
struct RemoteException {
  std::string type;       // "ValueError", "mymodule.MyError", "RuntimeError"
  std::string message;    // str(exception)
  std::string traceback;  // the callee's traceback text, may be empty
  std::string function;   // what was being run ("f", "aten::add.Tensor")
  std::string worker;     // callee worker name
};

Message exceptionMessage(uint64_t id, const RemoteException& e);
RemoteException messageException(const Message& message);

// Classifies an exception caught while running a call (c10::Error, a TorchScript
// raise, std::exception) into type and message.
RemoteException describeException(std::exception_ptr error, std::string function,
                                  std::string worker);

}  // namespace torchrpc
