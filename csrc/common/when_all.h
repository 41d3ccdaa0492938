#pragma once

// One future for many.

#include <ATen/core/ivalue.h>

#include <vector>

namespace torchrpc::common {

// Completes with None once every one of `futures` has completed, or with the
// first one's error (in their order) if any failed; at once when there are none.
c10::intrusive_ptr<c10::ivalue::Future> whenAll(std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures);

}  // namespace torchrpc::common
