#pragma once

// A Message is what the agent sends and receives: a type, a request id, an
// opaque payload (a pickle; its format belongs to whoever made the message)
// and a list of tensors that travel as raw bytes beside it, never inside the
// pickle. Messages are moved, not shared: whoever holds one owns it.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "message/message_type.h"

namespace torchrpc::message {

struct Message {
  MessageType type{MessageType::kHello};
  uint64_t id{0};
  std::string payload;
  std::vector<at::Tensor> tensors;
};

// Wraps `m` in an envelope, as the interceptors do (autograd, profiler): its
// payload becomes `header` + `extra` + the old payload, its type `outer`.
template <typename Header>
void wrapPayload(Message& m, MessageType outer, const Header& header, std::string_view extra) {
  std::string payload;
  payload.reserve(sizeof(header) + extra.size() + m.payload.size());
  payload.append(reinterpret_cast<const char*>(&header), sizeof(header));
  payload += extra;
  payload += m.payload;
  m.payload = std::move(payload);
  m.type = outer;
}

}  // namespace torchrpc::message
