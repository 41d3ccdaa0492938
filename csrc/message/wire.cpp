#include "message/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "message/receive_buffers.h"

namespace torchrpc::message {

// Bumped whenever a frame or payload changes form, so mixed builds fail at
// once with a clear error. 4: layout 6 (kShared); 5: plain_codec payloads.
constexpr uint16_t kWireVersion = 5;

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
    case MessageType::kTorchRequest: return "TORCH_REQUEST";
    case MessageType::kTorchResponse: return "TORCH_RESPONSE";
  }
  return "UNKNOWN";
}

namespace {

bool knownMessageType(uint16_t t) {
  return std::string(messageTypeName(static_cast<MessageType>(t))) != "UNKNOWN";
}

template <typename T>
void appendPod(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

uint64_t OutgoingFrame::totalBytes() const {
  uint64_t n = prefix.size();
  for (const auto& b : buffers) n += b.bytes;
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
  for (const auto& b : buffers) add(b.data, b.bytes);
  return used;
}

OutgoingFrame encodeFrame(Message&& message, uint64_t lendFrom) {
  OutgoingFrame frame;
  std::string desc;
  frame.buffers.reserve(message.tensors.size());
  TORCH_CHECK(message.tensors.size() <= kMaxTensorsPerFrame,
              "a message may carry at most ", kMaxTensorsPerFrame,
              " tensors; got ", message.tensors.size());
  layout::encodeTensors(message.tensors, lendFrom, desc, frame.buffers, frame.lent);
  TORCH_CHECK(message.payload.size() <= kMaxPayloadBytes,
              "the pickled part of a message is ", message.payload.size(),
              " bytes; the limit is ", kMaxPayloadBytes,
              ". Pass large data as tensors, which have no such limit.");
  TORCH_CHECK(desc.size() <= std::numeric_limits<uint32_t>::max(), "the message's ", message.tensors.size(),
              " tensors need ", desc.size(), " bytes of descriptors; the limit is 4 GB");
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

std::string assembleTensors(ReceivedFrame& frame) {
  auto& tensors = frame.message.tensors;
  tensors.resize(frame.tensorSpecs.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string why = layout::assemble(frame.tensorSpecs[i], frame.bufferSpecs, frame.buffers, i, tensors[i]);
    if (!why.empty()) {
      tensors.clear();
      return why;
    }
  }
  frame.buffers.clear();
  frame.bufferSpecs.clear();
  frame.tensorSpecs.clear();
  return "";
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
  uint64_t minDesc = 16ull * h.numTensors;  // a contiguous scalar: header and nbytes
  uint64_t maxDesc = layout::kMaxDescriptorBytes * h.numTensors;
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
  auto& buffers = current_.bufferSpecs;
  current_.tensorSpecs.resize(header_.numTensors);
  buffers.reserve(header_.numTensors);
  uint64_t frameBytes = header_.payloadLen + header_.descLen;
  for (uint32_t i = 0; i < header_.numTensors; ++i) {
    const size_t first = buffers.size();
    std::string why = layout::parseTensor(p, end, i, current_.tensorSpecs, current_.tensorSpecs[i], buffers);
    if (!why.empty()) {
      fail(std::move(why));
      return false;
    }
    for (size_t k = first; k < buffers.size(); ++k) {
      frameBytes += buffers[k].nbytes;
      if (frameBytes > maxFrameBytes_) {
        failOverCap(frameBytes);
        return false;
      }
    }
  }
  if (p != end) {
    fail("descriptor section has " + std::to_string(end - p) + " trailing bytes");
    return false;
  }
  // Memory is taken when a buffer's bytes start to arrive (allocate()); a
  // lent one is copied as soon as the frame is complete.
  current_.buffers.resize(buffers.size());
  for (size_t k = 0; k < buffers.size(); ++k) {
    if (buffers[k].address == 0) continue;
    current_.lent.push_back({k, buffers[k].address});
    if (!allocate(k)) return false;
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
  at::Tensor& t = current_.buffers[index];
  if (t.defined()) return true;
  const layout::BufferSpec& spec = current_.bufferSpecs[index];
  try {
    t = layout::allocate(spec);
  } catch (const std::exception& e) {
    fail("cannot allocate " + std::to_string(spec.nbytes) + " bytes for buffer #" + std::to_string(index) +
         " of frame #" + std::to_string(header_.id) + ": " + e.what());
    return false;
  }
  return true;
}

void FrameReader::finishBufferOrFrame() {
  // Skip buffers that are complete (including empty and lent ones).
  const auto& specs = current_.bufferSpecs;
  while (bufferIndex_ < specs.size() && (specs[bufferIndex_].address != 0 || filled_ >= specs[bufferIndex_].nbytes)) {
    if (!allocate(bufferIndex_)) return;  // an empty or lent one is allocated already
    ++bufferIndex_;
    filled_ = 0;
  }
  if (bufferIndex_ < specs.size()) return;
  if (current_.lent.empty()) {
    std::string why = assembleTensors(current_);
    if (!why.empty()) {
      fail("frame #" + std::to_string(header_.id) + ": " + why);
      return;
    }
  }
  done_.push_back(std::move(current_));
  current_ = ReceivedFrame{};
  state_ = State::kHeader;
  filled_ = 0;
  bufferIndex_ = 0;
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
            state_ = State::kBuffers;
            bufferIndex_ = 0;
            filled_ = 0;
            finishBufferOrFrame();
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
          state_ = State::kBuffers;
          bufferIndex_ = 0;
          filled_ = 0;
          finishBufferOrFrame();
        }
        break;
      }
      case State::kBuffers: {
        if (!allocate(bufferIndex_)) return used;
        char* buffer = static_cast<char*>(current_.buffers[bufferIndex_].data_ptr());
        size_t n = std::min<uint64_t>(len - used, current_.bufferSpecs[bufferIndex_].nbytes - filled_);
        std::memcpy(buffer + filled_, data + used, n);
        filled_ += n;
        used += n;
        finishBufferOrFrame();
        break;
      }
    }
  }
  return used;
}

