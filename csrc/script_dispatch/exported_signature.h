#pragma once

// ExportedSignature: what an exported program (torch.export, compiled by
// AOTInductor) takes and returns, as torchrpc writes it into the package's
// metadata when it compiles one (torchrpc/exported.py), so that a callee can
// check inputs before anything runs and build the schema callers are matched
// against, without Python. One line, records separated by ';':
//
//   torchrpc-exported/1
//   arg|kwarg <name> <dtype or *> <contiguous|any> <dim>...
//   returns tensor | tuple <n> | list <n>
//
// dtype is c10's name ("Float", "Long"); a dim is a static size ("4"), a
// dynamic one with its exported bounds ("s0:1..64", "s0:2..inf"; dims that
// share a symbol must be equal), or "*" (unchecked); a lone "?" for the dims
// means the rank is unknown (a package torchrpc did not compile).

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

namespace torchrpc::script_dispatch {

// The package metadata key of the signature, and its version tag.
inline constexpr const char* kSignatureKey = "torchrpc.signature";
inline constexpr const char* kSignatureFormat = "torchrpc-exported/1";

class ExportedSignature {
 public:
  struct Dim {
    int64_t size{-1};    // static size, or -1
    std::string symbol;  // dynamic: its symbol; empty when static or unchecked
    int64_t lo{0};
    int64_t hi{-1};  // -1: unbounded
  };
  struct Input {
    std::string name;
    bool kwargOnly{false};
    std::optional<c10::ScalarType> dtype;
    bool contiguous{false};  // traced contiguous: a strided input is made contiguous first
    std::optional<std::vector<Dim>> dims;  // nullopt: rank unknown
  };
  enum class Returns { kTensor, kTuple, kList };

  // Throws c10::ValueError naming what is malformed (the text may come from a peer).
  static ExportedSignature parse(const std::string& text);

  // The schema callers are matched against: every argument a Tensor.
  c10::FunctionSchema schema(const std::string& name) const;
  // Dtype, device, rank, static sizes and dynamic bounds of the inputs (already
  // matched to the schema); throws c10::TypeError naming the argument.
  void check(const torch::jit::Stack& stack, std::optional<c10::DeviceType> device) const;
  // The inputs as the package takes them.
  std::vector<at::Tensor> packageInputs(const torch::jit::Stack& stack) const;
  // The package's outputs as the schema returns them.
  c10::IValue result(std::vector<at::Tensor> outputs) const;

  const std::vector<Input>& inputs() const { return inputs_; }

 private:
  std::vector<Input> inputs_;
  Returns returns_{Returns::kTensor};
  size_t numOutputs_{1};
};

}  // namespace torchrpc::script_dispatch
