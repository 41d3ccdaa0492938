#include "torch_backend/envelope.h"

#include <cstdint>
#include <cstring>

#include "torch_backend/upstream_payloads.h"

namespace torchrpc::torch_backend {

namespace {

constexpr size_t kTypeBytes = sizeof(int32_t);

// `owners`: how many references the frame itself holds to each tensor.
c10::intrusive_ptr<upstream::Message> unwrap(const char* data, size_t size, std::vector<at::Tensor>&& tensors,
                                             bool request, size_t owners) {
  const size_t header = kTypeBytes + tensors.size();
  TORCH_CHECK(size >= header, "malformed TORCH_", request ? "REQUEST" : "RESPONSE", " frame: ", size,
              " payload bytes, fewer than the ", header, " of its header (message type, a flag per tensor)");
  int32_t type = 0;
  std::memcpy(&type, data, kTypeBytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    // A call to oneself may hand over the sender's tensors: the receiver
    // must not attach to the sender's graph nor change the sender's tensor.
    // One read off the wire has no history and only the frame holds it, so
    // it needs no detach (a dispatched op).
    if (tensors[i].use_count() > owners || tensors[i].requires_grad()) tensors[i] = tensors[i].detach();
    const char flag = data[kTypeBytes + i];
    TORCH_CHECK(flag == 0 || flag == 1, "malformed TORCH_", request ? "REQUEST" : "RESPONSE",
                " frame: requires-grad flag ", static_cast<int>(flag), " of tensor ", i);
    if (flag == 1) {
      TORCH_CHECK(tensors[i].is_floating_point() || tensors[i].is_complex(), "malformed TORCH_",
                  request ? "REQUEST" : "RESPONSE", " frame: tensor ", i, " of dtype ", tensors[i].scalar_type(),
                  " cannot require grad");
      tensors[i].requires_grad_(true);
    }
  }
  const std::string bad =
      checkUpstreamPayload(static_cast<upstream::MessageType>(type), data + header, size - header, tensors);
  TORCH_CHECK(bad.empty(), "malformed TORCH_", request ? "REQUEST" : "RESPONSE", " frame: upstream's ",
              upstreamTypeName(static_cast<upstream::MessageType>(type)), " ", bad);
  std::vector<char> payload(data + header, data + size);
  auto m = c10::make_intrusive<upstream::Message>(std::move(payload), std::move(tensors),
                                                  static_cast<upstream::MessageType>(type));
  TORCH_CHECK(request ? m->isRequest() : m->isResponse(), "malformed TORCH_", request ? "REQUEST" : "RESPONSE",
              " frame: it holds upstream message type ", upstreamTypeName(m->type()), ", not a ",
              request ? "request" : "response");
  return m;
}

}  // namespace

message::Message wrap(message::MessageType type, upstream::Message& m, uint64_t id) {
  message::Message out;
  out.type = type;
  out.id = id;
  const int32_t upstreamType = static_cast<int32_t>(m.type());
  std::vector<char> payload = std::move(m).movePayload();
  out.tensors = std::move(m).moveTensors();
  const size_t header = kTypeBytes + out.tensors.size();
  out.payload.resize(header + payload.size());
  std::memcpy(out.payload.data(), &upstreamType, kTypeBytes);
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    out.payload[kTypeBytes + i] = out.tensors[i].requires_grad() ? 1 : 0;
  }
  if (!payload.empty()) std::memcpy(out.payload.data() + header, payload.data(), payload.size());
  return out;
}

c10::intrusive_ptr<upstream::Message> unwrapRequest(message::Message&& frame) {
  return unwrap(frame.payload.data(), frame.payload.size(), std::move(frame.tensors), /*request=*/true, /*owners=*/1);
}

c10::intrusive_ptr<upstream::Message> unwrapResponse(const c10::IValue& raw) {
  TORCH_CHECK(raw.isTuple() && raw.toTupleRef().elements().size() == 2,
              "malformed TORCH_RESPONSE: expected (payload, tensors)");
  const auto& parts = raw.toTupleRef().elements();
  const at::Tensor bytes = parts[0].toTensor();
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& t : parts[1].toTensorList()) tensors.push_back(t);
  return unwrap(static_cast<const char*>(bytes.const_data_ptr()), static_cast<size_t>(bytes.numel()),
                std::move(tensors), /*request=*/false, /*owners=*/2);  // `raw`'s list, and this copy
}

std::string upstreamTypeName(upstream::MessageType type) {
  using T = upstream::MessageType;
  switch (type) {
    case T::SCRIPT_CALL: return "SCRIPT_CALL";
    case T::SCRIPT_RET: return "SCRIPT_RET";
    case T::PYTHON_CALL: return "PYTHON_CALL";
    case T::PYTHON_RET: return "PYTHON_RET";
    case T::SCRIPT_REMOTE_CALL: return "SCRIPT_REMOTE_CALL";
    case T::PYTHON_REMOTE_CALL: return "PYTHON_REMOTE_CALL";
    case T::REMOTE_RET: return "REMOTE_RET";
    case T::SCRIPT_RREF_FETCH_CALL: return "SCRIPT_RREF_FETCH_CALL";
    case T::PYTHON_RREF_FETCH_CALL: return "PYTHON_RREF_FETCH_CALL";
    case T::SCRIPT_RREF_FETCH_RET: return "SCRIPT_RREF_FETCH_RET";
    case T::PYTHON_RREF_FETCH_RET: return "PYTHON_RREF_FETCH_RET";
    case T::RREF_USER_DELETE: return "RREF_USER_DELETE";
    case T::RREF_FORK_REQUEST: return "RREF_FORK_REQUEST";
    case T::RREF_CHILD_ACCEPT: return "RREF_CHILD_ACCEPT";
    case T::RREF_ACK: return "RREF_ACK";
    case T::FORWARD_AUTOGRAD_REQ: return "FORWARD_AUTOGRAD_REQ";
    case T::FORWARD_AUTOGRAD_RESP: return "FORWARD_AUTOGRAD_RESP";
    case T::BACKWARD_AUTOGRAD_REQ: return "BACKWARD_AUTOGRAD_REQ";
    case T::BACKWARD_AUTOGRAD_RESP: return "BACKWARD_AUTOGRAD_RESP";
    case T::CLEANUP_AUTOGRAD_CONTEXT_REQ: return "CLEANUP_AUTOGRAD_CONTEXT_REQ";
    case T::CLEANUP_AUTOGRAD_CONTEXT_RESP: return "CLEANUP_AUTOGRAD_CONTEXT_RESP";
    case T::RUN_WITH_PROFILING_REQ: return "RUN_WITH_PROFILING_REQ";
    case T::RUN_WITH_PROFILING_RESP: return "RUN_WITH_PROFILING_RESP";
    case T::RREF_BACKWARD_REQ: return "RREF_BACKWARD_REQ";
    case T::RREF_BACKWARD_RESP: return "RREF_BACKWARD_RESP";
    case T::EXCEPTION: return "EXCEPTION";
    case T::UNKNOWN: return "UNKNOWN";
  }
  return "type " + std::to_string(static_cast<int>(type));
}

}  // namespace torchrpc::torch_backend
