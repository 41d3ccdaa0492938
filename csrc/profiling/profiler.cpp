#include "profiling/profiler.h"

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/profiler/api.h>

#include <cstring>

#include "common/logging.h"
#include "message/payload.h"

namespace torchrpc::profiling {

namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;
using message::MessageType;

// Upstream's separator between an RPC's range and the callee's event names.
constexpr const char* kRemoteOp = "#remote_op: ";
constexpr size_t kMaxEventBytes = 256u << 20;  // a bound on what a callee may return

// Profiler settings that travel (the state is always CPU: torchrpc sends CPU tensors).
constexpr uint16_t kShapes = 1, kMemory = 2, kStack = 4, kFlops = 8, kModules = 16;

#pragma pack(push, 1)
struct CallEnvelope {
  uint16_t innerType;
  uint16_t settings;
  uint32_t reserved;
};
struct RetEnvelope {
  uint16_t innerType;
  uint16_t reserved0;
  uint32_t eventBytes;  // pickled list of the callee's events, before the response's payload
};
#pragma pack(pop)
static_assert(sizeof(CallEnvelope) == 8 && sizeof(RetEnvelope) == 8, "profiling envelopes are 8 bytes");

// "rpc_sync" -> "sync": upstream's RPCExecMode values. Other kinds (to_here,
// RRef bookkeeping, autograd) are not profiled, as upstream.
const char* modeOf(const std::string& callKind) {
  if (callKind == "rpc_sync") return "sync";
  if (callKind == "rpc_async") return "async";
  if (callKind == "remote") return "remote";
  return nullptr;
}

// An operator's name without its overload ("aten::mul.Tensor" -> "aten::mul"),
// as upstream names builtins; any other function name as it is.
std::string profiledName(const std::string& function) {
  const size_t ns = function.find("::");
  if (ns == std::string::npos) return function;
  const size_t dot = function.find('.', ns);
  return dot == std::string::npos ? function : function.substr(0, dot);
}

uint16_t settingsOf(const impl::ProfilerConfig& c) {
  return (c.report_input_shapes ? kShapes : 0) | (c.profile_memory ? kMemory : 0) | (c.with_stack ? kStack : 0) |
         (c.with_flops ? kFlops : 0) | (c.with_modules ? kModules : 0);
}

impl::ProfilerConfig configOf(uint16_t s) {
  return impl::ProfilerConfig(impl::ProfilerState::CPU, s & kShapes, s & kMemory, s & kStack, s & kFlops, s & kModules);
}

bool legacyProfilerOn() {
  return impl::profilerEnabled() && impl::profilerType() == impl::ActiveProfilerType::LEGACY;
}

// ---- the process-global profiler ------------------------------------------------

struct Global {
  std::mutex mutex;
  std::atomic<bool> on{false};
  struct Entry {
    impl::ProfilerConfig config;
    prof::thread_event_lists lists;  // one per request served
  };
  std::vector<Entry> stack;  // innermost last
};

Global& global() {
  static Global* g = new Global();  // never destroyed: pool threads may outlive statics
  return *g;
}

std::optional<impl::ProfilerConfig> globalConfig() {
  Global& g = global();
  if (!g.on.load(std::memory_order_relaxed)) return std::nullopt;
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.stack.empty()) return std::nullopt;
  return g.stack.back().config;
}

void appendGlobal(const std::vector<prof::LegacyEvent>& events) {
  Global& g = global();
  if (!g.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g.mutex);
  for (auto& entry : g.stack) entry.lists.push_back(events);
}

// ---- callee --------------------------------------------------------------------

// A request run under a legacy profiler: the first run() (the handler) starts
// it, continuations run with its thread-local state, and the response
// collects every event recorded and, for a PROFILED_CALL, carries them back.
class Scope : public agent::CallScope {
 public:
  Scope(impl::ProfilerConfig config, bool returnEvents, std::string worker)
      : config_(std::move(config)), returnEvents_(returnEvents), worker_(std::move(worker)) {}

