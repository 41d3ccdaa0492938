#include "script_dispatch/exported_signature.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <map>
#include <sstream>

namespace torchrpc::script_dispatch {

namespace {

// Caps on what a signature may declare (it may come from a peer's package).
constexpr size_t kMaxInputs = 1024;
constexpr size_t kMaxOutputs = 1024;
constexpr size_t kMaxRank = 64;

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

[[noreturn]] void malformed(const std::string& what, const std::string& record) {
  C10_THROW_ERROR(ValueError, "malformed exported-program signature (" + what + ") in '" + record +
                                  "': the package was not compiled by this torchrpc version's "
                                  "torchrpc.register / rpc calls");
}

int64_t number(const std::string& text, const std::string& record) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    malformed("'" + text + "' is not a number", record);
  }
  if (used != text.size() || n < 0) malformed("'" + text + "' is not a size", record);
  return n;
}

std::optional<c10::ScalarType> dtypeNamed(const std::string& name, const std::string& record) {
  if (name == "*") return std::nullopt;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    auto t = static_cast<c10::ScalarType>(i);
    if (name == c10::toString(t)) return t;
  }
  malformed("unknown dtype '" + name + "'", record);
}

ExportedSignature::Dim dimOf(const std::string& token, const std::string& record) {
  ExportedSignature::Dim d;
  if (token == "*") return d;
  auto colon = token.find(':');
  if (colon == std::string::npos) {
    d.size = number(token, record);
    return d;
  }
  auto dots = token.find("..", colon);
  if (dots == std::string::npos || colon == 0) malformed("dynamic dim '" + token + "'", record);
  d.symbol = token.substr(0, colon);
  d.lo = number(token.substr(colon + 1, dots - colon - 1), record);
  std::string hi = token.substr(dots + 2);
  d.hi = hi == "inf" ? -1 : number(hi, record);
  return d;
}

std::string describe(const ExportedSignature::Dim& d) {
  if (d.size >= 0) return std::to_string(d.size);
  return d.symbol + " in " + std::to_string(d.lo) + ".." + (d.hi < 0 ? "inf" : std::to_string(d.hi));
}

}  // namespace

ExportedSignature ExportedSignature::parse(const std::string& text) {
  auto records = split(text, ';');
  if (records.empty() || records[0] != kSignatureFormat) {
    malformed(std::string("it does not start with ") + kSignatureFormat, text.substr(0, 64));
  }
  ExportedSignature sig;
  bool sawReturns = false;
  for (size_t i = 1; i < records.size(); ++i) {
    const std::string& record = records[i];
    auto w = words(record);
    if (w.empty()) continue;
    if (w[0] == "returns") {
      if (w.size() == 2 && w[1] == "tensor") {
        sig.returns_ = Returns::kTensor;
        sig.numOutputs_ = 1;
      } else if (w.size() == 3 && (w[1] == "tuple" || w[1] == "list")) {
        sig.returns_ = w[1] == "tuple" ? Returns::kTuple : Returns::kList;
        sig.numOutputs_ = static_cast<size_t>(number(w[2], record));
        if (sig.numOutputs_ > kMaxOutputs) malformed("too many outputs", record);
      } else {
        malformed("returns", record);
      }
      sawReturns = true;
      continue;
    }
    if ((w[0] != "arg" && w[0] != "kwarg") || w.size() < 5) malformed("an input needs kind, name, dtype, layout, dims", record);
    if (sig.inputs_.size() >= kMaxInputs) malformed("too many inputs", record);
    Input in;
    in.kwargOnly = w[0] == "kwarg";
    in.name = w[1];
    in.dtype = dtypeNamed(w[2], record);
    if (w[3] != "contiguous" && w[3] != "any") malformed("layout '" + w[3] + "'", record);
    in.contiguous = w[3] == "contiguous";
    if (!(w.size() == 5 && w[4] == "?")) {
      if (w.size() - 4 > kMaxRank) malformed("rank over " + std::to_string(kMaxRank), record);
      std::vector<Dim> dims;
      for (size_t k = 4; k < w.size(); ++k) {
        if (w[k] != "-") dims.push_back(dimOf(w[k], record));  // "-": rank 0
      }
      in.dims = std::move(dims);
    }
    sig.inputs_.push_back(std::move(in));
  }
  if (!sawReturns) malformed("no returns record", text.substr(0, 64));
  return sig;
}

