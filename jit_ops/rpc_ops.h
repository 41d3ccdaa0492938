#pragma once

// RPC from TorchScript: the ops torchrpc::rpc_async and torchrpc::rpc_sync
// (rpc_ops.cpp), torchrpc::remote (remote.cpp) and the RRef class
// (script_rref.h), all registered in rpc_ops.cpp's TORCH_LIBRARY block.
//
//   rpc_async(str to, str qualified_name, Any? args=None, Any? kwargs=None,
//             float timeout=-1., str load_hint="") -> Future(Any)
//
// `qualified_name` is a name the callee knows: one given to
// torchrpc.register(name, fn) there, or a function's qualified name. The
// callee matches args and kwargs to the function's schema (filling defaults),
// so a mismatch fails there with an error naming the function and the
// argument. Scripted code waits with fut.wait() / torch.jit.wait(fut); inside
// a callee the interpreter then suspends and its pool thread serves other
// calls until the response arrives, so nested calls never deadlock.
//
// `load_hint` is never used by the kernels. torchrpc/jit_ops.py passes the
// text that tells users to import torchrpc (or load libtorchrpc): printed
// into saved code, it is what torch.jit.load shows when these ops are missing.
//
// Registered with CONSERVATIVE alias analysis: the JIT must never drop a call
// whose future is unused. Eager Python reaches the same code through
// namedScriptCall / namedCallMessage.

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <memory>
#include <string>

#include "agent/agent.h"

namespace torch {
class Library;
}

namespace torchrpc::jit_ops {

// The running agent, or an error naming the op that needs it.
std::shared_ptr<agent::Agent> requireAgent(const char* op);
// Timeouts follow the Python API: -1 is the worker's default, 0 none.
double resolveTimeout(double timeout, double defaultSeconds);
// The rank of the worker named `to`; a ValueError naming the call otherwise.
int destinationRank(const agent::Agent& agent, const std::string& to, const std::string& name,
                    const std::string& callKind);

// The arguments every call op starts with, popped from a boxed stack.
struct NamedCall {
  std::string to;
  std::string name;
  c10::IValue args;
  c10::IValue kwargs;
  double timeout = 0;  // resolved: seconds, 0 for none
};
NamedCall popNamedCall(const agent::Agent& agent, torch::jit::Stack& stack);

// A SCRIPT_CALL of `name` with positional args (a tuple, list or None) and
// kwargs (a str-keyed dict or None), as the callee will match them;
// `shipped`: None, or what the callee runs instead of looking the name up
// (script_dispatch/shipped_code.h).
message::Message namedCallMessage(const std::string& name, const c10::IValue& args, const c10::IValue& kwargs,
                         const std::string& callKind, c10::IValue shipped = c10::IValue());

// Sends a SCRIPT_CALL of `name` to the worker named `to`.
agent::Agent::FuturePtr namedScriptCall(agent::Agent& agent, const std::string& to, const std::string& name,
                                 const c10::IValue& args, const c10::IValue& kwargs, double timeout,
                                 const std::string& callKind);

// torchrpc::remote (remote.cpp); called from the TORCH_LIBRARY block after
// the RRef class is defined, since its schema names the class.
void defineRemoteOp(torch::Library& m);
// torchrpc::get_gradients and torchrpc::dist_backward (autograd_ops.cpp).
void defineAutogradOps(torch::Library& m);

}  // namespace torchrpc::jit_ops
