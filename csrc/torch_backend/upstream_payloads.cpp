#include "torch_backend/upstream_payloads.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdint>
#include <exception>

#include "message/payload.h"
#include "message/pickle_check.h"

namespace torchrpc::torch_backend {

namespace {

using T = upstream::MessageType;

enum class Form { kNothing, kTorchPickle, kPythonPickle, kFlagThenPythonPickle, kTorchPickleOfPythonPickles, kWrapped };

Form formOf(T type) {
  switch (type) {
    case T::SCRIPT_CALL:
    case T::SCRIPT_RET:
    case T::SCRIPT_REMOTE_CALL:
    case T::REMOTE_RET:
    case T::SCRIPT_RREF_FETCH_CALL:
    case T::PYTHON_RREF_FETCH_CALL:
    case T::SCRIPT_RREF_FETCH_RET:
    case T::RREF_USER_DELETE:
    case T::RREF_FORK_REQUEST:
    case T::RREF_CHILD_ACCEPT:
    case T::BACKWARD_AUTOGRAD_REQ:
    case T::CLEANUP_AUTOGRAD_CONTEXT_REQ:
    case T::RREF_BACKWARD_REQ: return Form::kTorchPickle;
    case T::PYTHON_RET: return Form::kPythonPickle;
    case T::PYTHON_CALL: return Form::kFlagThenPythonPickle;
    case T::PYTHON_REMOTE_CALL:
    case T::PYTHON_RREF_FETCH_RET: return Form::kTorchPickleOfPythonPickles;
    case T::FORWARD_AUTOGRAD_REQ:
    case T::FORWARD_AUTOGRAD_RESP:
    case T::RUN_WITH_PROFILING_REQ:
    case T::RUN_WITH_PROFILING_RESP: return Form::kWrapped;
    default: return Form::kNothing;  // EXCEPTION's text, empty acks, unknown types (upstream refuses them)
  }
}

// The wrapped message's type: the first value of the wrapper's tuple, as
// torch's pickler writes it (protocol 2; a MARK unless the tuple has at most
// 3 values; an int of at most 4 bytes). -1 if it does not begin so.
int64_t wrappedType(const unsigned char* p, size_t n) {
  if (n < 3 || p[0] != 0x80 || p[1] != 2) return -1;
  const size_t at = p[2] == '(' ? 3 : 2;
  if (n < at + 1) return -1;
  const unsigned char* v = p + at + 1;
  const size_t left = n - at - 1;
  switch (p[at]) {
    case 'K': return left >= 1 ? v[0] : -1;
    case 'M': return left >= 2 ? v[0] | (v[1] << 8) : -1;
    case 'J':
      return left >= 4 ? static_cast<int32_t>(static_cast<uint32_t>(v[0]) | (static_cast<uint32_t>(v[1]) << 8) |
                                              (static_cast<uint32_t>(v[2]) << 16) | (static_cast<uint32_t>(v[3]) << 24))
                       : -1;
    default: return -1;
  }
}

std::string check(T type, const char* data, size_t size, const std::vector<at::Tensor>& tensors, int wrappers);

std::string checkWrapped(const char* data, size_t size, const std::vector<at::Tensor>& tensors, int wrappers) {
  constexpr size_t kSizeBytes = sizeof(int64_t);
  if (wrappers == kMaxWrappers) {
    return "is wrapped over " + std::to_string(kMaxWrappers) + " deep (upstream wraps a message in its profiler's "
           "and distributed autograd's wrappers at most)";
  }
  if (size < kSizeBytes) return "has " + std::to_string(size) + " bytes, too few for its wrapper's size";
  const auto* end = reinterpret_cast<const unsigned char*>(data + size - kSizeBytes);
  uint64_t declared = 0;
  for (size_t i = 0; i < kSizeBytes; ++i) declared = declared << 8 | end[i];
  const size_t before = size - kSizeBytes;
  if (declared == 0 || declared >= before) {
    return "declares a wrapper of " + std::to_string(declared) + " bytes in " + std::to_string(before);
  }
  const char* wrapper = data + before - declared;
  std::string bad = message::checkPickle(wrapper, declared, /*torchValues=*/true);
  if (!bad.empty()) return "has a wrapper whose " + bad;
  const int64_t inner = wrappedType(reinterpret_cast<const unsigned char*>(wrapper), declared);
  if (inner < 0) return "has a wrapper whose pickle does not begin with the wrapped message's type";
  bad = check(static_cast<T>(inner), data, before - declared, tensors, wrappers + 1);
  return bad.empty() ? "" : "wraps a message that " + bad;
}

// The top-level strings of a tuple that torch's pickle holds must be Python's pickles.
std::string checkPythonPicklesIn(const char* data, size_t size, const std::vector<at::Tensor>& tensors) {
  c10::IValue value;
  try {
    value = torch::jit::unpickle(data, size, nullptr, tensors, message::boundedTypeParser);
  } catch (const std::exception& e) {
    return std::string("has a pickle torch cannot read: ") + e.what();
  }
  if (!value.isTuple()) return "has a pickle that holds no tuple";
  for (const c10::IValue& element : value.toTupleRef().elements()) {
    if (!element.isString()) continue;
    const std::string& python = element.toStringRef();
    const std::string bad = message::checkPickle(python.data(), python.size());
    if (!bad.empty()) return "holds Python's " + bad;
  }
  return "";
}

std::string check(T type, const char* data, size_t size, const std::vector<at::Tensor>& tensors, int wrappers) {
  const Form form = formOf(type);
  switch (form) {
    case Form::kNothing: return "";
    case Form::kWrapped: return checkWrapped(data, size, tensors, wrappers);
    case Form::kPythonPickle: {
      const std::string bad = message::checkPickle(data, size);
      return bad.empty() ? "" : "holds Python's " + bad;
    }
    case Form::kFlagThenPythonPickle: {
      if (size == 0) return "is empty";
      const std::string bad = message::checkPickle(data + 1, size - 1);
      return bad.empty() ? "" : "holds Python's " + bad;
    }
    case Form::kTorchPickle:
    case Form::kTorchPickleOfPythonPickles: break;
  }
  const std::string bad = message::checkPickle(data, size, /*torchValues=*/true);
  if (!bad.empty()) return "holds torch's " + bad;
  return form == Form::kTorchPickle ? "" : checkPythonPicklesIn(data, size, tensors);
}

}  // namespace

std::string checkUpstreamPayload(upstream::MessageType type, const char* data, size_t size,
                                 const std::vector<at::Tensor>& tensors) {
  return check(type, data, size, tensors, 0);
}

}  // namespace torchrpc::torch_backend
