// torchrpc::remote: remote() from TorchScript.
//
//   remote(str to, str qualified_name, Any? args=None, Any? kwargs=None,
//          float timeout=-1.) -> __torch__.torch.classes.torchrpc.RRef
//
// Runs the script function the callee knows as `qualified_name` there and
// returns at once an RRef owned by `to` (an owner RRef when `to` is this
// worker). Creation errors and timeouts surface on to_here(), naming the
// owner, as in eager Python, whose torchrpc.remote maps onto this op inside
// TorchScript (torchrpc/api.py). The return type is concrete (no type
// variable), so code that calls it survives torch.jit.save / load.

#include <torch/library.h>

#include "common/error.h"
#include "jit_ops/rpc_ops.h"
#include "jit_ops/script_rref.h"
#include "rref/rref_context.h"

namespace torchrpc::jit_ops {

namespace {

void remoteKernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto agent = requireAgent("remote");
  auto ctx = rref::RRefContext::current();
  if (!ctx) {
    throw RpcError(ErrorKind::kGeneric,
                   "torchrpc.remote: this process serves no RRefs (torchrpc is shutting down, or "
                   "the worker was started without an RRef context)");
  }
  const double timeout = resolveTimeout(*agent, stack->back().toDouble());
  c10::IValue kwargs = (*stack)[stack->size() - 2];
  c10::IValue args = (*stack)[stack->size() - 3];
  std::string name = (*stack)[stack->size() - 4].toStringRef();
  std::string to = (*stack)[stack->size() - 5].toStringRef();
  torch::jit::drop(*stack, 5);
  const int dst = destinationRank(*agent, to, name, "remote");
  auto rref = ctx->remote(dst, namedCallMessage(name, args, kwargs, "remote"), timeout, name);
  stack->emplace_back(scriptRRef(std::move(rref)));
}

}  // namespace

void defineRemoteOp(torch::Library& m) {
  m.def(torch::schema("torchrpc::remote(str to, str qualified_name, Any? args=None, Any? kwargs=None, "
                      "float timeout=-1.) -> __torch__.torch.classes.torchrpc.RRef",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        torch::CppFunction::makeFromBoxedFunction<remoteKernel>());
}

}  // namespace torchrpc::jit_ops
