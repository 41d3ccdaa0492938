#include "script_dispatch/shipped_code.h"

#include <caffe2/serialize/inline_container.h>
#include <c10/util/hash.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <sstream>

#include "message/pickle_check.h"
#include "script_dispatch/exported_program.h"

namespace torchrpc::script_dispatch {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void checkShippedArchive(const std::string& bytes, bool pickles, const std::string& function,
                         const std::string& worker) {
  const std::string what = "the code of '" + function + "' shipped to " + worker;
  std::istringstream in(bytes);
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::vector<std::string> records;
  uint64_t declared = 0;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(&in);
    records = reader->getAllRecords();
    for (const auto& name : records) declared += reader->getRecordSize(name);
  } catch (const c10::Error& e) {
    C10_THROW_ERROR(ValueError, what + " is not a readable torch archive (" + e.what_without_backtrace() +
                                    "); refusing to load it");
  }
  if (declared > kMaxShippedInflation * bytes.size() || declared > kMaxShippedRecordBytes) {
    C10_THROW_ERROR(ValueError, what + " declares " + std::to_string(declared) + " bytes of records in an archive of " +
                                    std::to_string(bytes.size()) + ", over the cap of " +
                                    std::to_string(kMaxShippedInflation) + " times its size and of " +
                                    std::to_string(kMaxShippedRecordBytes) + " bytes; refusing to load it");
  }
  if (!pickles) return;
  for (const auto& name : records) {
    if (!endsWith(name, ".pkl")) continue;
    auto [data, size] = reader->getRecord(name);
    const std::string wrong = message::checkPickle(static_cast<const char*>(data.get()), size);
    if (!wrong.empty()) {
      C10_THROW_ERROR(ValueError, what + " holds a malformed pickle, " + name + ": " + wrong + "; refusing to load it");
    }
  }
}


std::shared_ptr<Callee> shippedCallee(Registry& registry, const c10::IValue& shipped,
                                      const std::string& function, const std::string& worker) {
  const auto& el = shipped.toTupleRef().elements();
  const std::string& format = el.at(0).toStringRef();
  const std::string& hash = el.at(1).toStringRef();
  if (format != kShippedFormat && format != kShippedPackageFormat) {
    C10_THROW_ERROR(ValueError, "the code of '" + function + "' was shipped as '" + format + "', but " + worker +
                                    " reads only '" + kShippedFormat + "' and '" + kShippedPackageFormat +
                                    "': run the same torchrpc version on every worker");
  }
  const std::string key = "sha1:" + hash;
  if (auto found = registry.find(key, /*moduleHint=*/"", /*resolve=*/false)) return found;
  if (el.at(2).isNone()) return nullptr;
  const at::Tensor code = el.at(2).toTensor().contiguous();
  if (format == kShippedPackageFormat && code.nbytes() > kMaxShippedPackageBytes) {
    C10_THROW_ERROR(ValueError, "the package of '" + function + "' shipped to " + worker + " has " +
                                    std::to_string(code.nbytes()) + " bytes, over the cap of " +
                                    std::to_string(kMaxShippedPackageBytes));
  }
  std::string bytes(static_cast<const char*>(code.data_ptr()), code.nbytes());
  std::string actual = c10::sha1(bytes).str();
  if (actual != hash) {
    C10_THROW_ERROR(ValueError, "the code of '" + function + "' arrived at " + worker + " with hash " + hash +
                                    " but its bytes hash to " + actual + "; refusing to run it");
  }
  checkShippedArchive(bytes, /*pickles=*/format == kShippedFormat, function, worker);
  std::shared_ptr<Callee> callee;
  if (format == kShippedPackageFormat) {
    callee = shippedExportedProgram(bytes, function, registry.concurrency());
  } else {
    std::istringstream in(bytes);
    // save_to_buffer wrapped the function as the `forward` of a module
    callee = moduleMethodCallee(torch::jit::load(in), "forward");
  }
  registry.add(key, callee);
  return callee;
}

}  // namespace torchrpc::script_dispatch
