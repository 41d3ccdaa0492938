#pragma once

// The distributed backward pass (upstream's FAST mode) and the lifetime of
// contexts across workers.
//
// backward() runs a local pass from the roots. Gradients that reach a leaf
// accumulate in the context (never in .grad); gradients that reach a
// RecvRpcBackward go, in one AUTOGRAD_BACKWARD message per receive node, to
// the worker that sent those tensors, which runs a local pass from the
// matching SendRpcBackward the same way. Each message is answered once the
// passes it caused are done everywhere, so backward() returns when the whole
// distributed pass is. No thread waits: a pass runs to completion, sends,
// and answers from the futures' callbacks.
//
// Each local pass is one Engine::execute(accumulate_grad=false, outputs =
// the leaf and receive edges reachable from its roots). Passes started by
// a send function keep their graph (several send functions may share
// nodes); it is freed when the context is released.

#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "agent/agent.h"

namespace torchrpc::autograd {

// Installs distributed autograd on the agent (interceptor and handlers).
// Call before agent.startServing().
void install(Agent& agent);

// The whole distributed pass from `roots` (tensors of one element each, on
// this worker) in context `contextId`. The future completes (None) when every
// worker is done, or fails with the first error, which names its worker.
c10::intrusive_ptr<c10::ivalue::Future> backward(Agent& agent, int64_t contextId,
                                                 const std::vector<at::Tensor>& roots,
                                                 bool retainGraph);

// Ends a context: drops it here and, without waiting, on every worker this
// one called in it (which tell the workers they called, and so on).
void releaseContext(Agent& agent, int64_t contextId);

}  // namespace torchrpc::autograd
