#include "agent/self_call.h"

#include <ATen/core/grad_mode.h>

#include <utility>
#include <vector>

#include "message/wire.h"

namespace torchrpc::agent {

message::Message copyForSelf(message::Message&& m) {
  std::vector<std::pair<size_t, at::Tensor>> graphed;
  if (at::GradMode::is_enabled()) {
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      if (m.tensors[i].defined() && m.tensors[i].requires_grad()) graphed.emplace_back(i, m.tensors[i]);
    }
  }
  message::Message out = message::loopback(std::move(m));
  for (auto& [i, t] : graphed) out.tensors[i] = t.clone();
  return out;
}

}  // namespace torchrpc::agent