c10::FunctionSchema ExportedSignature::schema(const std::string& name) const {
  std::vector<c10::Argument> args;
  for (const auto& in : inputs_) {
    args.emplace_back(in.name, c10::TensorType::get(), std::nullopt, std::nullopt, in.kwargOnly);
  }
  c10::TypePtr ret = c10::TensorType::get();
  if (returns_ == Returns::kTuple) {
    ret = c10::TupleType::create(std::vector<c10::TypePtr>(numOutputs_, c10::TensorType::get()));
  } else if (returns_ == Returns::kList) {
    ret = c10::ListType::ofTensors();
  }
  return c10::FunctionSchema(name, "", std::move(args), {c10::Argument("", ret)});
}

void ExportedSignature::check(const torch::jit::Stack& stack, std::optional<c10::DeviceType> device) const {
  TORCH_CHECK(stack.size() == inputs_.size(), "the exported program takes ", inputs_.size(), " inputs, got ",
              stack.size());
  // symbol -> (size, the argument and dim that set it)
  std::map<std::string, std::pair<int64_t, std::string>> symbols;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Input& in = inputs_[i];
    const at::Tensor& t = stack[i].toTensor();
    const std::string arg = "argument '" + in.name + "'";
    if (!t.defined()) C10_THROW_ERROR(TypeError, arg + " is an undefined tensor");
    if (in.dtype && t.scalar_type() != *in.dtype) {
      C10_THROW_ERROR(TypeError, arg + " must be a " + c10::toString(*in.dtype) +
                                     " tensor, as the program was exported with, but got " +
                                     c10::toString(t.scalar_type()));
    }
    if (device && t.device().type() != *device) {
      C10_THROW_ERROR(TypeError, arg + " must be on " + c10::DeviceTypeName(*device, true) +
                                     ", where the package runs, but is on " + t.device().str());
    }
    if (!in.dims) continue;
    const auto& dims = *in.dims;
    if (static_cast<size_t>(t.dim()) != dims.size()) {
      C10_THROW_ERROR(TypeError, arg + " must have " + std::to_string(dims.size()) +
                                     " dimensions, as the program was exported with, but has " +
                                     std::to_string(t.dim()) + " (sizes " + c10::str(t.sizes()) + ")");
    }
    for (size_t k = 0; k < dims.size(); ++k) {
      const Dim& d = dims[k];
      const int64_t size = t.size(static_cast<int64_t>(k));
      const std::string where = arg + " dim " + std::to_string(k);
      if (d.size >= 0 && size != d.size) {
        C10_THROW_ERROR(TypeError, where + " must be " + std::to_string(d.size) +
                                       " (static in the exported program), but is " + std::to_string(size));
      }
      if (d.symbol.empty()) continue;
      if (size < d.lo || (d.hi >= 0 && size > d.hi)) {
        C10_THROW_ERROR(TypeError, where + " is " + std::to_string(size) +
                                       ", outside the bounds of its dynamic dimension (" + describe(d) + ")");
      }
      auto [it, fresh] = symbols.emplace(d.symbol, std::make_pair(size, where));
      if (!fresh && it->second.first != size) {
        C10_THROW_ERROR(TypeError, where + " is " + std::to_string(size) + " but " + it->second.second + " is " +
                                       std::to_string(it->second.first) +
                                       "; the exported program requires them equal (both " + d.symbol + ")");
      }
    }
  }
}

std::vector<at::Tensor> ExportedSignature::packageInputs(const torch::jit::Stack& stack) const {
  std::vector<at::Tensor> out;
  out.reserve(stack.size());
  for (size_t i = 0; i < stack.size(); ++i) {
    at::Tensor t = stack[i].toTensor();
    out.push_back(i < inputs_.size() && inputs_[i].contiguous ? t.contiguous() : t);
  }
  return out;
}

c10::IValue ExportedSignature::result(std::vector<at::Tensor> outputs) const {
  TORCH_CHECK(returns_ == Returns::kList || outputs.size() == numOutputs_, "the exported program returned ",
              outputs.size(), " tensors; its signature says ", numOutputs_);
  switch (returns_) {
    case Returns::kTensor:
      return std::move(outputs.at(0));
    case Returns::kList:
      return c10::List<at::Tensor>(outputs);
    case Returns::kTuple:
    default: {
      std::vector<c10::IValue> items(outputs.begin(), outputs.end());
      return c10::ivalue::Tuple::create(std::move(items));
    }
  }
}

}  // namespace torchrpc::script_dispatch
