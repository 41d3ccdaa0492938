#include "jit_ops/rpc_ops.h"

#include <torch/library.h>

#include "common/error.h"
#include "common/python_held.h"
#include "common/spin.h"
#include "jit_ops/script_rref.h"
#include "script_dispatch/run_script.h"

namespace torchrpc::jit_ops {

std::shared_ptr<agent::Agent> requireAgent(const char* op) {
  auto agent = agent::Agent::current();
  if (!agent) {
    throw common::RpcError(common::ErrorKind::kGeneric,
                   std::string("torchrpc.") + op +
                       ": torchrpc is not initialized in this process; call "
                       "torchrpc.init_rpc(...) first");
  }
  return agent;
}

double resolveTimeout(double timeout, double defaultSeconds) {
  return timeout < 0 ? defaultSeconds : timeout;
}

int destinationRank(const agent::Agent& agent, const std::string& to, const std::string& name,
                    const std::string& callKind) {
  int dst = agent.rankOf(to);
  if (dst < 0) {
    C10_THROW_ERROR(ValueError, callKind + " to '" + to + "' calling '" + name +
                                    "': no worker of this job is named '" + to + "'");
  }
  return dst;
}

NamedCall popNamedCall(const agent::Agent& agent, torch::jit::Stack& stack) {
  // (to, qualified_name, args, kwargs, timeout, load_hint); the hint is only
  // read by torch when the op is missing.
  NamedCall call;
  const size_t n = stack.size();
  call.to = stack[n - 6].toStringRef();
  call.name = stack[n - 5].toStringRef();
  call.args = stack[n - 4];
  call.kwargs = stack[n - 3];
  call.timeout = resolveTimeout(stack[n - 2].toDouble(), agent.options().defaultTimeoutSeconds);
  torch::jit::drop(stack, 6);
  return call;
}

namespace {

// Boxed kernels: the schema's types (Any, Future(Any)) have no unboxed C++
// signature.
agent::Agent::FuturePtr callFromStack(torch::jit::Stack* stack, const char* op) {
  auto agent = requireAgent(op);
  NamedCall call = popNamedCall(*agent, *stack);
  return namedScriptCall(*agent, call.to, call.name, call.args, call.kwargs, call.timeout, op);
}

void rpcAsync(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto future = callFromStack(stack, "rpc_async");
  // An interpreter of torchrpc's dispatch holds no Python objects; any other
  // caller's (Python, a C++ program) gets its callbacks run off the I/O thread.
  stack->emplace_back(script_dispatch::inDispatch() ? std::move(future) : common::completedOnInterOpPool(future));
}

void rpcSync(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto future = callFromStack(stack, "rpc_sync");
  common::spinThenWait(*future);  // the agent's deadline completes it; no separate timer
  stack->emplace_back(future->value());  // rethrows the call's error
}

}  // namespace

message::Message namedCallMessage(const std::string& name, const c10::IValue& args, const c10::IValue& kwargs,
                         const std::string& callKind, c10::IValue shipped) {
  std::vector<c10::IValue> stack;
  if (args.isTuple()) {
    const auto& el = args.toTupleRef().elements();
    stack.assign(el.begin(), el.end());
  } else if (args.isList()) {
    auto list = args.toList();
    stack.assign(list.begin(), list.end());
  } else if (!args.isNone()) {
    C10_THROW_ERROR(TypeError, callKind + " of '" + name + "': args must be a tuple, got " +
                                   args.type()->repr_str());
  }
  c10::impl::GenericDict kw(c10::StringType::get(), c10::AnyType::get());
  if (kwargs.isGenericDict()) {
    for (const auto& item : kwargs.toGenericDict()) {
      if (!item.key().isString()) {
        C10_THROW_ERROR(TypeError, callKind + " of '" + name + "': kwargs keys must be str");
      }
      kw.insert(item.key(), item.value());
    }
  } else if (!kwargs.isNone()) {
    C10_THROW_ERROR(TypeError, callKind + " of '" + name + "': kwargs must be a dict, got " +
                                   kwargs.type()->repr_str());
  }
  return script_dispatch::scriptCallMessage(name, "", std::move(stack), std::move(kw), std::move(shipped));
}

agent::Agent::FuturePtr namedScriptCall(agent::Agent& agent, const std::string& to, const std::string& name,
                                 const c10::IValue& args, const c10::IValue& kwargs, double timeout,
                                 const std::string& callKind) {
  int dst = destinationRank(agent, to, name, callKind);
  auto future = agent.send(dst, namedCallMessage(name, args, kwargs, callKind), timeout, callKind, name);
  if (auto refused = agent::refusedBeforeSending(future)) std::rethrow_exception(refused);
  return future;
}

// The library's one TORCH_LIBRARY block (class_ must be defined in it): the
// RRef class first, then the ops, some of whose schemas name it.
TORCH_LIBRARY(torchrpc, m) {
  defineScriptRRef(m);
  m.def(torch::schema(
            "torchrpc::rpc_async(str to, str qualified_name, Any? args=None, Any? kwargs=None, "
            "float timeout=-1., str load_hint=\"\") -> Future(Any)",
            c10::AliasAnalysisKind::CONSERVATIVE),
        torch::CppFunction::makeFromBoxedFunction<rpcAsync>());
  m.def(torch::schema(
            "torchrpc::rpc_sync(str to, str qualified_name, Any? args=None, Any? kwargs=None, "
            "float timeout=-1., str load_hint=\"\") -> Any",
            c10::AliasAnalysisKind::CONSERVATIVE),
        torch::CppFunction::makeFromBoxedFunction<rpcSync>());
  defineRemoteOp(m);
  defineAutogradOps(m);
}

}  // namespace torchrpc::jit_ops
