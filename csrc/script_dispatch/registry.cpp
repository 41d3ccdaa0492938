#include "script_dispatch/registry.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "script_dispatch/bounded.h"

namespace torchrpc::script_dispatch {

namespace {

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

// An operator, by schema name ("aten::add.Tensor"): BUILTIN_CALL's callee.
class OperatorCallee final : public Callee {
 public:
  explicit OperatorCallee(std::shared_ptr<torch::jit::Operator> op)
      : op_(std::move(op)), bounded_(boundedOperator(op_->schema())) {}
  const c10::FunctionSchema& schema() const override { return op_->schema(); }
  bool bounded() const override { return bounded_; }
  // An operator never suspends: runHere() always runs it; this is for callers of the interface.
  c10::intrusive_ptr<c10::ivalue::Future> runAsync(torch::jit::Stack& stack, TaskLauncher /*launcher*/) override {
    runHere(stack);
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    done->markCompleted(resultOf(stack, schema().returns().size()));
    return done;
  }
  bool runHere(torch::jit::Stack& stack) override {
    op_->getOperation()(stack);
    return true;
  }

 private:
  const std::shared_ptr<torch::jit::Operator> op_;
  const bool bounded_;
};

}  // namespace

std::shared_ptr<Callee> operatorCallee(std::shared_ptr<torch::jit::Operator> op) {
  return std::make_shared<OperatorCallee>(std::move(op));
}

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

std::shared_ptr<Callee> Registry::findOperator(const std::string& fullName, bool resolve) {
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = operators_.find(fullName);
    if (it != operators_.end()) return it->second;
  }
  if (!resolve) return nullptr;
  auto dot = fullName.find('.');
  c10::OperatorName opName(fullName.substr(0, dot),
                           dot == std::string::npos ? "" : fullName.substr(dot + 1));
  auto op = torch::jit::findOperatorFor(opName);
  if (!op) return nullptr;
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto& callee = operators_[fullName];
  if (!callee) callee = operatorCallee(std::move(op));
  return callee;
}

}  // namespace torchrpc::script_dispatch
