#pragma once

// The frame format. One frame per Message:
//
//   FrameHeader (32 bytes, little endian)
//   payload                      payloadLen bytes
//   tensor descriptors           descLen bytes: per tensor
//                                  u8 dtype, u8 ndim, u16 flags, u32 0,
//                                  i64 sizes[ndim], u64 nbytes,
//                                  u64 address (lent tensors only)
//   tensor data                  each tensor's nbytes, in order, contiguous
//                                  (lent tensors have none here)
//
// A lent tensor (flags & kTensorLent) stays in the sender's memory at
// `address`, and the receiver copies it from there (transport/same_host.h).
// Sending writes the header+payload+descriptors from one buffer and each
// tensor straight from its storage (writev, no copy). Receiving allocates each
// tensor from its descriptor and reads its bytes straight into it. Every field
// is validated before anything is allocated: a frame that fails validation is
// an error for that connection only.

#include <sys/uio.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "message/message.h"

namespace torchrpc::message {

constexpr uint32_t kFrameMagic = 0x43505254;  // "TRPC"
constexpr uint16_t kWireVersion = 2;
constexpr uint16_t kTensorLent = 1;  // descriptor flag
constexpr uint64_t kMaxPayloadBytes = 1ull << 31;  // pickles above 2 GB: use tensors
constexpr uint32_t kMaxTensorsPerFrame = 1u << 16;
constexpr uint32_t kMaxTensorDims = 64;
constexpr uint64_t kMaxTensorBytes = 1ull << 40;  // 1 TB: only a sanity bound
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

// A message ready to be written: one prefix buffer and the tensors, in order.
struct OutgoingFrame {
  std::string prefix;               // header + payload + descriptors
  std::vector<at::Tensor> tensors;  // contiguous; kept alive until written
  std::vector<at::Tensor> lent;     // kept alive until the peer released them
  uint64_t totalBytes() const;      // what goes through the socket
  // Fills iov with the unwritten remainder, starting `offset` bytes in.
  // Returns the number of entries used (at most maxIov).
  int fillIov(uint64_t offset, struct iovec* iov, int maxIov) const;
};

// Builds the frame; non-contiguous tensors and views are made contiguous, so a
// view sends only its own elements. Tensors of lendFrom bytes or more are
// lent (0: none). Throws c10::Error on unsupported tensors.
OutgoingFrame encodeFrame(Message&& message, uint64_t lendFrom = 0);

// A lent tensor of a received frame: message.tensors[index] is allocated and
// must be copied from `address` in the sender's memory.
struct LentTensor {
  size_t index;
  uint64_t address;
};

struct ReceivedFrame {
  Message message;
  std::vector<LentTensor> lent;
};

// Incremental parser. Feed it bytes with consume(); it reads tensor data
// straight into tensor storage through nextDirectRead() when a large tensor is
// being received. Not thread-safe: one per connection, used by the loop.
//
// A frame declaring more than maxFrameBytes (payload, descriptors and tensor
// bytes together) is an error before anything is allocated for it. Within
// the cap, a tensor's memory is taken when its first byte arrives and
// populated window by window as the bytes come; a failed allocation is an
// error of this connection, never an exception.
class FrameReader {
 public:
  explicit FrameReader(uint64_t maxFrameBytes = kDefaultMaxFrameBytes) : maxFrameBytes_(maxFrameBytes) {}

  // Consumes up to len bytes; returns how many it used. After an error, error()
  // is set and nothing more is consumed.
  size_t consume(const char* data, size_t len);

  // When the parser is in the middle of a tensor, the remaining bytes of that
  // tensor can be read directly into this region (zero-copy receive).
  std::optional<std::pair<char*, size_t>> directReadRegion();
  void commitDirectRead(size_t n);

  // Completed frames, in order. Moves them out.
  std::vector<ReceivedFrame> takeFrames();
  const std::string& error() const { return error_; }
  bool midFrame() const { return state_ != State::kHeader || filled_ != 0; }

 private:
  enum class State { kHeader, kPrefix, kTensors };
  struct TensorSpec {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype;
    uint64_t nbytes;
  };
  static constexpr uint64_t kPrefixReserveBytes = 1ull << 20;
  static constexpr uint64_t kDirectReadWindowBytes = 16ull << 20;

  bool startPrefix();
  bool parseDescriptors();
  // Allocates tensor `index` of the current frame if it is not yet; false
  // (and error()) if the memory cannot be had.
  bool allocate(size_t index);
  void finishTensorOrFrame();
  void fail(std::string why);
  void failOverCap(uint64_t declared);

  const uint64_t maxFrameBytes_;
  std::vector<TensorSpec> specs_;  // per tensor of the current frame

  State state_{State::kHeader};
  FrameHeader header_{};
  size_t filled_{0};       // bytes of the current section read so far
  std::string prefix_;     // payload + descriptors of the current frame
  ReceivedFrame current_;
  std::vector<bool> lent_;  // per tensor of the current frame: no bytes in the stream
  size_t tensorIndex_{0};
  std::vector<ReceivedFrame> done_;
  std::string error_;
};

}  // namespace torchrpc::message
