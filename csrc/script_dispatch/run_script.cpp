#include "script_dispatch/run_script.h"

#include <chrono>

#include <torch/csrc/jit/runtime/operator.h>

#include <utility>

#include "common/when_all.h"
#include "message/payload.h"
#include "script_dispatch/shipped_code.h"

namespace torchrpc::script_dispatch {

namespace {

thread_local bool inDispatch_ = false;

// Marks this thread as running a call of run() (inDispatch()) while alive.
struct DispatchScope {
  DispatchScope() : outer(std::exchange(inDispatch_, true)) {}
  ~DispatchScope() { inDispatch_ = outer; }
  const bool outer;
};

c10::IValue tupleOf(std::vector<c10::IValue> stack) {
  return c10::ivalue::Tuple::create(std::move(stack));
}

std::vector<c10::IValue> stackOf(const c10::IValue& tuple) {
  const auto& el = tuple.toTupleRef().elements();
  return std::vector<c10::IValue>(el.begin(), el.end());
}

// Matches positional and keyword arguments to the schema, filling defaults;
// a mismatch is the caller's mistake: a TypeError naming function and argument.
// `callee`, if given, then checks what the schema cannot say (Callee::checkInputs).
void normalizeInputs(const c10::FunctionSchema& schema, torch::jit::Stack& stack,
                     const c10::impl::GenericDict& kwargs, const std::string& function,
                     const std::string& worker, const Callee* callee = nullptr) {
  std::unordered_map<std::string, c10::IValue> named;
  for (const auto& item : kwargs) named.emplace(item.key().toStringRef(), item.value());
  try {
    schema.checkAndNormalizeInputs(stack, named);
    if (callee != nullptr) callee->checkInputs(stack);
  } catch (const c10::Error& e) {
    C10_THROW_ERROR(TypeError, "calling '" + function + "' (schema " + c10::toString(schema) +
                                   ") on " + worker + ": " + e.what_without_backtrace());
  }
}

// Answers with the future's value once it completes. A function that
// returns a Future (async execution) is answered when that one completes.
void replyWhenDone(c10::intrusive_ptr<c10::ivalue::Future> future, std::string function, std::string worker,
                   message::Reply reply) {
  future->addCallback([function, worker, reply](c10::ivalue::Future& f) {
    if (f.hasError()) {
      reply.error(message::describeException(f.exception_ptr(), function, worker));
    } else if (f.value().isFuture()) {
      replyWhenDone(f.value().toFuture(), function, worker, reply);
    } else {
      reply.value(f.value(), function);
    }
  });
}

// The result of an @async_execution function: a Future, or an error that
// says the function broke its promise.
c10::intrusive_ptr<c10::ivalue::Future> requireFuture(c10::intrusive_ptr<c10::ivalue::Future> done,
                                                      const std::string& function, const std::string& worker) {
  return done->then(
      [function, worker](c10::ivalue::Future& f) -> c10::IValue {
        const c10::IValue& value = f.constValue();
        if (!value.isFuture()) {
          TORCH_CHECK(false, "'", function, "' on ", worker,
                      " is decorated with @async_execution, so it must return a Future[...]. "
                      "Async functions must return an IValue of Future type, but got ",
                      value.type()->repr_str());
        }
        return value;
      },
      c10::AnyType::get());
}

}  // namespace

message::Message scriptCallMessage(const std::string& name, const std::string& moduleHint,
                          std::vector<c10::IValue> stack, c10::impl::GenericDict kwargs,
                          c10::IValue shipped, bool asyncExecution) {
  return message::ivalueMessage(message::MessageType::kScriptCall, 0,
                       c10::ivalue::Tuple::create({name, moduleHint, tupleOf(std::move(stack)),
                                                   std::move(kwargs), std::move(shipped), asyncExecution}));
}

message::Message builtinCallMessage(const std::string& schemaName, std::vector<c10::IValue> stack) {
  return message::ivalueMessage(message::MessageType::kBuiltinCall, 0,
                       c10::ivalue::Tuple::create({schemaName, tupleOf(std::move(stack))}));
}

namespace {

// The operator a BUILTIN_CALL names, or null once `reply` says why there is none.
std::shared_ptr<Callee> builtinCallee(const std::string& name, Registry& registry, const CalleePolicy& policy,
                                      const std::string& worker, const message::Reply& reply) {
  if (auto refused = policy.refuseCallable(name, worker, name.substr(0, name.find('.')))) {
    reply.error(*refused);
    return nullptr;
  }
  auto op = registry.findOperator(name);
  if (!op) {
    reply.error(message::RemoteException{"RuntimeError",
                                "worker " + worker + " has no operator '" + name +
                                    "'; it may need an extension library loaded (torch.ops.load_library)",
                                "", name, worker});
  }
  return op;
}

// The function a SCRIPT_CALL (payload `el`) names, or null once `reply` says why there is none.
std::shared_ptr<Callee> scriptCallee(const std::string& function, const std::vector<c10::IValue>& el,
                                     Registry& registry, const CalleePolicy& policy, const std::string& worker,
                                     const message::Reply& reply) {
  const std::string& moduleHint = el[1].toStringRef();
  const c10::IValue& shipped = el.at(4);
  auto refused = shipped.isNone() ? policy.refuseCallable(function, worker)
                                  : policy.refuseShippedCode(function, worker);
  if (refused) {
    reply.error(*refused);
    return nullptr;
  }
  auto callee = shipped.isNone() ? registry.find(function, moduleHint, /*resolve=*/policy.importByName)
                                 : shippedCallee(registry, shipped, function, worker);
  if (!callee) {
    std::string howToFind = policy.importByName
                                ? "Import the module that defines it on " + worker +
                                      (moduleHint.empty() ? "" : " ('" + moduleHint + "')") + ", or call"
                                : "It resolves no name that was not registered (RpcOptions(allow_import_by_name="
                                  "False)): call";
    reply.error(message::RemoteException{
        kUnknownFunction,
        shipped.isNone() ? "worker " + worker + " has no TorchScript function named '" + function + "'. " +
                               howToFind + " torchrpc.register(name, fn) there."
                         : "worker " + worker + " no longer has the shipped code of '" + function + "'",
        "", function, worker});
  }
  return callee;
}

// Runs a decoded call (the payload's tuple).
void runDecoded(message::MessageType type, const c10::intrusive_ptr<c10::ivalue::Tuple>& call, Registry& registry,
                const CalleePolicy& policy, const TaskLauncher& launcher, const std::string& worker,
                const message::Reply& reply) {
  std::string function = "<undecoded call>";
  try {
    const auto& el = call->elements();
    function = el[0].toStringRef();
    const bool builtin = type == message::MessageType::kBuiltinCall;
    auto callee = builtin ? builtinCallee(function, registry, policy, worker, reply)
                          : scriptCallee(function, el, registry, policy, worker, reply);
    if (!callee) return;
    torch::jit::Stack stack = stackOf(el[builtin ? 1 : 2]);
    normalizeInputs(callee->schema(), stack,
                    builtin ? c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())
                            : el.at(3).toGenericDict(),
                    function, worker, callee.get());
    DispatchScope scope;
    const bool asyncExecution = !builtin && el.size() > 5 && el[5].toBool();
    const RunTimer run;
    if (!asyncExecution && callee->runHere(stack)) {
      callee->runs.record(run);
      reply.value(resultOf(stack, callee->schema().returns().size()), function);
      return;
    }
    auto done = callee->runAsync(stack, [launcher](std::function<void()> fn) {
      launcher([fn = std::move(fn)] {
        DispatchScope scope;
        fn();
      });
    });
    if (asyncExecution) done = requireFuture(std::move(done), function, worker);
    replyWhenDone(std::move(done), function, worker, reply);
  } catch (...) {
    reply.error(message::describeException(std::current_exception(), function, worker));
  }
}

}  // namespace

void run(message::Message&& request, Registry& registry, const CalleePolicy& policy, const TaskLauncher& launcher,
         const std::string& worker, const message::Reply& reply) {
  c10::intrusive_ptr<c10::ivalue::Tuple> call;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> awaited;
  try {
    call = message::messageIValue(request, &awaited).toTuple();
  } catch (...) {
    reply.error(message::describeException(std::current_exception(), "<undecoded call>", worker));
    return;
  }
  const message::MessageType type = request.type;
  if (awaited.empty()) {
    runDecoded(type, call, registry, policy, launcher, worker, reply);
    return;
  }
  // Its arguments hold RRefs that their owners have not confirmed yet: it runs
  // once they have, as upstream's calls do; no thread waits meanwhile.
  common::whenAll(std::move(awaited))
      ->addCallback([type, call, &registry, &policy, launcher, worker, reply](c10::ivalue::Future&) {
        launcher([type, call, &registry, &policy, launcher, worker, reply] {
          runDecoded(type, call, registry, policy, launcher, worker, reply);
        });
      });
}

bool inDispatch() { return inDispatch_; }

}  // namespace torchrpc::script_dispatch
