#pragma once

// The owner's half of DistributedOptimizer (torchrpc/optim/): functional
// optimizers, stepped from C++ without the GIL.
//
// A functional optimizer is a TorchScript object (torchrpc/optim/functional/)
// with `step(gradients: List[Optional[Tensor]]) -> None` that updates the
// parameters it was made with. The owner registers it here with those
// parameters; the op `torchrpc::optimizer_step(id, context_id)`, sent as a
// builtin call, looks the parameters' gradients up in the distributed autograd
// context and runs `step`. Steps on one worker run one at a time, so
// concurrent steps from several trainers apply in some order, never mixed.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <vector>

namespace torchrpc::optim {

// Returns the id to step it by.
int64_t registerOptimizer(c10::intrusive_ptr<c10::ivalue::Object> optimizer,
                          std::vector<at::Tensor> params);
void unregisterOptimizer(int64_t id);
// Applies the gradients of context `contextId` on this worker.
void step(int64_t id, int64_t contextId);

}  // namespace torchrpc::optim
