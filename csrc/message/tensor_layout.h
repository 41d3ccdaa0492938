#pragma once

// How one message tensor travels: as one or more buffers of raw bytes, and
// a descriptor that says how to rebuild it (the byte format is in wire.h).
//
// Strided tensors keep their layout. A contiguous one travels as its bytes.
// A non-contiguous one travels as the span of memory its elements cover, with
// its strides, when that span is no larger than its elements (a transposed,
// permuted or channels-last tensor; an expanded one) or is small (at most
// kSmallSpanBytes, e.g. a narrow view of a small tensor): it arrives with the
// same strides. Otherwise (a slice of a large tensor) it travels as a
// contiguous copy, so only the view's own elements travel, never the rest of
// its storage. Either way the receiver's tensor owns its memory (no view).
//
// Strided tensors of one message that share memory (one storage: a tensor
// and its views, or the same tensor twice) travel as one span of that memory,
// from the first byte any of them uses to the last, and arrive sharing it,
// each with its offset, sizes and strides (layout kShared), as upstream's do:
// a callee that changes one in place changes the others. Unless that span is
// over kSmallSpanBytes and over twice their elements (slices far apart in a
// large tensor): then each travels on its own, as above (upstream copies
// such views too).
//
// Sparse tensors (COO, CSR, CSC, BSR, BSC) travel as their components,
// never densified: COO as indices and values (and whether it is coalesced),
// the compressed layouts as compressed indices, plain indices and values.
// Both ends check the components against torch's invariants for the layout
// (index bounds, shapes, compressed-index order, coalescing as claimed):
// the sender, for a clear error at the call; the receiver, so a peer cannot
// make this process hold an invalid sparse tensor, which torch would not
// check again. COO is checked in one pass here (torch's own check costs more
// than a call); the compressed layouts by torch's check.
//
// Threads: pure functions, any thread.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/python_held.h"

namespace torchrpc::message::layout {

constexpr uint64_t kSmallSpanBytes = 8u << 10;
constexpr uint32_t kMaxTensorDims = 64;
constexpr uint64_t kMaxTensorBytes = 1ull << 40;  // 1 TB: only a sanity bound

// Descriptor layout codes: part of the wire format, never renumber.
enum class Code : uint8_t {
  kStrided = 0, kSparseCoo = 1, kSparseCsr = 2, kSparseCsc = 3, kSparseBsr = 4, kSparseBsc = 5,
  kShared = 6,  // a strided view of memory that a tensor of the message carries (wire.h)
};

// Descriptor flags (u16).
constexpr uint16_t kLent = 1;        // a buffer: its bytes stay at `address` in the sender
constexpr uint16_t kStrides = 2;     // a buffer: strides follow its sizes
constexpr uint16_t kCoalesced = 4;   // a sparse COO tensor: is_coalesced()

// The most descriptor bytes one tensor takes (a sparse one of three
// components, each with strides and an address).
constexpr uint64_t kMaxDescriptorBytes = (8 + 8 * kMaxTensorDims) + 3 * (8 + 16 * kMaxTensorDims + 16);

// The dtypes that may travel: anything else (quantized, bits, undefined) is
// refused on both ends.
bool supportedDtype(c10::ScalarType t);

// ---- sending -----------------------------------------------------------------

// A run of bytes that travels: a strided tensor's span. `owner` keeps it
// alive. Frames are dropped on the I/O thread, under the connection's lock:
// an owner whose memory Python also holds is let go of on the rpc-drop thread
// instead (common/python_held.h).
struct Buffer {
  at::Tensor owner;
  const char* data{nullptr};
  uint64_t bytes{0};

  Buffer() = default;
  Buffer(at::Tensor owner, const char* data, uint64_t bytes) : owner(std::move(owner)), data(data), bytes(bytes) {}
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  Buffer(const Buffer&) = default;
  Buffer& operator=(const Buffer&) = default;
  ~Buffer() { common::release(owner); }
};

// Appends the descriptors of a message's tensors to `desc`, and their
// buffers to `buffers` (written into the frame) or to `lent` (those of
// lendFrom bytes or more, when lendFrom > 0). Throws c10::Error, naming the
// tensor, for one that cannot travel (not on the CPU, an unsupported dtype or
// layout, an invalid sparse tensor).
void encodeTensors(const std::vector<at::Tensor>& tensors, uint64_t lendFrom, std::string& desc,
                   std::vector<Buffer>& buffers, std::vector<Buffer>& lent);

// ---- receiving -----------------------------------------------------------------

// A buffer as its descriptor declared it.
struct BufferSpec {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty: contiguous
  c10::ScalarType dtype;
  uint64_t nbytes;
  uint64_t address;  // lent: where the sender holds its bytes; 0: they follow in the frame
};

// How a message tensor is rebuilt: from buffers [firstBuffer, firstBuffer + numBuffers).
// kShared: a view of buffer firstBuffer (the memory that tensor #owner
// carries; numBuffers is 1 for that tensor, 0 for the others).
struct TensorSpec {
  Code code;
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;  // sparse: the tensor's shape (buffers carry their own)
  bool coalesced;
  size_t firstBuffer;
  size_t numBuffers;
  std::vector<int64_t> strides;  // kShared only, as the next two
  uint32_t owner;
  uint64_t byteOffset;  // into the memory
};

// Parses the descriptor of tensor #index from [p, end), advancing p, and
// appends its buffers' specs; `earlier` holds the specs of tensors 0..index-1
// (a kShared tensor names one of them). Every field is checked (dtypes, dims,
// sizes, strides, byte counts, flags, a shared view's bounds) before
// anything is allocated. Returns why the descriptor is malformed, or "".
std::string parseTensor(const char*& p, const char* end, size_t index, const std::vector<TensorSpec>& earlier,
                        TensorSpec& tensor, std::vector<BufferSpec>& buffers);

// An uninitialized contiguous tensor that receives `spec`'s bytes.
at::Tensor allocate(const BufferSpec& spec);

// Message tensor #index from its received buffers. Returns why the
// components break their layout's invariants (a malformed frame), or "".
std::string assemble(const TensorSpec& tensor, const std::vector<BufferSpec>& specs,
                     const std::vector<at::Tensor>& buffers, size_t index, at::Tensor& out);

// What a tensor takes on the wire (its elements; a sparse tensor's
// components), as the limits count it.
uint64_t wireBytes(const at::Tensor& t);

}  // namespace torchrpc::message::layout
