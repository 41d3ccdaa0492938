#pragma once

// Upstream's messages inside torchrpc's: a TORCH_REQUEST or TORCH_RESPONSE
// frame (message/message_type.h) carries torch.distributed.rpc's Message as
// its message type (4 bytes, native order: both ends run the same torch),
// one byte per tensor saying whether it requires grad (upstream's distributed
// autograd attaches its functions only to tensors that do, and TensorPipe's
// pickled tensors keep the flag), then the payload bytes. The tensors travel
// in the frame's tensor list, as every message's do (message/wire.h).
// Upstream's decoders read the payload, as with TensorPipe, once
// upstream_payloads.h has checked it.
//
// Threads: pure functions, any thread.

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/rpc/message.h>

#include <string>

#include "message/message.h"

namespace torchrpc::torch_backend {

namespace upstream = torch::distributed::rpc;

// Moves `m`'s payload and tensors into a frame of `type` (request or
// response) with request id `id` (a request's is the agent's to set).
message::Message wrap(message::MessageType type, upstream::Message& m, uint64_t id = 0);

// Upstream's request from a TORCH_REQUEST frame; throws c10::Error if the
// frame is malformed, holds a message that is not a request, or a payload
// upstream's decoders may not read (checkUpstreamPayload).
c10::intrusive_ptr<upstream::Message> unwrapRequest(message::Message&& frame);

// Upstream's response from what agent::Agent::send completes a TORCH_RESPONSE
// with: the tuple (payload as a uint8 tensor, tensors). Throws c10::Error if it
// is malformed, holds a message that is not a response, or a payload
// upstream's decoders may not read.
c10::intrusive_ptr<upstream::Message> unwrapResponse(const c10::IValue& raw);

// "PYTHON_CALL", "SCRIPT_REMOTE_CALL", ...: upstream's name of a message type.
std::string upstreamTypeName(upstream::MessageType type);

}  // namespace torchrpc::torch_backend
