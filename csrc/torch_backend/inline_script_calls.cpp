#include "torch_backend/inline_script_calls.h"

#include <torch/csrc/distributed/rpc/profiler/server_process_global_profiler.h>
#include <torch/csrc/distributed/rpc/script_call.h>
#include <torch/csrc/distributed/rpc/script_resp.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "message/pickle_check.h"
#include "script_dispatch/bounded.h"

namespace torchrpc::torch_backend {

namespace {

// The frame's header: upstream's message type, then a byte per tensor (envelope.h).
constexpr size_t kTypeBytes = sizeof(int32_t);

// How TorchScript's pickler names an RRef (a GLOBAL opcode's module and class).
constexpr char kRRefGlobal[] = "torch.distributed.rpc\nrref\n";

}  // namespace

bool InlineScriptCalls::candidate(const message::Message& frame) {
  const auto& payload = frame.payload;
  if (!script_dispatch::inlineCallsEnabled() || payload.size() < kTypeBytes ||
      payload.size() > script_dispatch::kMaxInputBytes) {
    return false;
  }
  int32_t type = 0;
  std::memcpy(&type, payload.data(), kTypeBytes);
  if (type != static_cast<int32_t>(upstream::MessageType::SCRIPT_CALL)) return false;
  try {
    if (!script_dispatch::smallInputs(frame.tensors)) return false;
  } catch (...) {
    return false;
  }
  const char* end = payload.data() + payload.size();
  return std::search(payload.data(), end, kRRefGlobal, kRRefGlobal + sizeof(kRRefGlobal) - 1) == end;
}

InlineScriptCalls::Sighting InlineScriptCalls::see(const upstream::Message& request) const {
  Sighting out;
  try {
    // Upstream's SCRIPT_CALL: (arguments..., async execution, function) or
    // (arguments..., operator schema, operator name).
    const auto& payload = request.payload();
    if (!message::checkPickle(payload.data(), payload.size()).empty()) return {};  // the pool's run refuses it
    const auto call = torch::jit::unpickle(payload.data(), payload.size(), nullptr, request.tensors());
    const auto& el = call.toTupleRef().elements();
    if (el.size() < 2 || !el.back().isString()) return {};
    const auto& before = el[el.size() - 2];
    if (before.isBool() && !before.toBool()) {
      out.key = el.back().toStringRef();
    } else if (before.isString()) {
      out.key = before.toStringRef();
      out.args.assign(el.begin(), el.end() - 2);
    } else {
      return {};  // async execution
    }
  } catch (...) {
    return {};  // upstream's run answers what is wrong with it
  }
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = callees_.find(out.key);
  if (it != callees_.end()) out.callee = it->second;
  return out;
}

std::shared_ptr<InlineScriptCalls::Callee> InlineScriptCalls::made(const Sighting& sighting,
                                                                   const upstream::Message& request) {
  if (sighting.callee || sighting.key.empty()) return sighting.callee;
  bool bounded = false;
  std::shared_ptr<torch::jit::Operator> op;
  try {
    const auto call = upstream::ScriptCall::fromMessage(request);
    if (call->hasOp()) {
      op = call->op();
      bounded = script_dispatch::boundedOperator(op->schema());
    } else {
      torch::jit::Function* fn = find_ ? find_(call->qualifiedName().qualifiedName()) : nullptr;
      if (fn == nullptr) return nullptr;  // unknown: upstream's run says so; nothing is kept for it
      bounded = script_dispatch::boundedRun(*fn);
    }
  } catch (...) {
    return nullptr;  // the same
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto& callee = callees_[sighting.key];
  if (!callee) callee = std::make_shared<Callee>(bounded, std::move(op));
  return callee;
}

c10::intrusive_ptr<upstream::Message> InlineScriptCalls::runOperator(Sighting& sighting) const {
  if (!sighting.callee || !sighting.callee->op || !sighting.callee->bounded) return {};
  // Upstream's callback records the call for a server-side profile
  // (torch.distributed.rpc._server_process_global_profile); this does not.
  if (upstream::profiler::processglobal::StateStackEntry::current()) return {};
  torch::jit::Stack stack = std::move(sighting.args);
  const script_dispatch::RunTimer run;
  try {
    // Arguments that do not fit the schema the caller named are the callback's to answer.
    if (stack.size() != sighting.callee->op->schema().arguments().size()) return {};
    sighting.callee->op->schema().checkAndNormalizeInputs<c10::Type>(stack, {});
    sighting.callee->op->getOperation()(stack);
    if (stack.size() != 1) return {};  // upstream refuses a builtin of several results: its error
    sighting.callee->runs.record(run);
    return upstream::ScriptResp(std::move(stack.front())).toMessage();
  } catch (...) {
    return {};
  }
}

}  // namespace torchrpc::torch_backend
