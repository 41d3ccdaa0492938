#include "script_dispatch/bounded.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstring>
#include <string>
#include <unordered_set>

namespace torchrpc::script_dispatch {

namespace {

namespace jit = torch::jit;

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

bool maySuspend(const jit::Block* block) {
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

// Ops whose output or time the values in a tensor (or a Scalar) size, not
// its size: the special polynomials loop `n` times per element.
bool sizedByValues(c10::Symbol kind) {
  static const std::unordered_set<c10::Symbol> ops = {
      c10::Symbol::fromQualString("aten::bincount"), c10::Symbol::fromQualString("aten::repeat_interleave"),
      c10::Symbol::fromQualString("aten::one_hot")};
  return ops.count(kind) != 0 || (kind.is_aten() && std::strstr(kind.toUnqualString(), "_polynomial_") != nullptr);
}

// A loop, a number read out of a tensor (which could size what follows),
// or an op that tensor values size.
bool loopsOrReadsNumbers(const jit::Block* block) {
  static const std::unordered_set<c10::Symbol> readsNumber = {
      jit::aten::Int,          jit::aten::Float,        jit::aten::item,         jit::aten::ScalarImplicit,
      jit::aten::IntImplicit,  jit::aten::FloatImplicit, jit::prim::tolist,
      jit::aten::_local_scalar_dense};
  for (const jit::Node* node : block->nodes()) {
    if (node->kind() == jit::prim::Loop || readsNumber.count(node->kind()) != 0 || sizedByValues(node->kind())) {
      return true;
    }
    for (const jit::Block* inner : node->blocks()) {
      if (loopsOrReadsNumbers(inner)) return true;
    }
  }
  return false;
}

bool isTensorOrList(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) return isTensorOrList(opt->getElementType());
  if (auto list = type->cast<c10::ListType>()) return isTensorOrList(list->getElementType());
  return false;
}

// An int (or ints) that names dimensions only. Not "dims": torch.tile's are repeat counts.
bool dimensionArgument(const c10::Argument& arg) {
  static const std::unordered_set<std::string> names = {"dim", "dim0", "dim1", "dim2", "start_dim", "end_dim"};
  c10::TypePtr type = arg.real_type();
  if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
  if (auto list = type->cast<c10::ListType>()) type = list->getElementType();
  return (type->kind() == c10::TypeKind::IntType || type->kind() == c10::TypeKind::SymIntType) &&
         names.count(arg.name()) != 0;
}

// A number or flag that sizes nothing.
bool sizesNothing(const c10::Argument& arg) {
  c10::TypePtr type = arg.real_type();
  if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::NumberType:  // Scalar
    case c10::TypeKind::FloatType:
    case c10::TypeKind::ComplexType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      return true;
    default:
      return dimensionArgument(arg);
  }
}

}  // namespace

bool maySuspend(jit::Function& fn) { return maySuspend(jit::toGraphFunction(fn).optimized_graph()->block()); }

bool boundedRun(jit::Function& fn, bool self) {
  const auto& args = fn.getSchema().arguments();
  for (size_t i = self ? 1 : 0; i < args.size(); ++i) {
    if (args[i].type()->kind() != c10::TypeKind::TensorType) return false;
  }
  return !maySuspend(fn) && !loopsOrReadsNumbers(jit::toGraphFunction(fn).optimized_graph()->block());
}

bool boundedOperator(const c10::FunctionSchema& schema) {
  // Private ops (aten::_...) are left out: their arguments are checked less, if at all.
  if (schema.name().rfind("aten::", 0) != 0 || schema.name().rfind("aten::_", 0) == 0 || schema.is_mutable() ||
      schema.is_vararg() ||
      sizedByValues(c10::Symbol::fromQualString(schema.name()))) {
    return false;
  }
  bool tensor = false;
  for (const auto& arg : schema.arguments()) {
    if (isTensorOrList(arg.real_type())) {
      tensor = true;
    } else if (!sizesNothing(arg)) {
      return false;
    }
  }
  return tensor;
}

}  // namespace torchrpc::script_dispatch
