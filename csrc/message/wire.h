#pragma once

// The frame format. One frame per Message:
//
//   FrameHeader (32 bytes, little endian)
//   payload                      payloadLen bytes
//   tensor descriptors           descLen bytes: one per message tensor
//   buffers                      each buffer's nbytes, in order
//                                  (lent buffers have none here)
//
// A tensor descriptor starts with an 8-byte header:
//   u8 dtype, u8 ndim, u16 flags, u8 layout, u8[3] 0
// A strided tensor (layout 0) is one buffer; the header goes on
//   i64 sizes[ndim], i64 strides[ndim] (flags & kStrides only), u64 nbytes,
//   u64 address (flags & kLent only)
// and its nbytes are the span of memory its elements cover (sizes and
// strides say which elements are where; without strides it is contiguous).
// A sparse tensor (layouts 1-5: COO, CSR, CSC, BSR, BSC) goes on
//   i64 sizes[ndim]
// followed by its components, each a strided tensor's descriptor (COO:
// indices, values; the others: compressed indices, plain indices, values);
// its flags say whether a COO tensor is coalesced. A view of shared memory
// (layout 6, flags 0) goes on
//   u32 owner, u32 0, u64 byte offset, i64 sizes[ndim], i64 strides[ndim]
// where tensor #owner (this one or an earlier one of layout 6 that owns
// itself) carries the memory: the owner's descriptor ends with a strided
// descriptor of the memory's bytes (uint8, one dimension). What travels for
// each layout, and how it is rebuilt, is in tensor_layout.h.
//
// A lent buffer (flags & kLent) stays in the sender's memory at `address`,
// and the receiver copies it from there (transport/same_host.h). Sending
// writes the header+payload+descriptors from one buffer and each buffer
// straight from its tensor's memory (writev, no copy). Receiving allocates
// each buffer from its descriptor and reads its bytes straight into it, then
// rebuilds the message's tensors from them. Every field is validated before
// anything is allocated, and sparse components against torch's invariants
// before a tensor is made of them: a frame that fails is an error for that
// connection only.

#include <sys/uio.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "message/message.h"
#include "message/tensor_layout.h"

namespace torchrpc::message {

constexpr uint32_t kFrameMagic = 0x43505254;  // "TRPC"
constexpr uint64_t kMaxPayloadBytes = 1ull << 31;  // pickles above 2 GB: use tensors
constexpr uint32_t kMaxTensorsPerFrame = 1u << 16;
constexpr uint64_t kDefaultMaxFrameBytes = 16ull << 30;  // RpcOptions(max_message_bytes=...)

#pragma pack(push, 1)
struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint64_t id;
  uint64_t payloadLen;
  uint32_t numTensors;
  uint32_t descLen;
};
#pragma pack(pop)
static_assert(sizeof(FrameHeader) == 32, "FrameHeader is 32 bytes on the wire");

// A message ready to be written: one prefix buffer and the buffers, in order.
struct OutgoingFrame {
  std::string prefix;                   // header + payload + descriptors
  std::vector<layout::Buffer> buffers;  // kept alive until written
  std::vector<layout::Buffer> lent;     // kept alive until the peer released them
  uint64_t totalBytes() const;          // what goes through the socket
  // Fills iov with the unwritten remainder, starting `offset` bytes in.
  // Returns the number of entries used (at most maxIov).
  int fillIov(uint64_t offset, struct iovec* iov, int maxIov) const;
};

// Builds the frame (each tensor as tensor_layout.h says). Buffers of
// lendFrom bytes or more are lent (0: none). Throws c10::Error on tensors
// that cannot travel.
OutgoingFrame encodeFrame(Message&& message, uint64_t lendFrom = 0);

// The message as a peer would receive it: encodeFrame and FrameReader in
// one step, every tensor copied once (sharing memory as tensor_layout.h
// says). For the calls a worker makes to itself, which skip the transport
// but not its copies, as upstream's agent sends them through its own pipe.
// Throws c10::Error on tensors that cannot travel.
Message loopback(Message&& message);

// A lent buffer of a received frame: buffers[index] is allocated and must be
// copied from `address` in the sender's memory.
struct LentTensor {
  size_t index;
  uint64_t address;
};

struct ReceivedFrame {
  Message message;  // its tensors are there once assembleTensors() succeeded
  std::vector<LentTensor> lent;
  // What the tensors are made of, until assembleTensors() makes them.
  std::vector<at::Tensor> buffers;
  std::vector<layout::BufferSpec> bufferSpecs;
  std::vector<layout::TensorSpec> tensorSpecs;
};

// Makes frame.message.tensors from the frame's buffers, all of them received
// (lent ones copied). Returns why they do not make valid tensors (the frame
// is malformed), or "". The reader does this itself for frames without lent
// buffers.
std::string assembleTensors(ReceivedFrame& frame);

// Incremental parser. Feed it bytes with consume(); it reads buffers straight
// into tensor memory through directReadRegion() when a large one is being
// received. Not thread-safe: one per connection, used by the loop.
//
// A frame declaring more than maxFrameBytes (payload, descriptors and buffer
// bytes together) is an error before anything is allocated for it. Within
// the cap, a buffer's memory is taken when its first byte arrives and
// populated window by window as the bytes come; a failed allocation is an
// error of this connection, never an exception.
class FrameReader {
 public:
  explicit FrameReader(uint64_t maxFrameBytes = kDefaultMaxFrameBytes) : maxFrameBytes_(maxFrameBytes) {}

  // Consumes up to len bytes; returns how many it used. After an error, error()
  // is set and nothing more is consumed.
  size_t consume(const char* data, size_t len);

  // When the parser is in the middle of a buffer, the remaining bytes of that
  // buffer can be read directly into this region (zero-copy receive).
  std::optional<std::pair<char*, size_t>> directReadRegion();
  void commitDirectRead(size_t n);

  // Completed frames, in order. Moves them out.
  std::vector<ReceivedFrame> takeFrames();
  const std::string& error() const { return error_; }
  bool midFrame() const { return state_ != State::kHeader || filled_ != 0; }

 private:
  enum class State { kHeader, kPrefix, kBuffers };
  static constexpr uint64_t kPrefixReserveBytes = 1ull << 20;
  static constexpr uint64_t kDirectReadWindowBytes = 16ull << 20;

  bool startPrefix();
  bool parseDescriptors();
  // Allocates buffer `index` of the current frame if it is not yet; false
  // (and error()) if the memory cannot be had.
  bool allocate(size_t index);
  void finishBufferOrFrame();
  void fail(std::string why);
  void failOverCap(uint64_t declared);

  const uint64_t maxFrameBytes_;

  State state_{State::kHeader};
  FrameHeader header_{};
  size_t filled_{0};       // bytes of the current section read so far
  std::string prefix_;     // payload + descriptors of the current frame
  ReceivedFrame current_;
  size_t bufferIndex_{0};
  std::vector<ReceivedFrame> done_;
  std::string error_;
};

}  // namespace torchrpc::message
