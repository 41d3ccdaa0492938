#pragma once

// What a callee's graph or schema says about its runs: whether it can
// suspend (registry.h runs the others to their end on one thread), and
// whether its time is bounded by the size of its tensor arguments (only
// such callees may run on the thread that read the call: inline_calls.h).
// Any thread; they read the graph or the schema only.

#include <ATen/core/function_schema.h>

namespace torch::jit {
struct Function;
}

namespace torchrpc::script_dispatch {

// Whether running it can suspend the interpreter or hand work to another
// thread: a fork or a wait, any op outside aten and prim (torchrpc's RPC ops
// among them), a call the inliner left, a Future, Await or RRef.
bool maySuspend(torch::jit::Function& fn);

// Its time is bounded by the size of its tensor arguments: it never
// suspends, runs no loop, takes tensors only (no number that could size
// what it makes), reads no number out of them, and calls no op whose output
// the values in a tensor size (bincount, say). `self`: a method's first
// argument, the module.
bool boundedRun(torch::jit::Function& fn, bool self = false);

// The same for an operator, from its schema: a public aten op that writes
// none of its arguments, takes at least one tensor, and otherwise only
// numbers and flags that size nothing (Scalar, float, bool, str, dtype; an
// int only as a dimension: `dim`, `dim0`, ...), and that no value sizes
// (bincount, the special polynomials).
bool boundedOperator(const c10::FunctionSchema& schema);

}  // namespace torchrpc::script_dispatch
