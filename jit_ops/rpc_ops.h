#pragma once

// RPC from TorchScript: the ops torchrpc::rpc_async and torchrpc::rpc_sync.
//
//   rpc_async(str to, str qualified_name, Any? args=None, Any? kwargs=None,
//             float timeout=-1.) -> Future(Any)
//
// `qualified_name` is a name the callee knows: one given to
// torchrpc.register(name, fn) there, or a function's qualified name. The
// callee matches args and kwargs to the function's schema (filling defaults),
// so a mismatch fails there with an error naming the function and the
// argument. Scripted code waits with fut.wait() / torch.jit.wait(fut); inside
// a callee the interpreter then suspends and its pool thread serves other
// calls until the response arrives, so nested calls never deadlock.
//
// Registered with CONSERVATIVE alias analysis: the JIT must never drop a call
// whose future is unused. Eager Python reaches the same code through
// namedScriptCall.

#include <ATen/core/ivalue.h>

#include <string>

#include "agent/agent.h"

namespace torchrpc::jit_ops {

// Sends a SCRIPT_CALL of `name` with positional args (a tuple or None) and
// kwargs (a str-keyed dict or None) to the worker named `to`.
Agent::FuturePtr namedScriptCall(Agent& agent, const std::string& to, const std::string& name,
                                 const c10::IValue& args, const c10::IValue& kwargs, double timeout,
                                 const std::string& callKind);

}  // namespace torchrpc::jit_ops
