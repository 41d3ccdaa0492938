#pragma once

// Distributed autograd's own messages (message_type.h), as fixed binary
// headers (little endian) with the gradients in the message's tensors: no
// pickle, they sit on the backward pass's critical path (pickling and
// unpickling a gradient list took ~25 us per hop).
//
//   AUTOGRAD_BACKWARD  contextId i64, sendId i64, retainGraph u8, count u32,
//                      then one u8 per gradient (1: present, 0: none);
//                      tensors = the present gradients, in order.
//                      Answered (None) when the passes it caused are done.
//   AUTOGRAD_CLEANUP   contextId i64. Answered (None) at once.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "message/message.h"

namespace torchrpc::autograd {

struct BackwardRequest {
  int64_t contextId{-1};
  int64_t sendId{-1};
  bool retainGraph{false};
  std::vector<std::optional<at::Tensor>> grads;  // one per tensor of the send function
};

Message backwardMessage(BackwardRequest&& request);
// Throws a clear error on a malformed payload.
BackwardRequest parseBackward(Message&& m);

Message cleanupMessage(int64_t contextId);
int64_t parseCleanup(const Message& m);

}  // namespace torchrpc::autograd