  void run(const std::function<void()>& fn) override {
    std::shared_ptr<at::ThreadLocalState> tls;
    bool started;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tls = tls_;
      started = std::exchange(started_, true);
    }
    if (started) {  // a continuation; after the response (tls_ taken), unprofiled
      if (!tls) {
        fn();
        return;
      }
      at::ThreadLocalStateGuard guard(*tls);
      fn();
      return;
    }
    {
      // Enabled only to capture the profiler's state: this thread gets its
      // own state back at the end of the block, and runs fn under the guard.
      at::ThreadLocalStateGuard restore{at::ThreadLocalState()};
      prof::enableProfilerLegacy(config_);
      tls = std::make_shared<at::ThreadLocalState>();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tls_ = tls;  // before fn: its continuations need it
    }
    at::ThreadLocalStateGuard guard(*tls);
    fn();
  }

  void outgoingResponse(message::Message& response) override {
    std::shared_ptr<at::ThreadLocalState> tls;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tls = std::move(tls_);
    }
    if (!tls) return;  // a second response: the first took the events
    std::vector<prof::LegacyEvent> events;
    try {
      at::ThreadLocalStateGuard guard(*tls);
      for (auto& list : prof::disableProfilerLegacy(prof::ProfilerDisableOptions(false, true))) {
        for (auto& e : list) events.push_back(std::move(e));
      }
    } catch (const std::exception& e) {
      TORCHRPC_WARN(worker_, "request #" << response.id << ": cannot collect its profiler events: " << e.what());
    }
    appendGlobal(events);
    // A failed call returns its error alone, as upstream.
    if (!returnEvents_ || response.type == MessageType::kException) return;
    std::string pickled;
    try {
      c10::impl::GenericList list(c10::AnyType::get());
      list.reserve(events.size());
      for (const auto& e : events) list.push_back(e.toIValue());
      pickled = message::ivalueMessage(MessageType::kScriptRet, 0, list).payload;
    } catch (const std::exception& e) {
      TORCHRPC_WARN(worker_, "request #" << response.id << ": cannot encode its profiler events: " << e.what());
      pickled.clear();
    }
    if (pickled.size() > kMaxEventBytes) pickled.clear();
    RetEnvelope env{static_cast<uint16_t>(response.type), 0, static_cast<uint32_t>(pickled.size())};
    message::wrapPayload(response, MessageType::kProfiledRet, env, pickled);
  }

 private:
  const impl::ProfilerConfig config_;
  const bool returnEvents_;  // false: the process-global profiler only
  const std::string worker_;
  std::mutex mutex_;
  bool started_{false};  // the first run() started the profiler
  std::shared_ptr<at::ThreadLocalState> tls_;  // the profiler's, until the response takes it
};

// The callee's events, unpickled; empty if `bytes` is empty.
std::vector<prof::LegacyEvent> decodeEvents(std::string&& bytes) {
  std::vector<prof::LegacyEvent> events;
  if (bytes.empty()) return events;
  message::Message m;
  m.payload = std::move(bytes);
  c10::IValue value = message::messageIValue(m);
  TORCH_CHECK(value.isList(), "malformed PROFILED_RET: the events are not a list");
  for (const auto& e : value.toListRef()) events.push_back(prof::LegacyEvent::fromIValue(e));
  return events;
}

}  // namespace

// ---- caller --------------------------------------------------------------------

struct Profiler::Call {
  std::string key;                                // the range's name
  at::ThreadLocalState tls;                       // the caller's, with its profiler
  std::unique_ptr<at::RecordFunction> range;      // started at send
};

// A profiled call's range, started now on this thread; null for call kinds
// that are not profiled.
std::shared_ptr<Profiler::Call> Profiler::start(const agent::Agent& agent, const std::string& callKind,
                                                const std::string& function, int dst) {
  const char* mode = modeOf(callKind);
  if (mode == nullptr) return nullptr;
  auto call = std::make_shared<Call>();
  call->key = std::string("rpc_") + mode + "#" + profiledName(function) + "(" + agent.options().name + " -> " +
              agent.peer(dst).name + ")";
  call->range = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  call->range->before(call->key);
  return call;
}

void Profiler::outgoingRequest(message::Message& request, const agent::Outgoing& out) {
  if (!legacyProfilerOn()) return;  // the whole cost of profiling when it is off
  auto call = start(agent_, out.callKind, out.function, out.dst);
  if (!call) return;
  CallEnvelope env{static_cast<uint16_t>(request.type), settingsOf(impl::getProfilerConfig()), 0};
  request.payload.insert(0, reinterpret_cast<const char*>(&env), sizeof(env));
  request.type = MessageType::kProfiledCall;
  const uint64_t id = request.id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_[id] = call;
    inFlight_.fetch_add(1);
  }
  // A call that fails without a response (timeout, lost peer) ends its range here.
  std::weak_ptr<Profiler> weak = shared_from_this();
  out.future->addCallback([weak, id](c10::ivalue::Future&) {
    if (auto self = weak.lock()) {
      if (auto call = self->take(id)) finish(*call, {});
    }
  });
}

