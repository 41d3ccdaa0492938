#pragma once

// Distributed autograd's own messages (message_type.h), as fixed binary
// headers (little endian) with the gradients in the message's tensors: no
// pickle, they sit on the backward pass's critical path (pickling and
// unpickling a gradient list took ~25 us per hop).
//
//   AUTOGRAD_BACKWARD  contextId i64, sendId i64, retainGraph u8, count u32,
//                      rootRank i32, backwardId i64, passId i64,
//                      then one u8 per gradient (1: present, 0: none),
//                      then a report flag u8 (1: a report follows);
//                      tensors = the present gradients, in order.
//                      Answered (None) when the passes it caused are done.
//   AUTOGRAD_PASS_DONE backwardId i64, then a report. Sent to the root;
//                      answered (None) at once.
//   AUTOGRAD_CLEANUP   contextId i64. Answered (None) at once.
//
// A report (engine.h) is passId i64, count u32, then count child pass ids i64.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "message/message.h"

namespace torchrpc::autograd {

// A pass of a distributed backward is done here, and these are the passes its
// messages started (engine.h: how the root knows that all are done).
struct PassReport {
  int64_t passId{-1};
  std::vector<int64_t> children;
};

struct BackwardRequest {
  int64_t contextId{-1};
  int64_t sendId{-1};
  bool retainGraph{false};
  std::vector<std::optional<at::Tensor>> grads;  // one per tensor of the send function
  int32_t rootRank{-1};                          // the worker that called backward()
  int64_t backwardId{-1};                        // that call, on the root
  int64_t passId{-1};                            // the pass this message starts
  std::optional<PassReport> report;              // the sender's, when this goes to the root
};

message::Message backwardMessage(BackwardRequest&& request);
// Throws a clear error on a malformed payload.
BackwardRequest parseBackward(message::Message&& m);
// {rootRank, backwardId} of an AUTOGRAD_BACKWARD, read without the rest
// (parseBackward checks that); nullopt if the payload is too short for them.
std::optional<std::pair<int32_t, int64_t>> peekBackwardRoot(const message::Message& m);

message::Message passDoneMessage(int64_t backwardId, const PassReport& report);
// {backwardId, report}; throws a clear error on a malformed payload.
std::pair<int64_t, PassReport> parsePassDone(const message::Message& m);

message::Message cleanupMessage(int64_t contextId);
int64_t parseCleanup(const message::Message& m);

}  // namespace torchrpc::autograd
