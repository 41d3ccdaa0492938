#include "script_dispatch/shipped_code.h"

#include <c10/util/hash.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <sstream>

namespace torchrpc::script_dispatch {


std::shared_ptr<Callee> shippedCallee(Registry& registry, const c10::IValue& shipped,
                                      const std::string& function, const std::string& worker) {
  const auto& el = shipped.toTupleRef().elements();
  const std::string& format = el.at(0).toStringRef();
  const std::string& hash = el.at(1).toStringRef();
  if (format != kShippedFormat) {
    C10_THROW_ERROR(ValueError, "the code of '" + function + "' was shipped as '" + format + "', but " + worker +
                                    " reads only '" + kShippedFormat +
                                    "': run the same torchrpc version on every worker");
  }
  const std::string key = "sha1:" + hash;
  if (auto found = registry.find(key, /*moduleHint=*/"", /*resolve=*/false)) return found;
  if (el.at(2).isNone()) return nullptr;
  const at::Tensor code = el.at(2).toTensor().contiguous();
  std::string bytes(static_cast<const char*>(code.data_ptr()), code.nbytes());
  std::string actual = c10::sha1(bytes).str();
  if (actual != hash) {
    C10_THROW_ERROR(ValueError, "the code of '" + function + "' arrived at " + worker + " with hash " + hash +
                                    " but its bytes hash to " + actual + "; refusing to run it");
  }
  std::istringstream in(bytes);
  // save_to_buffer wrapped the function as the `forward` of a module
  auto callee = moduleMethodCallee(torch::jit::load(in), "forward");
  registry.add(key, callee);
  return callee;
}

}  // namespace torchrpc::script_dispatch
