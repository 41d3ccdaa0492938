#include "script_dispatch/shipped_code.h"

#include <caffe2/serialize/inline_container.h>
#include <c10/util/hash.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cctype>
#include <cstring>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "message/pickle_check.h"
#include "script_dispatch/exported_program.h"

namespace torchrpc::script_dispatch {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool isWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool isOperatorWord(const std::string& w) {
  static const std::unordered_set<std::string> words{"and", "or", "not", "if", "else", "in", "is", "lambda"};
  return words.count(w) > 0;
}

}  // namespace

ShippedDepth shippedSourceDepth(const char* s, size_t n) {
  // ops[i]: operators, calls and subscripts seen in bracket level i since its
  // last separator; each adds a level to the tree the parser builds (a chain
  // a + b + c is as deep as it is long), each open bracket one more.
  std::vector<size_t> ops{0};
  size_t indent = 0, total = 0, line = 1;
  ShippedDepth deepest;
  auto add = [&](size_t k) {
    ops.back() += k;
    total += k;
    if (total > deepest.depth) deepest = {total, line};
  };
  bool lineStart = true;
  for (size_t i = 0; i < n;) {
    const char c = s[i];
    if (lineStart) {  // a logical line's indentation: statement nesting, one level per column at most
      indent = 0;
      while (i < n && (s[i] == ' ' || s[i] == '\t')) ++indent, ++i;
      ops.assign(1, 0);
      total = indent;
      add(1);
      lineStart = false;
      continue;
    }
    if (c == '\n') {
      ++line, ++i;
      lineStart = ops.size() == 1;  // inside brackets a line goes on
    } else if (c == '\\') {  // a continued line, or a stray backslash
      i += 2;
      if (i <= n && s[i - 1] == '\n') ++line;
    } else if (c == '#') {
      while (i < n && s[i] != '\n') ++i;
    } else if (c == '\'' || c == '"') {  // a string: a leaf, whatever it holds
      const bool triple = i + 2 < n && s[i + 1] == c && s[i + 2] == c;
      i += triple ? 3 : 1;
      while (i < n) {
        if (s[i] == '\\') {
          i += 2;
        } else if (s[i] == c && (!triple || (i + 2 < n && s[i + 1] == c && s[i + 2] == c))) {
          i += triple ? 3 : 1;
          break;
        } else {
          if (s[i] == '\n') ++line;
          ++i;
        }
      }
    } else if (c == '(' || c == '[' || c == '{') {
      add(1);  // the call, subscript or display this opens
      ops.push_back(0);
      add(1);
      ++i;
    } else if (c == ')' || c == ']' || c == '}') {
      if (ops.size() > 1) {  // back to the enclosing level's depth
        total -= ops.back();
        ops.pop_back();
      }
      ++i;
    } else if (c == ',' || c == ':' || c == ';') {  // the next element starts at its level's depth
      total -= ops.back() - 1;  // 1: the line's, or the bracket's, own level
      ops.back() = 1;
      ++i;
    } else if (isWordChar(c)) {
      const size_t start = i;
      while (i < n && isWordChar(s[i])) ++i;
      if (isOperatorWord(std::string(s + start, i - start))) add(1);
    } else if (std::strchr("+-*/%@&|^~<>=!.", c) != nullptr) {
      add(1);
      ++i;
    } else {
      ++i;
    }
  }
  return deepest;
}

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
  if (!pickles) return;  // a package: native code, whose loader compiles no source
  for (const auto& name : records) {
    if (endsWith(name, ".py") && name.rfind("code/", 0) == 0) {  // names are relative to the archive's folder
      auto [data, size] = reader->getRecord(name);
      const ShippedDepth deepest = shippedSourceDepth(static_cast<const char*>(data.get()), size);
      if (deepest.depth > kMaxShippedSourceDepth) {
        C10_THROW_ERROR(ValueError, what + " nests " + std::to_string(deepest.depth) + " levels deep at " + name +
                                        ":" + std::to_string(deepest.line) + ", over the cap of " +
                                        std::to_string(kMaxShippedSourceDepth) +
                                        " (TorchScript's compiler recurses as deep); refusing to load it");
      }
      continue;
    }
    if (!endsWith(name, ".pkl") && !endsWith(name, ".debug_pkl")) continue;
    auto [data, size] = reader->getRecord(name);
    const std::string wrong = message::checkPickle(static_cast<const char*>(data.get()), size, /*torchValues=*/true);
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
