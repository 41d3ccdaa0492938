#pragma once

// Upstream's message payloads as a peer sent them, checked before upstream's
// decoders read them: they trust what they read (torch's and Python's
// unpicklers grow memos to the index a pickle declares, torch's recurses once
// per level of a value, upstream's deserializeRequest once per wrapper).
//
// By upstream's message type, the payload is a pickle for torch's unpickler
// (message::checkPickle with torchValues); Python's pickle (PYTHON_RET, and
// PYTHON_CALL's after its async-execution byte); torch's pickle whose
// top-level strings are Python's pickles (PYTHON_REMOTE_CALL,
// PYTHON_RREF_FETCH_RET); or a wrapped message (distributed autograd's or
// the profiler's): the wrapped payload, then the wrapper's own pickle, then
// that pickle's size (8 bytes, big-endian), the pickle's first value being
// the wrapped message's type. Upstream wraps a message in at most two
// wrappers (its profiler's around autograd's). EXCEPTION is text and the
// other types carry nothing upstream reads.
//
// Threads: pure functions, any thread.

#include <torch/csrc/distributed/rpc/message.h>

#include <cstddef>
#include <string>
#include <vector>

namespace torchrpc::torch_backend {

namespace upstream = torch::distributed::rpc;

// How many wrappers deep a peer's message may be.
inline constexpr int kMaxWrappers = 2;

// "" if upstream's decoders may read `data` as the payload of a message of
// `type` with `tensors`, else what is wrong with it ("holds torch's pickle
// ...", "wraps a message that ...").
std::string checkUpstreamPayload(upstream::MessageType type, const char* data, size_t size,
                                 const std::vector<at::Tensor>& tensors);

}  // namespace torchrpc::torch_backend
