#pragma once

// Callee: something the agent can run on a pool thread without the GIL: a
// TorchScript function or module method (below), an exported program
// (exported_program.h), registered and called the same way, or an operator
// (Registry::findOperator).

#include <ATen/core/function.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <memory>
#include <string>

#include "script_dispatch/inline_calls.h"

namespace torch::jit {
struct CompilationUnit;
struct Module;
struct Operator;
}

namespace torchrpc::script_dispatch {

using TaskLauncher = std::function<void(std::function<void()>)>;

class Callee {
 public:
  virtual ~Callee() = default;
  virtual const c10::FunctionSchema& schema() const = 0;
  // After the arguments matched schema(), before anything runs: a callee with
  // more to check than types (an exported program: dtype, rank, sizes)
  // throws c10::Error naming the argument; the caller gets a TypeError.
  virtual void checkInputs(const torch::jit::Stack& /*stack*/) const {}
  // Runs asynchronously: a callee that waits on a nested call suspends and is
  // resumed through `launcher` instead of blocking a pool thread.
  virtual c10::intrusive_ptr<c10::ivalue::Future> runAsync(torch::jit::Stack& stack,
                                                           TaskLauncher launcher) = 0;
  // Runs to the end on this thread, leaving the result on `stack`, and
  // returns true if the callee can never suspend (no fork, wait, RPC or
  // Future in it): no Future, no callback. Returns false, running nothing,
  // otherwise: then runAsync.
  virtual bool runHere(torch::jit::Stack& /*stack*/) { return false; }
  // Whether its run time is bounded by the size of its tensor arguments
  // (bounded.h): no wait, no loop, no number that sizes its work. Only
  // such a callee may run on the thread that read the call (inline_calls.h).
  virtual bool bounded() const { return false; }

  RunRecord runs;  // its runs to the end (runHere), for inline_calls.h
};

// What a run left on `stack`: its one result, None, or a tuple of several.
inline c10::IValue resultOf(torch::jit::Stack& stack, size_t numReturns) {
  if (numReturns == 1) return std::move(stack.back());
  if (numReturns == 0) return c10::IValue();
  std::vector<c10::IValue> out(stack.end() - numReturns, stack.end());
  return c10::ivalue::Tuple::create(std::move(out));
}

// A TorchScript function. Keeps its compilation unit alive.
std::shared_ptr<Callee> scriptFunctionCallee(std::shared_ptr<torch::jit::CompilationUnit> cu,
                                             torch::jit::Function* fn);
// A method of a TorchScript module (e.g. one torch::jit::load gave a C++
// program); its schema, as callers see it, has no `self`.
std::shared_ptr<Callee> moduleMethodCallee(const torch::jit::Module& module, const std::string& method);
// An operator (a builtin such as aten::add.Tensor): it never suspends.
std::shared_ptr<Callee> operatorCallee(std::shared_ptr<torch::jit::Operator> op);

}  // namespace torchrpc::script_dispatch
