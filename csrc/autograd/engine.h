#pragma once

// The distributed backward pass (upstream's FAST mode) and the lifetime of
// contexts across workers.
//
// backward() runs a local pass from the roots. Gradients that reach a leaf
// accumulate in the context (never in .grad); gradients that reach a
// RecvRpcBackward go, in one AUTOGRAD_BACKWARD message per receive node, to
// the worker that sent those tensors, which runs a local pass from the
// matching SendRpcBackward the same way. No thread waits: a pass runs to
// completion, sends, and answers from the futures' callbacks.
//
// When is the whole pass done? Every pass reports to the root (the worker
// that called backward()) that it is done, and which passes its messages
// started; the root returns once every pass it has heard of is done. A report
// rides in the pass's last message to the root, or in the response when the
// root asked for the pass and nothing else was sent, else it is an
// AUTOGRAD_PASS_DONE of its own. In the split-RNN's ping-pong (root, ps,
// root, ps) backward() returns on the fourth message instead of the sixth.
//
// Each message is also answered once the passes it caused are done
// everywhere, as a chain of responses back to the root. That chain carries
// the errors: a pass that fails or a worker that dies never reports, and the
// response (or the dead connection) fails the call that started it, up to
// backward().
//
// Each local pass is one run of torch's engine over the part of the graph
// between its roots and the leaf and receive edges they reach; leaves
// accumulate into the context as in local autograd, hooks included
// (local_pass.h). Passes started by a send function keep their graph
// (several send functions may share nodes); it is freed when the context is
// released.
//
// A pass that fails answers "Error on Node <rank>: ..." (upstream's words);
// the workers before it relay that error unchanged to the root.

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <vector>

#include "agent/agent.h"

namespace torchrpc::autograd {

// Installs distributed autograd on the agent (interceptor and handlers).
// Call before agent.startServing().
void install(agent::Agent& agent);

// The whole distributed pass from `roots` (tensors of one element each, on
// this worker) in context `contextId`, waited for by the calling thread. It
// meanwhile runs the passes that other workers' messages start here for this
// call, rather than a pool thread (common/waiting_thread.h); `onSleep` as
// WaitingThread::serveUntil's. Returns the completed future: None when every
// worker is done, or the first error, which names its worker.
c10::intrusive_ptr<c10::ivalue::Future> backward(agent::Agent& agent, int64_t contextId,
                                                 const std::vector<at::Tensor>& roots, bool retainGraph,
                                                 const std::function<void()>& onSleep = nullptr);

// How this process's backward() calls ended: {by the passes' reports, by the
// chain of responses}. For tests.
std::pair<uint64_t, uint64_t> backwardEndings();

// Ends a context: drops it here and, without waiting, on every worker this
// one called in it (which tell the workers they called, and so on).
void releaseContext(agent::Agent& agent, int64_t contextId);

}  // namespace torchrpc::autograd
