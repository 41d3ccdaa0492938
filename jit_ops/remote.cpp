// torchrpc::remote: remote() from TorchScript.
//
//   remote(str to, str qualified_name, Any? args=None, Any? kwargs=None,
//          float timeout=-1., str load_hint="") -> __torch__.torch.classes.torchrpc.RRef
//
// Runs the script function the callee knows as `qualified_name` there and
// returns at once an RRef owned by `to` (an owner RRef when `to` is this
// worker). Creation errors and timeouts surface on to_here(), naming the
// owner, as in eager Python, whose torchrpc.remote maps onto this op inside
// TorchScript (torchrpc/jit_ops.py). The return type is concrete (no type
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
    throw common::RpcError(common::ErrorKind::kGeneric,
                   "torchrpc.remote: this process serves no RRefs (torchrpc is shutting down, or "
                   "the worker was started without an RRef context)");
  }
  NamedCall call = popNamedCall(*agent, *stack);
  const int dst = destinationRank(*agent, call.to, call.name, "remote");
  auto rref =
      ctx->remote(dst, namedCallMessage(call.name, call.args, call.kwargs, "remote"), call.timeout, call.name);
  stack->emplace_back(scriptRRef(std::move(rref)));
}

}  // namespace

void defineRemoteOp(torch::Library& m) {
  m.def(torch::schema("torchrpc::remote(str to, str qualified_name, Any? args=None, Any? kwargs=None, "
                      "float timeout=-1., str load_hint=\"\") -> __torch__.torch.classes.torchrpc.RRef",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        torch::CppFunction::makeFromBoxedFunction<remoteKernel>());
}

}  // namespace torchrpc::jit_ops
