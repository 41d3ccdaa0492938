#pragma once

// A Message is what the agent sends and receives: a type, a request id, an
// opaque payload (a pickle; its format belongs to whoever made the message)
// and a list of tensors that travel as raw bytes beside it, never inside the
// pickle. Messages are moved, not shared: whoever holds one owns it.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "message/message_type.h"

namespace torchrpc::message {

struct Message {
  MessageType type{MessageType::kHello};
  uint64_t id{0};
  std::string payload;
  std::vector<at::Tensor> tensors;
};

}  // namespace torchrpc::message
