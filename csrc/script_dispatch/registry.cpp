#include "script_dispatch/registry.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <unordered_set>

namespace torchrpc::script_dispatch {

namespace {

bool holdsAsyncValue(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::FutureType || type->kind() == c10::TypeKind::AwaitType ||
      type->kind() == c10::TypeKind::RRefType) {
    return true;
  }
  for (const auto& contained : type->containedTypes()) {
    if (holdsAsyncValue(contained)) return true;
  }
  return false;
}

// Whether running the block can suspend the interpreter or hand work to
// another thread: a fork or a wait, any op outside aten and prim (torchrpc's
// RPC ops among them), a call the inliner left, a Future, Await or RRef.
bool maySuspend(const torch::jit::Block* block) {
  namespace jit = torch::jit;
  for (const jit::Node* node : block->nodes()) {
    const c10::Symbol kind = node->kind();
    if ((!kind.is_aten() && !kind.is_prim()) || kind == jit::prim::fork || kind == jit::prim::forkClosure ||
        kind == jit::aten::wait || kind == jit::prim::awaitable || kind == jit::prim::CallFunction ||
        kind == jit::prim::CallMethod || kind == jit::prim::PythonOp || node->hasAttribute(jit::attr::Subgraph)) {
      return true;
    }
    for (const jit::Value* v : node->inputs()) {
      if (holdsAsyncValue(v->type())) return true;
    }
    for (const jit::Value* v : node->outputs()) {
      if (holdsAsyncValue(v->type())) return true;
    }
    for (const jit::Block* inner : node->blocks()) {
      if (maySuspend(inner)) return true;
    }
  }
  return false;
}

// The function's graph as it runs (calls inlined).
bool maySuspend(torch::jit::Function& fn) {
  return maySuspend(torch::jit::toGraphFunction(fn).optimized_graph()->block());
}

// A loop, or a number read out of a tensor (which could size what follows).
bool loopsOrReadsNumbers(const torch::jit::Block* block) {
  namespace jit = torch::jit;
  static const std::unordered_set<c10::Symbol> readsNumber = {
      jit::aten::Int,          jit::aten::Float,        jit::aten::item,         jit::aten::ScalarImplicit,
      jit::aten::IntImplicit,  jit::aten::FloatImplicit, jit::prim::tolist,
      jit::aten::_local_scalar_dense};
  for (const jit::Node* node : block->nodes()) {
    if (node->kind() == jit::prim::Loop || readsNumber.count(node->kind()) != 0) return true;
    for (const jit::Block* inner : node->blocks()) {
      if (loopsOrReadsNumbers(inner)) return true;
    }
  }
  return false;
}

// Its time is bounded by the size of its tensor arguments: it never
// suspends, runs no loop, takes tensors only (no number that could size
// what it makes) and reads no number out of them. `self`: a method's first
// argument, the module.
bool boundedRun(torch::jit::Function& fn, bool self = false) {
  const auto& args = fn.getSchema().arguments();
  for (size_t i = self ? 1 : 0; i < args.size(); ++i) {
    if (args[i].type()->kind() != c10::TypeKind::TensorType) return false;
  }
  return !maySuspend(fn) && !loopsOrReadsNumbers(torch::jit::toGraphFunction(fn).optimized_graph()->block());
}

// Runs `fn` to its end, failing as runAsync's future would: without a future
// the interpreter throws its report as a JITException that keeps a
// TorchScript raise's Python class; with one it fails the future with a
// FutureError of the same text, which callers get as a RuntimeError, as
// upstream's do.
void runToEnd(torch::jit::Function& fn, torch::jit::Stack& stack) {
  try {
    fn.run(stack);
  } catch (const c10::Error& e) {
    throw c10::ivalue::Future::FutureError(std::string(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw c10::ivalue::Future::FutureError(std::string(e.what()));
  }
}

class ScriptFunctionCallee final : public Callee {
 public:
  ScriptFunctionCallee(std::shared_ptr<torch::jit::CompilationUnit> cu, torch::jit::Function* fn)
      : cu_(std::move(cu)), fn_(fn), runsHere_(!maySuspend(*fn)), bounded_(boundedRun(*fn)) {}
  const c10::FunctionSchema& schema() const override { return fn_->getSchema(); }
  bool bounded() const override { return bounded_; }
  c10::intrusive_ptr<c10::ivalue::Future> runAsync(torch::jit::Stack& stack,
                                                   TaskLauncher launcher) override {
    return fn_->runAsync(stack, std::move(launcher));
  }
  bool runHere(torch::jit::Stack& stack) override {
    if (!runsHere_) return false;
    runToEnd(*fn_, stack);
    return true;
  }

 private:
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  torch::jit::Function* fn_;
  const bool runsHere_;
  const bool bounded_;
};

class ModuleMethodCallee final : public Callee {
 public:
  ModuleMethodCallee(torch::jit::Module module, const std::string& method)
      : module_(std::move(module)),
        method_(module_.get_method(method)),
        runsHere_(!maySuspend(method_.function())),
        bounded_(boundedRun(method_.function(), /*self=*/true)) {
    const auto& full = method_.function().getSchema();
    std::vector<c10::Argument> args(full.arguments().begin() + 1, full.arguments().end());
    schema_ = std::make_unique<c10::FunctionSchema>(full.cloneWithArguments(std::move(args)));
  }
  const c10::FunctionSchema& schema() const override { return *schema_; }
  bool bounded() const override { return bounded_; }
  c10::intrusive_ptr<c10::ivalue::Future> runAsync(torch::jit::Stack& stack,
                                                   TaskLauncher launcher) override {
    stack.insert(stack.begin(), module_._ivalue());
    return method_.function().runAsync(stack, std::move(launcher));
  }
  bool runHere(torch::jit::Stack& stack) override {
    if (!runsHere_) return false;
    stack.insert(stack.begin(), module_._ivalue());
    runToEnd(method_.function(), stack);
    return true;
  }

 private:
  torch::jit::Module module_;
  torch::jit::Method method_;
  const bool runsHere_;
  const bool bounded_;
  std::unique_ptr<c10::FunctionSchema> schema_;
};

}  // namespace

std::shared_ptr<Callee> moduleMethodCallee(const torch::jit::Module& module, const std::string& method) {
  return std::make_shared<ModuleMethodCallee>(module, method);
}

std::shared_ptr<Callee> scriptFunctionCallee(std::shared_ptr<torch::jit::CompilationUnit> cu,
                                             torch::jit::Function* fn) {
  return std::make_shared<ScriptFunctionCallee>(std::move(cu), fn);
}

void Registry::add(const std::string& name, std::shared_ptr<Callee> callee) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  callees_[name] = std::move(callee);
}

void Registry::setResolver(Resolver resolver) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolver_ = std::move(resolver);
}

std::vector<std::string> Registry::names() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& kv : callees_) out.push_back(kv.first);
  return out;
}

std::shared_ptr<Callee> Registry::find(const std::string& name, const std::string& moduleHint,
                                       bool resolve) {
  Resolver resolver;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = callees_.find(name);
    if (it != callees_.end()) return it->second;
    resolver = resolver_;
  }
  if (!resolve || !resolver) return nullptr;
  std::lock_guard<std::mutex> once(resolveMutex_);
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = callees_.find(name);
    if (it != callees_.end()) return it->second;
  }
  auto callee = resolver(name, moduleHint);
  if (callee) add(name, callee);
  return callee;
}

std::shared_ptr<torch::jit::Operator> Registry::findOperator(const std::string& fullName) {
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = operators_.find(fullName);
    if (it != operators_.end()) return it->second;
  }
  auto dot = fullName.find('.');
  c10::OperatorName opName(fullName.substr(0, dot),
                           dot == std::string::npos ? "" : fullName.substr(dot + 1));
  auto op = torch::jit::findOperatorFor(opName);
  if (op) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    operators_[fullName] = op;
  }
  return op;
}

}  // namespace torchrpc::script_dispatch