std::shared_ptr<Profiler::Call> Profiler::take(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return nullptr;
  auto call = std::move(it->second);
  calls_.erase(it);
  inFlight_.fetch_sub(1);
  return call;
}

void Profiler::finish(Call& call, std::vector<prof::LegacyEvent>&& events) {
  at::ThreadLocalStateGuard guard(call.tls);
  try {
    if (!events.empty()) {
      const std::string prefix = call.key + kRemoteOp;
      for (auto& e : events) e.setName(at::StringView(prefix + e.name()));
      prof::addEventList(std::move(events));
    }
  } catch (const std::exception&) {
    // The caller's profiler is gone (it stopped before the response): nothing to add to.
  }
  call.range->end();
}

void Profiler::incomingResponse(message::Message& response, int) {
  if (response.type != MessageType::kProfiledRet && inFlight_.load() == 0) return;
  std::string eventBytes;
  if (response.type == MessageType::kProfiledRet) {
    RetEnvelope env;
    TORCH_CHECK(response.payload.size() >= sizeof(env), "truncated PROFILED_RET envelope (", response.payload.size(),
                " bytes)");
    std::memcpy(&env, response.payload.data(), sizeof(env));
    TORCH_CHECK(env.eventBytes <= response.payload.size() - sizeof(env), "PROFILED_RET declares ", env.eventBytes,
                " bytes of events; it has ", response.payload.size() - sizeof(env));
    eventBytes = response.payload.substr(sizeof(env), env.eventBytes);
    response.payload.erase(0, sizeof(env) + env.eventBytes);
    response.type = static_cast<MessageType>(env.innerType);
  }
  auto call = take(response.id);
  if (!call) return;  // not profiled here (or already failed)
  std::vector<prof::LegacyEvent> events;
  try {
    events = decodeEvents(std::move(eventBytes));
  } catch (const std::exception& e) {
    TORCHRPC_WARN(agent_.options().name, "dropping the profiler events of " << call->key << ": " << e.what());
  }
  finish(*call, std::move(events));
}

std::shared_ptr<agent::CallScope> Profiler::incomingRequest(message::Message& request, int) {
  if (request.type != MessageType::kProfiledCall) {
    auto config = globalConfig();
    if (!config) return nullptr;
    return std::make_shared<Scope>(*config, /*returnEvents=*/false, agent_.options().name);
  }
  CallEnvelope env;
  TORCH_CHECK(request.payload.size() >= sizeof(env), "truncated PROFILED_CALL envelope (", request.payload.size(),
              " bytes)");
  std::memcpy(&env, request.payload.data(), sizeof(env));
  request.payload.erase(0, sizeof(env));
  request.type = static_cast<MessageType>(env.innerType);
  TORCH_CHECK(request.type != MessageType::kProfiledCall, "a PROFILED_CALL inside a PROFILED_CALL");
  return std::make_shared<Scope>(configOf(env.settings), /*returnEvents=*/true, agent_.options().name);
}

bool Profiler::scopesPlainRequests() const { return globalConfig().has_value(); }

bool profiled() { return legacyProfilerOn(); }

c10::intrusive_ptr<c10::ivalue::Future> localCall(const agent::Agent& agent, const std::string& callKind,
                                                  const std::string& function,
                                                  const c10::intrusive_ptr<c10::ivalue::Future>& done) {
  if (!legacyProfilerOn()) return nullptr;
  auto call = Profiler::start(agent, callKind, function, agent.options().rank);
  if (!call) return nullptr;
  auto recorded = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
  done->addCallback([call, recorded](c10::ivalue::Future&) {
    Profiler::finish(*call, {});
    recorded->markCompleted(c10::IValue());
  });
  return recorded;
}

void install(agent::Agent& agent) {
  // Events this process records carry its rank, as upstream's (remote ones keep theirs).
  at::RecordFunction::setDefaultNodeId(agent.options().rank);
  agent.addInterceptor(std::make_shared<Profiler>(agent));
}

void startGlobal(const impl::ProfilerConfig& config) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.stack.push_back({config, {}});
  g.on.store(true);
}

prof::thread_event_lists stopGlobal() {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  TORCH_CHECK(!g.stack.empty(), "the process-global profiler is not on in this process");
  auto lists = std::move(g.stack.back().lists);
  g.stack.pop_back();
  g.on.store(!g.stack.empty());
  return lists;
}

}  // namespace torchrpc::profiling
