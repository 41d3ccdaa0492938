#include "torch_backend/inline_script_calls.h"

#include <torch/csrc/distributed/rpc/profiler/server_process_global_profiler.h>
#include <torch/csrc/distributed/rpc/script_call.h>
#include <torch/csrc/distributed/rpc/script_resp.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "message/payload.h"
#include "script_dispatch/inline_calls.h"

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
    const auto call =
        torch::jit::unpickle(payload.data(), payload.size(), nullptr, request.tensors(), message::boundedTypeParser);
    const auto& el = call.toTupleRef().elements();
    if (el.size() < 2 || !el.back().isString()) return {};
    const auto& before = el[el.size() - 2];
    if (before.isBool() && !before.toBool()) {
      out.key = el.back().toStringRef();
    } else if (before.isString()) {
      out.key = before.toStringRef();
    } else {
      return {};  // async execution
    }
    out.args.assign(el.begin(), el.end() - 2);
  } catch (...) {
    return {};  // upstream's run answers what is wrong with it
  }
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = callees_.find(out.key);
  if (it != callees_.end()) out.callee = it->second;
  return out;
}

std::shared_ptr<script_dispatch::Callee> InlineScriptCalls::made(const Sighting& sighting,
                                                                const upstream::Message& request) {
  if (sighting.callee || sighting.key.empty()) return sighting.callee;
  std::shared_ptr<script_dispatch::Callee> made;
  try {
    const auto call = upstream::ScriptCall::fromMessage(request);
    if (call->hasOp()) {
      made = script_dispatch::operatorCallee(call->op());
    } else if (find_) {
      made = find_(call->qualifiedName().qualifiedName());
    }
  } catch (...) {
  }
  if (!made) return nullptr;  // unknown, or undecodable: upstream's run says so; nothing is kept for it
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto& callee = callees_[sighting.key];
  if (!callee) callee = std::move(made);
  return callee;
}

c10::intrusive_ptr<upstream::Message> InlineScriptCalls::run(Sighting& sighting) const {
  const auto& callee = sighting.callee;
  if (!callee || upstream::profiler::processglobal::StateStackEntry::current()) return {};
  const c10::FunctionSchema& schema = callee->schema();
  if (schema.returns().size() != 1) return {};
  torch::jit::Stack stack = std::move(sighting.args);
  try {
    if (stack.size() != schema.arguments().size()) return {};
    schema.checkAndNormalizeInputs<c10::Type>(stack, {});
  } catch (...) {
    return {};
  }
  const script_dispatch::RunTimer timer;
  c10::intrusive_ptr<upstream::Message> response;
  try {
    if (!callee->runHere(stack)) return {};  // it may suspend: upstream's callback runs it asynchronously
    response = upstream::ScriptResp(std::move(stack.back())).toMessage();
  } catch (const std::exception& e) {
    // The text upstream's callback answers: a function's fails as its
    // future would (Callee::runHere), an operator's is its exception's.
    response = upstream::createExceptionResponse(e.what(), -1);
  }
  callee->runs.record(timer);
  return response;
}

}  // namespace torchrpc::torch_backend
