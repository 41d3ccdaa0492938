#include "message/wire.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstring>

#include "message/receive_buffers.h"

namespace torchrpc::message {

const char* messageTypeName(MessageType t) {
  switch (t) {
    case MessageType::kHello: return "HELLO";
    case MessageType::kGoodbye: return "GOODBYE";
    case MessageType::kPing: return "PING";
    case MessageType::kPong: return "PONG";
    case MessageType::kLendOffer: return "LEND_OFFER";
    case MessageType::kLendAccept: return "LEND_ACCEPT";
    case MessageType::kLendRelease: return "LEND_RELEASE";
    case MessageType::kScriptCall: return "SCRIPT_CALL";
    case MessageType::kBuiltinCall: return "BUILTIN_CALL";
    case MessageType::kPythonCall: return "PYTHON_CALL";
    case MessageType::kScriptRet: return "SCRIPT_RET";
    case MessageType::kPythonRet: return "PYTHON_RET";
    case MessageType::kException: return "EXCEPTION";
    case MessageType::kRemoteCall: return "REMOTE_CALL";
    case MessageType::kRRefFetch: return "RREF_FETCH";
    case MessageType::kRRefUserDelete: return "RREF_USER_DELETE";
    case MessageType::kRRefForkRequest: return "RREF_FORK_REQUEST";
    case MessageType::kRRefChildAccept: return "RREF_CHILD_ACCEPT";
    case MessageType::kRRefMethodCall: return "RREF_METHOD_CALL";
    case MessageType::kAutogradCall: return "AUTOGRAD_CALL";
    case MessageType::kAutogradRet: return "AUTOGRAD_RET";
    case MessageType::kProfiledCall: return "PROFILED_CALL";
    case MessageType::kProfiledRet: return "PROFILED_RET";
    case MessageType::kAutogradBackward: return "AUTOGRAD_BACKWARD";
    case MessageType::kAutogradCleanup: return "AUTOGRAD_CLEANUP";
    case MessageType::kAutogradPassDone: return "AUTOGRAD_PASS_DONE";
    case MessageType::kMemberJoin: return "MEMBER_JOIN";
    case MessageType::kMemberLeave: return "MEMBER_LEAVE";
  }
  return "UNKNOWN";
}

namespace {

// The tensor a received one is read into: large ones from the cache of
// receive buffers (receive_buffers.h).
at::Tensor emptyForReceive(const std::vector<int64_t>& sizes, c10::ScalarType dtype, uint64_t nbytes) {
  if (nbytes >= receive_buffers::kMinBytes) return receive_buffers::empty(sizes, dtype, nbytes);
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

bool knownMessageType(uint16_t t) {
  return std::string(messageTypeName(static_cast<MessageType>(t))) != "UNKNOWN";
}

// The dtypes that may travel. Anything else (quantized, bits, undefined) is
// rejected on both ends.
bool supportedDtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Byte: case c10::ScalarType::Char:
    case c10::ScalarType::Short: case c10::ScalarType::Int:
    case c10::ScalarType::Long: case c10::ScalarType::Half:
    case c10::ScalarType::Float: case c10::ScalarType::Double:
    case c10::ScalarType::ComplexHalf: case c10::ScalarType::ComplexFloat:
    case c10::ScalarType::ComplexDouble: case c10::ScalarType::Bool:
    case c10::ScalarType::BFloat16: case c10::ScalarType::UInt16:
    case c10::ScalarType::UInt32: case c10::ScalarType::UInt64:
    case c10::ScalarType::Float8_e5m2: case c10::ScalarType::Float8_e4m3fn:
      return true;
    default:
      return false;
  }
}

template <typename T>
void appendPod(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

uint64_t OutgoingFrame::totalBytes() const {
  uint64_t n = prefix.size();
  for (const auto& t : tensors) {
    n += t.nbytes();
  }
  return n;
}

int OutgoingFrame::fillIov(uint64_t offset, struct iovec* iov, int maxIov) const {
  int used = 0;
  auto add = [&](const char* base, uint64_t len) {
    if (used >= maxIov) return;
    if (offset >= len) {
      offset -= len;
      return;
    }
    iov[used].iov_base = const_cast<char*>(base + offset);
    iov[used].iov_len = len - offset;
    offset = 0;
    ++used;
  };
  add(prefix.data(), prefix.size());
  for (const auto& t : tensors) {
    add(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return used;
}

OutgoingFrame encodeFrame(Message&& message, uint64_t lendFrom) {
  OutgoingFrame frame;
  std::string desc;
  frame.tensors.reserve(message.tensors.size());
  TORCH_CHECK(message.tensors.size() <= kMaxTensorsPerFrame,
              "a message may carry at most ", kMaxTensorsPerFrame,
              " tensors; got ", message.tensors.size());
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const at::Tensor& t = message.tensors[i];
    TORCH_CHECK(t.defined(), "tensor #", i, " of the message is undefined");
    TORCH_CHECK(t.device().is_cpu(),
                "torchrpc sends CPU tensors only; tensor #", i, " is on ",
                t.device(), ". Move it with .cpu() before the call.");
    TORCH_CHECK(t.layout() == c10::kStrided,
                "torchrpc sends dense (strided) tensors only; tensor #", i,
                " has layout ", t.layout(), ". Convert it with .to_dense().");
    TORCH_CHECK(supportedDtype(t.scalar_type()),
                "torchrpc cannot send tensors of dtype ", t.scalar_type(),
                " (tensor #", i, ")");
    TORCH_CHECK(static_cast<uint32_t>(t.dim()) <= kMaxTensorDims,
                "tensor #", i, " has ", t.dim(), " dimensions; at most ",
                kMaxTensorDims, " are supported");
    at::Tensor c = t.detach().contiguous();
    const bool lend = lendFrom > 0 && c.nbytes() >= lendFrom;
    appendPod(desc, static_cast<uint8_t>(c.scalar_type()));
    appendPod(desc, static_cast<uint8_t>(c.dim()));
    appendPod(desc, static_cast<uint16_t>(lend ? kTensorLent : 0));
    appendPod(desc, static_cast<uint32_t>(0));
    for (int64_t s : c.sizes()) {
      appendPod(desc, s);
    }
    appendPod(desc, static_cast<uint64_t>(c.nbytes()));
    if (lend) {
      appendPod(desc, reinterpret_cast<uint64_t>(c.data_ptr()));
      frame.lent.push_back(std::move(c));
    } else {
      frame.tensors.push_back(std::move(c));
    }
  }
  TORCH_CHECK(message.payload.size() <= kMaxPayloadBytes,
              "the pickled part of a message is ", message.payload.size(),
              " bytes; the limit is ", kMaxPayloadBytes,
              ". Pass large data as tensors, which have no such limit.");
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kWireVersion;
  h.type = static_cast<uint16_t>(message.type);
  h.id = message.id;
  h.payloadLen = message.payload.size();
  h.numTensors = static_cast<uint32_t>(message.tensors.size());
  h.descLen = static_cast<uint32_t>(desc.size());
  frame.prefix.reserve(sizeof(h) + message.payload.size() + desc.size());
  appendPod(frame.prefix, h);
  frame.prefix.append(message.payload);
  frame.prefix.append(desc);
  return frame;
}

// ---- FrameReader -----------------------------------------------------------

void FrameReader::fail(std::string why) {
  if (error_.empty()) {
    error_ = std::move(why);
  }
}

bool FrameReader::startPrefix() {
  const FrameHeader& h = header_;
  if (h.magic != kFrameMagic) {
    fail("bad frame magic 0x" + c10::str(std::hex, h.magic) +
         " (not a torchrpc peer, or the stream is out of sync)");
    return false;
  }
  if (h.version != kWireVersion) {
    fail("unsupported wire version " + std::to_string(h.version) +
         " (this build speaks " + std::to_string(kWireVersion) +
         "): every worker must run the same torchrpc version");
    return false;
  }
  if (!knownMessageType(h.type)) {
    fail("unknown message type " + std::to_string(h.type));
    return false;
  }
  if (h.payloadLen > kMaxPayloadBytes) {
    fail("payload length " + std::to_string(h.payloadLen) + " exceeds the limit " +
         std::to_string(kMaxPayloadBytes));
    return false;
  }
  if (h.numTensors > kMaxTensorsPerFrame) {
    fail("frame claims " + std::to_string(h.numTensors) + " tensors; the limit is " +
         std::to_string(kMaxTensorsPerFrame));
    return false;
  }
  uint64_t minDesc = 16ull * h.numTensors;
  uint64_t maxDesc = (24ull + 8ull * kMaxTensorDims) * h.numTensors;  // a lent one has an address
  if (h.descLen < minDesc || h.descLen > maxDesc) {
    fail("descriptor length " + std::to_string(h.descLen) + " does not fit " +
         std::to_string(h.numTensors) + " tensors");
    return false;
  }
  if (h.payloadLen + h.descLen > maxFrameBytes_) {
    failOverCap(h.payloadLen + h.descLen);
    return false;
  }
  current_ = ReceivedFrame{};
  current_.message.type = static_cast<MessageType>(h.type);
  current_.message.id = h.id;
  lent_.clear();
  specs_.clear();
  prefix_.clear();
  // Grows as bytes arrive: a declared length reserves nothing up front.
  prefix_.reserve(std::min<uint64_t>(h.payloadLen + h.descLen, kPrefixReserveBytes));
  state_ = State::kPrefix;
  filled_ = 0;
  return true;
}

bool FrameReader::parseDescriptors() {
  const char* p = prefix_.data() + header_.payloadLen;
  const char* end = prefix_.data() + prefix_.size();
  auto need = [&](size_t n) { return static_cast<size_t>(end - p) >= n; };
  current_.message.tensors.reserve(header_.numTensors);
  specs_.reserve(header_.numTensors);
  lent_.assign(header_.numTensors, false);
  uint64_t frameBytes = header_.payloadLen + header_.descLen;
  for (uint32_t i = 0; i < header_.numTensors; ++i) {
    if (!need(8)) {
      fail("truncated descriptor of tensor #" + std::to_string(i));
      return false;
    }
    uint8_t dtype = static_cast<uint8_t>(p[0]);
    uint8_t ndim = static_cast<uint8_t>(p[1]);
    uint16_t flags;
    std::memcpy(&flags, p + 2, 2);
    p += 8;
    if ((flags & ~kTensorLent) != 0) {
      fail("tensor #" + std::to_string(i) + " has unknown flags 0x" + c10::str(std::hex, flags));
      return false;
    }
    if (dtype >= static_cast<uint8_t>(c10::ScalarType::NumOptions) ||
        !supportedDtype(static_cast<c10::ScalarType>(dtype))) {
      fail("tensor #" + std::to_string(i) + " has unsupported dtype code " +
           std::to_string(dtype));
      return false;
    }
    if (ndim > kMaxTensorDims) {
      fail("tensor #" + std::to_string(i) + " claims " + std::to_string(ndim) +
           " dimensions; the limit is " + std::to_string(kMaxTensorDims));
      return false;
    }
    if (!need(8ull * ndim + 8)) {
      fail("truncated sizes of tensor #" + std::to_string(i));
      return false;
    }
    std::vector<int64_t> sizes(ndim);
    std::memcpy(sizes.data(), p, 8ull * ndim);
    p += 8ull * ndim;
    uint64_t nbytes;
    std::memcpy(&nbytes, p, 8);
    p += 8;
    auto st = static_cast<c10::ScalarType>(dtype);
    uint64_t numel = 1;
    for (int64_t s : sizes) {
      if (s < 0) {
        fail("tensor #" + std::to_string(i) + " has a negative size " + std::to_string(s));
        return false;
      }
      if (s != 0 && numel > kMaxTensorBytes / static_cast<uint64_t>(s)) {
        fail("tensor #" + std::to_string(i) + " is larger than the 1 TB limit");
        return false;
      }
      numel *= static_cast<uint64_t>(s);
    }
    uint64_t expect = numel * c10::elementSize(st);
    if (expect > kMaxTensorBytes || nbytes != expect) {
      fail("tensor #" + std::to_string(i) + " claims " + std::to_string(nbytes) +
           " bytes but its sizes and dtype " + std::string(c10::toString(st)) +
           " need " + std::to_string(expect));
      return false;
    }
    frameBytes += nbytes;
    if (frameBytes > maxFrameBytes_) {
      failOverCap(frameBytes);
      return false;
    }
    if (flags & kTensorLent) {
      if (!need(8)) {
        fail("truncated address of lent tensor #" + std::to_string(i));
        return false;
      }
      uint64_t address;
      std::memcpy(&address, p, 8);
      p += 8;
      if (address == 0 || nbytes == 0) {
        fail("lent tensor #" + std::to_string(i) + " has no memory to copy (address " +
             std::to_string(address) + ", " + std::to_string(nbytes) + " bytes)");
        return false;
      }
      current_.lent.push_back({i, address});
      lent_[i] = true;
    }
    // Memory is taken when the tensor's bytes start to arrive (allocate());
    // a lent one is copied as soon as the frame is complete.
    specs_.push_back({std::move(sizes), st, nbytes});
    current_.message.tensors.emplace_back();
    if (lent_[i] && !allocate(i)) return false;
  }
  if (p != end) {
    fail("descriptor section has " + std::to_string(end - p) + " trailing bytes");
    return false;
  }
  current_.message.payload.assign(prefix_.data(), header_.payloadLen);
  prefix_.clear();
  prefix_.shrink_to_fit();
  return true;
}

void FrameReader::failOverCap(uint64_t declared) {
  fail("frame #" + std::to_string(header_.id) + " (" + messageTypeName(static_cast<MessageType>(header_.type)) +
       ") declares at least " + std::to_string(declared) + " bytes; this worker accepts at most " +
       std::to_string(maxFrameBytes_) + " per message (RpcOptions(max_message_bytes=...))");
}

bool FrameReader::allocate(size_t index) {
  at::Tensor& t = current_.message.tensors[index];
  if (t.defined()) return true;
  const TensorSpec& spec = specs_[index];
  try {
    t = emptyForReceive(spec.sizes, spec.dtype, spec.nbytes);
  } catch (const std::exception& e) {
    fail("cannot allocate " + std::to_string(spec.nbytes) + " bytes for tensor #" + std::to_string(index) +
         " of frame #" + std::to_string(header_.id) + ": " + e.what());
    return false;
  }
  return true;
}

void FrameReader::finishTensorOrFrame() {
  // Skip tensors that are complete (including empty and lent ones).
  auto& tensors = current_.message.tensors;
  while (tensorIndex_ < tensors.size() && (lent_[tensorIndex_] || filled_ >= specs_[tensorIndex_].nbytes)) {
    if (!lent_[tensorIndex_] && !allocate(tensorIndex_)) return;  // an empty one
    ++tensorIndex_;
    filled_ = 0;
  }
  if (tensorIndex_ == tensors.size()) {
    done_.push_back(std::move(current_));
    current_ = ReceivedFrame{};
    state_ = State::kHeader;
    filled_ = 0;
    tensorIndex_ = 0;
  }
}

size_t FrameReader::consume(const char* data, size_t len) {
  size_t used = 0;
  while (used < len && error_.empty()) {
    switch (state_) {
      case State::kHeader: {
        size_t n = std::min(len - used, sizeof(FrameHeader) - filled_);
        std::memcpy(reinterpret_cast<char*>(&header_) + filled_, data + used, n);
        filled_ += n;
        used += n;
        if (filled_ == sizeof(FrameHeader)) {
          if (!startPrefix()) return used;
          if (header_.payloadLen + header_.descLen == 0) {
            state_ = State::kTensors;
            tensorIndex_ = 0;
            filled_ = 0;
            finishTensorOrFrame();
          }
        }
        break;
      }
      case State::kPrefix: {
        size_t want = header_.payloadLen + header_.descLen;
        size_t n = std::min(len - used, want - prefix_.size());
        prefix_.append(data + used, n);
        used += n;
        if (prefix_.size() == want) {
          if (!parseDescriptors()) return used;
          state_ = State::kTensors;
          tensorIndex_ = 0;
          filled_ = 0;
          finishTensorOrFrame();
        }
        break;
      }
      case State::kTensors: {
        if (!allocate(tensorIndex_)) return used;
        at::Tensor& t = current_.message.tensors[tensorIndex_];
        size_t n = std::min<uint64_t>(len - used, t.nbytes() - filled_);
        std::memcpy(static_cast<char*>(t.data_ptr()) + filled_, data + used, n);
        filled_ += n;
        used += n;
        finishTensorOrFrame();
        break;
      }
    }
  }
  return used;
}

std::optional<std::pair<char*, size_t>> FrameReader::directReadRegion() {
  if (state_ != State::kTensors || !error_.empty()) {
    return std::nullopt;
  }
  if (!allocate(tensorIndex_)) return std::nullopt;
  at::Tensor& t = current_.message.tensors[tensorIndex_];
  // One window at a time, its pages faulted in just before the read: memory
  // is populated as the bytes arrive, never for what a peer only declared.
  char* begin = static_cast<char*>(t.data_ptr()) + filled_;
  size_t n = static_cast<size_t>(std::min<uint64_t>(t.nbytes() - filled_, kDirectReadWindowBytes));
  if (t.nbytes() >= receive_buffers::kMinBytes) receive_buffers::populate(begin, n);
  return std::make_pair(begin, n);
}

void FrameReader::commitDirectRead(size_t n) {
  filled_ += n;
  finishTensorOrFrame();
}

std::vector<ReceivedFrame> FrameReader::takeFrames() {
  std::vector<ReceivedFrame> out;
  out.swap(done_);
  return out;
}

}  // namespace torchrpc::message
