#include "autograd/recorder.h"

#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstring>

#include "autograd/context.h"
#include "message/payload.h"
#include "rref/rref_messages.h"

namespace torchrpc::autograd {

namespace {

constexpr uint8_t kLocal = 1;  // a call to oneself: the local graph stays connected, nothing recorded

#pragma pack(push, 1)
struct Envelope {
  uint16_t innerType;
  uint8_t flags;
  uint8_t reserved0;
  int32_t reserved1;
  int64_t contextId;
  int64_t sendId;  // -1: no tensor of the message requires grad
  uint32_t numTensors;
  uint32_t reserved2;
};
#pragma pack(pop)
static_assert(sizeof(Envelope) == 32, "the autograd envelope is 32 bytes on the wire");

size_t maskBytes(size_t numTensors) { return (numTensors + 7) / 8; }

// Wraps `m` as `outer`: records a send function for its tensors that require
// grad (unless local) and prefixes the envelope.
void wrap(message::Message& m, message::MessageType outer, Context& ctx, bool local) {
  std::string mask(maskBytes(m.tensors.size()), '\0');
  std::vector<at::Tensor> sent;
  if (!local && torch::autograd::GradMode::is_enabled()) {
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      if (m.tensors[i].requires_grad()) {
        mask[i / 8] = static_cast<char>(mask[i / 8] | (1 << (i % 8)));
        sent.push_back(m.tensors[i]);
      }
    }
  }
  Envelope e{};
  e.innerType = static_cast<uint16_t>(m.type);
  e.flags = local ? kLocal : 0;
  e.contextId = ctx.id();
  e.sendId = sent.empty() ? -1 : ctx.addSend(c10::make_intrusive<SendRpcBackward>(sent));
  e.numTensors = static_cast<uint32_t>(m.tensors.size());
  message::wrapPayload(m, outer, e, mask);
}

// Unwraps `m` in place. Unless it is local, looks its context up with getCtx
// (null: record nothing) and gives the tensors the sender recorded a
// RecvRpcBackward in it.
template <typename GetContext>
Envelope unwrap(message::Message& m, int src, GetContext getCtx) {
  Envelope e;
  TORCH_CHECK(m.payload.size() >= sizeof(e), "truncated autograd envelope (", m.payload.size(),
              " bytes)");
  std::memcpy(&e, m.payload.data(), sizeof(e));
  const size_t maskLen = maskBytes(e.numTensors);
  TORCH_CHECK(e.numTensors == m.tensors.size(), "autograd envelope names ", e.numTensors,
              " tensors; the message has ", m.tensors.size());
  TORCH_CHECK(m.payload.size() >= sizeof(e) + maskLen, "truncated autograd envelope mask");
  const char* mask = m.payload.data() + sizeof(e);
  if (!(e.flags & kLocal)) {
    auto ctx = getCtx(e.contextId);
    if (ctx && e.sendId >= 0) {
      auto recv = c10::make_intrusive<RecvRpcBackward>(ctx->id(), src, e.sendId);
      for (size_t i = 0; i < m.tensors.size(); ++i) {
        if (mask[i / 8] & (1 << (i % 8))) torch::autograd::set_history(m.tensors[i], recv);
      }
      ctx->addRecv(std::move(recv));
    }
  }
  m.payload.erase(0, sizeof(e) + maskLen);
  m.type = static_cast<message::MessageType>(e.innerType);
  return e;
}

// Whether request `m` carries the sender's context. Calls do, and so do
// their RRef counterparts; RRef bookkeeping and autograd's own messages do
// not. A builtin operator's call (rpc or remote) carries it only when one of
// its tensors requires grad, as upstream's; any other call may return such
// tensors, so it always does (upstream's forceGradRecording).
bool carriesContext(const message::Message& m) {
  switch (m.type) {
    case message::MessageType::kBuiltinCall:
      break;
    case message::MessageType::kRemoteCall:
      if (rref::remoteCallType(m) == message::MessageType::kBuiltinCall) break;
      return true;
    case message::MessageType::kScriptCall:
    case message::MessageType::kPythonCall:
    case message::MessageType::kRRefFetch:
    case message::MessageType::kRRefMethodCall:
      return true;
    default:
      return false;
  }
  if (!torch::autograd::GradMode::is_enabled()) return false;
  for (const auto& t : m.tensors) {
    if (t.requires_grad()) return true;
  }
  return false;
}

class Scope : public agent::CallScope {
 public:
  Scope(int64_t contextId, bool local, std::string worker)
      : contextId_(contextId), local_(local), worker_(std::move(worker)) {}

  void run(const std::function<void()>& fn) override {
    CurrentContextGuard guard(contextId_);
    fn();
  }

  void outgoingResponse(message::Message& response) override {
    if (response.type == message::MessageType::kException) return;
    auto ctx = Container::get().find(contextId_);
    if (!ctx) return;  // released while the call ran: the caller records nothing
    try {
      wrap(response, message::MessageType::kAutogradRet, *ctx, local_);
    } catch (...) {
      uint64_t id = response.id;
      response = message::exceptionMessage(
          id, message::describeException(std::current_exception(), "distributed autograd (recording the response)",
                                worker_));
    }
  }

 private:
  const int64_t contextId_;
  const bool local_;
  const std::string worker_;
};

}  // namespace

void Recorder::outgoingRequest(message::Message& request, const agent::Outgoing& call) {
  const int dst = call.dst;
  const int64_t id = Container::currentId();
  if (id < 0 || !carriesContext(request)) return;
  auto ctx = Container::get().find(id);
  TORCH_CHECK(ctx, "distributed autograd context ", id, " was released on ", worker_,
              " but is still current on this thread");
  const bool local = dst == rank_;
  if (!local) ctx->addKnownWorker(dst);
  wrap(request, message::MessageType::kAutogradCall, *ctx, local);
}

void Recorder::incomingResponse(message::Message& response, int src) {
  if (response.type != message::MessageType::kAutogradRet) return;
  // The caller's context may be gone (released before the response came).
  unwrap(response, src, [](int64_t id) { return Container::get().find(id); });
}

std::shared_ptr<agent::CallScope> Recorder::incomingRequest(message::Message& request, int src) {
  if (request.type != message::MessageType::kAutogradCall) return nullptr;
  std::shared_ptr<Context> ctx;
  Envelope e = unwrap(request, src, [&ctx, src](int64_t id) { return ctx = Container::get().getOrCreate(id, src); });
  const bool local = (e.flags & kLocal) != 0;
  // Released here already: the request runs outside any context, unrecorded.
  if (!local && !ctx) return nullptr;
  return std::make_shared<Scope>(e.contextId, local, worker_);
}

void Recorder::stop() { Container::get().clear(); }

}  // namespace torchrpc::autograd
