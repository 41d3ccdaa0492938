#include "autograd/autograd_messages.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace torchrpc::autograd {

namespace {

constexpr size_t kBackwardHeader = 8 + 8 + 1 + 4;

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T get(const std::string& in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

}  // namespace

Message backwardMessage(BackwardRequest&& request) {
  Message m;
  m.type = MessageType::kAutogradBackward;
  const auto count = static_cast<uint32_t>(request.grads.size());
  m.payload.reserve(kBackwardHeader + count);
  put<int64_t>(m.payload, request.contextId);
  put<int64_t>(m.payload, request.sendId);
  put<uint8_t>(m.payload, request.retainGraph ? 1 : 0);
  put<uint32_t>(m.payload, count);
  for (auto& g : request.grads) {
    put<uint8_t>(m.payload, g.has_value() ? 1 : 0);
    if (g) m.tensors.push_back(std::move(*g));
  }
  return m;
}

BackwardRequest parseBackward(Message&& m) {
  const std::string& p = m.payload;
  TORCH_CHECK(p.size() >= kBackwardHeader, "malformed AUTOGRAD_BACKWARD: ", p.size(), " bytes");
  BackwardRequest r;
  r.contextId = get<int64_t>(p, 0);
  r.sendId = get<int64_t>(p, 8);
  const auto retain = get<uint8_t>(p, 16);
  const auto count = get<uint32_t>(p, 17);
  TORCH_CHECK(retain <= 1, "malformed AUTOGRAD_BACKWARD: retain_graph flag ", int(retain));
  TORCH_CHECK(p.size() == kBackwardHeader + count, "malformed AUTOGRAD_BACKWARD: ", p.size(),
              " bytes for ", count, " gradients");
  r.retainGraph = retain == 1;
  size_t next = 0;
  r.grads.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const auto present = static_cast<uint8_t>(p[kBackwardHeader + i]);
    TORCH_CHECK(present <= 1, "malformed AUTOGRAD_BACKWARD: gradient flag ", int(present));
    if (present == 0) {
      r.grads.emplace_back(std::nullopt);
      continue;
    }
    TORCH_CHECK(next < m.tensors.size(), "malformed AUTOGRAD_BACKWARD: ", m.tensors.size(),
                " tensors for more present gradients");
    r.grads.emplace_back(std::move(m.tensors[next++]));
  }
  TORCH_CHECK(next == m.tensors.size(), "malformed AUTOGRAD_BACKWARD: ", m.tensors.size(),
              " tensors for ", next, " present gradients");
  return r;
}

Message cleanupMessage(int64_t contextId) {
  Message m;
  m.type = MessageType::kAutogradCleanup;
  put<int64_t>(m.payload, contextId);
  return m;
}

int64_t parseCleanup(const Message& m) {
  TORCH_CHECK(m.payload.size() == 8, "malformed AUTOGRAD_CLEANUP: ", m.payload.size(), " bytes");
  return get<int64_t>(m.payload, 0);
}

}  // namespace torchrpc::autograd