std::optional<std::pair<char*, size_t>> FrameReader::directReadRegion() {
  if (state_ != State::kBuffers || !error_.empty()) {
    return std::nullopt;
  }
  if (!allocate(bufferIndex_)) return std::nullopt;
  const uint64_t nbytes = current_.bufferSpecs[bufferIndex_].nbytes;
  // One window at a time, its pages faulted in just before the read: memory
  // is populated as the bytes arrive, never for what a peer only declared.
  char* begin = static_cast<char*>(current_.buffers[bufferIndex_].data_ptr()) + filled_;
  size_t n = static_cast<size_t>(std::min<uint64_t>(nbytes - filled_, kDirectReadWindowBytes));
  if (nbytes >= receive_buffers::kMinBytes) receive_buffers::populate(begin, n);
  return std::make_pair(begin, n);
}

void FrameReader::commitDirectRead(size_t n) {
  filled_ += n;
  finishBufferOrFrame();
}

Message loopback(Message&& message) {
  if (message.tensors.empty()) return std::move(message);
  const OutgoingFrame frame = encodeFrame(std::move(message));
  FrameReader reader(std::numeric_limits<uint64_t>::max());  // its own message: the sender checked the size
  reader.consume(frame.prefix.data(), frame.prefix.size());
  for (const auto& b : frame.buffers) reader.consume(static_cast<const char*>(b.data), b.bytes);
  std::vector<ReceivedFrame> frames = reader.takeFrames();
  TORCH_CHECK(reader.error().empty() && frames.size() == 1, "torchrpc: a message to this worker itself did not parse (",
              reader.error(), ")");
  return std::move(frames.front().message);
}

std::vector<ReceivedFrame> FrameReader::takeFrames() {
  std::vector<ReceivedFrame> out;
  out.swap(done_);
  return out;
}

}  // namespace torchrpc::message
