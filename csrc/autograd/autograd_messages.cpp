#include "autograd/autograd_messages.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace torchrpc::autograd {

namespace {

constexpr size_t kBackwardHeader = 8 + 8 + 1 + 4 + 4 + 8 + 8;

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

void putReport(std::string& out, const PassReport& r) {
  put<int64_t>(out, r.passId);
  put<uint32_t>(out, static_cast<uint32_t>(r.children.size()));
  for (int64_t c : r.children) put<int64_t>(out, c);
}

// The report at `offset`, which must end the payload.
PassReport parseReport(const std::string& in, size_t offset, const char* what) {
  TORCH_CHECK(in.size() >= offset + 12, "malformed ", what, ": ", in.size() - offset,
              " bytes for a pass report");
  PassReport r;
  r.passId = get<int64_t>(in, offset);
  const auto count = get<uint32_t>(in, offset + 8);
  TORCH_CHECK(in.size() - offset - 12 == uint64_t{count} * 8, "malformed ", what, ": ",
              in.size() - offset - 12, " bytes for ", count, " child passes");
  r.children.reserve(count);
  for (uint32_t i = 0; i < count; ++i) r.children.push_back(get<int64_t>(in, offset + 12 + 8 * i));
  return r;
}

}  // namespace

message::Message backwardMessage(BackwardRequest&& request) {
  message::Message m;
  m.type = message::MessageType::kAutogradBackward;
  const auto count = static_cast<uint32_t>(request.grads.size());
  m.payload.reserve(kBackwardHeader + count);
  put<int64_t>(m.payload, request.contextId);
  put<int64_t>(m.payload, request.sendId);
  put<uint8_t>(m.payload, request.retainGraph ? 1 : 0);
  put<uint32_t>(m.payload, count);
  put<int32_t>(m.payload, request.rootRank);
  put<int64_t>(m.payload, request.backwardId);
  put<int64_t>(m.payload, request.passId);
  for (auto& g : request.grads) {
    put<uint8_t>(m.payload, g.has_value() ? 1 : 0);
    if (g) m.tensors.push_back(std::move(*g));
  }
  put<uint8_t>(m.payload, request.report ? 1 : 0);
  if (request.report) putReport(m.payload, *request.report);
  return m;
}

std::optional<std::pair<int32_t, int64_t>> peekBackwardRoot(const message::Message& m) {
  if (m.payload.size() < kBackwardHeader) return std::nullopt;
  return std::make_pair(get<int32_t>(m.payload, 21), get<int64_t>(m.payload, 25));
}

BackwardRequest parseBackward(message::Message&& m) {
  const std::string& p = m.payload;
  TORCH_CHECK(p.size() >= kBackwardHeader, "malformed AUTOGRAD_BACKWARD: ", p.size(), " bytes");
  BackwardRequest r;
  r.contextId = get<int64_t>(p, 0);
  r.sendId = get<int64_t>(p, 8);
  const auto retain = get<uint8_t>(p, 16);
  const auto count = get<uint32_t>(p, 17);
  TORCH_CHECK(retain <= 1, "malformed AUTOGRAD_BACKWARD: retain_graph flag ", int(retain));
  TORCH_CHECK(p.size() >= kBackwardHeader + uint64_t{count} + 1, "malformed AUTOGRAD_BACKWARD: ",
              p.size(), " bytes for ", count, " gradients");
  r.retainGraph = retain == 1;
  r.rootRank = get<int32_t>(p, 21);
  r.backwardId = get<int64_t>(p, 25);
  r.passId = get<int64_t>(p, 33);
  const size_t tail = kBackwardHeader + count;
  const auto hasReport = static_cast<uint8_t>(p[tail]);
  TORCH_CHECK(hasReport <= 1, "malformed AUTOGRAD_BACKWARD: report flag ", int(hasReport));
  if (hasReport == 1) {
    r.report = parseReport(p, tail + 1, "AUTOGRAD_BACKWARD");
  } else {
    TORCH_CHECK(p.size() == tail + 1, "malformed AUTOGRAD_BACKWARD: ", p.size() - tail - 1,
                " bytes after the gradient flags and no report");
  }
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

message::Message passDoneMessage(int64_t backwardId, const PassReport& report) {
  message::Message m;
  m.type = message::MessageType::kAutogradPassDone;
  put<int64_t>(m.payload, backwardId);
  putReport(m.payload, report);
  return m;
}

std::pair<int64_t, PassReport> parsePassDone(const message::Message& m) {
  TORCH_CHECK(m.payload.size() >= 8, "malformed AUTOGRAD_PASS_DONE: ", m.payload.size(), " bytes");
  return {get<int64_t>(m.payload, 0), parseReport(m.payload, 8, "AUTOGRAD_PASS_DONE")};
}

message::Message cleanupMessage(int64_t contextId) {
  message::Message m;
  m.type = message::MessageType::kAutogradCleanup;
  put<int64_t>(m.payload, contextId);
  return m;
}

int64_t parseCleanup(const message::Message& m) {
  TORCH_CHECK(m.payload.size() == 8, "malformed AUTOGRAD_CLEANUP: ", m.payload.size(), " bytes");
  return get<int64_t>(m.payload, 0);
}

}  // namespace torchrpc::autograd
