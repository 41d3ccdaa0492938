#include "message/tensor_layout.h"

#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <cstring>
#include <limits>
#include <ostream>
#include <unordered_map>

#include "message/receive_buffers.h"
#include "message/sparse_layout.h"

namespace torchrpc::message::layout {

namespace {

#pragma pack(push, 1)
struct Header {
  uint8_t dtype;
  uint8_t ndim;
  uint16_t flags;
  uint8_t code;
  uint8_t reserved[3];
};
#pragma pack(pop)
static_assert(sizeof(Header) == 8, "a descriptor header is 8 bytes on the wire");

template <typename T>
void appendPod(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

bool sparse(Code code) { return code != Code::kStrided && code != Code::kShared; }
size_t numComponents(Code code) { return code == Code::kSparseCoo ? 2 : 3; }

// What an error calls a tensor or one of its components: made into words
// only when there is an error, so a message's tensors cost no strings.
struct Name {
  size_t index;
  const char* component;  // null: the tensor itself
  std::string str() const {
    return (component ? std::string(component) + " of " : std::string()) + "tensor #" + std::to_string(index);
  }
};

std::ostream& operator<<(std::ostream& out, const Name& n) { return out << n.str(); }

// a * b, or false when it exceeds `cap`.
bool mulWithin(uint64_t a, uint64_t b, uint64_t cap, uint64_t& out) {
  if (__builtin_mul_overflow(a, b, &out)) return false;
  return out <= cap;
}

// Elements between a non-empty strided tensor's first and last element, inclusive.
uint64_t spanElements(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  uint64_t span = 1;
  for (size_t i = 0; i < sizes.size(); ++i) span += static_cast<uint64_t>(sizes[i] - 1) * strides[i];
  return span;
}

void appendHeader(std::string& desc, c10::ScalarType dtype, int64_t ndim, uint16_t flags, Code code) {
  Header h{};
  h.dtype = static_cast<uint8_t>(dtype);
  h.ndim = static_cast<uint8_t>(ndim);
  h.flags = flags;
  h.code = static_cast<uint8_t>(code);
  appendPod(desc, h);
}

// Throws c10::Error, naming it, for a strided tensor that cannot travel.
void checkStrided(const at::Tensor& in, Name what) {
  TORCH_CHECK(supportedDtype(in.scalar_type()), "torchrpc cannot send tensors of dtype ", in.scalar_type(), " (",
              what, ")");
  TORCH_CHECK(static_cast<uint32_t>(in.dim()) <= kMaxTensorDims, what, " has ", in.dim(),
              " dimensions; at most ", kMaxTensorDims, " are supported");
  TORCH_CHECK(in.nbytes() <= kMaxTensorBytes, what, " has ", in.nbytes(), " bytes of elements; at most ",
              kMaxTensorBytes, " can travel");
}

void encodeStrided(const at::Tensor& in, Name what, uint64_t lendFrom, std::string& desc,
                   std::vector<Buffer>& buffers, std::vector<Buffer>& lent) {
  checkStrided(in, what);
  // A new TensorImpl, held until written: the caller's own may carry its
  // Python object, and dropping its last reference on the I/O thread would
  // take the GIL there (a hang while Python holds it). No autograd history either.
  at::Tensor t = in.detach();
  bool withStrides = false;
  uint64_t bytes = t.nbytes();
  if (!t.is_contiguous()) {  // non-empty: an empty tensor counts as contiguous
    const uint64_t span = spanElements(t.sizes(), t.strides()) * t.element_size();
    if (span <= bytes || span <= kSmallSpanBytes) {
      withStrides = true;
      bytes = span;
    } else {
      t = t.contiguous();
    }
  }
  const bool lend = lendFrom > 0 && bytes >= lendFrom;
  appendHeader(desc, t.scalar_type(), t.dim(), (lend ? kLent : 0) | (withStrides ? kStrides : 0), Code::kStrided);
  for (int64_t s : t.sizes()) appendPod(desc, s);
  if (withStrides) {
    for (int64_t s : t.strides()) appendPod(desc, s);
  }
  appendPod(desc, bytes);
  const char* data = static_cast<const char*>(t.data_ptr());
  if (lend) appendPod(desc, reinterpret_cast<uint64_t>(data));
  (lend ? lent : buffers).push_back(Buffer{std::move(t), data, bytes});
}

// Tensors that share memory (see tensor_layout.h): each strided, non-empty
// CPU tensor's index in `sharers` is its group's first tensor (the one that
// carries the memory), or -1 when no other tensor shares its storage; empty
// for fewer than two tensors (most messages), which share nothing.
std::vector<int64_t> sharers(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() < 2) return {};
  std::vector<int64_t> first(tensors.size(), -1);
  std::unordered_map<const c10::StorageImpl*, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.layout() != c10::kStrided || !t.device().is_cpu() || t.numel() == 0 || !t.has_storage()) {
      continue;
    }
    auto [it, fresh] = seen.emplace(t.storage().unsafeGetStorageImpl(), i);
    if (!fresh) first[it->second] = first[i] = static_cast<int64_t>(it->second);
  }
  return first;
}

// The largest element (complex128): shared memory starts at a multiple of it.
constexpr uint64_t kMaxElementBytes = 16;

// [first, last) bytes of its storage that a non-empty strided tensor uses.
std::pair<uint64_t, uint64_t> bytesUsed(const at::Tensor& t) {
  const uint64_t first = static_cast<uint64_t>(t.storage_offset()) * t.element_size();
  return {first, first + spanElements(t.sizes(), t.strides()) * t.element_size()};
}

// Message tensor #index as a view of the memory its group shares, which
// tensor #owner carries: the bytes [lo, hi) of their storage.
void encodeShared(const at::Tensor& t, size_t index, size_t owner, uint64_t lo, uint64_t hi, uint64_t lendFrom,
                  std::string& desc, std::vector<Buffer>& buffers, std::vector<Buffer>& lent) {
  const Name what{index, nullptr};
  checkStrided(t, what);
  appendHeader(desc, t.scalar_type(), t.dim(), 0, Code::kShared);
  appendPod(desc, static_cast<uint32_t>(owner));
  appendPod(desc, uint32_t{0});
  appendPod(desc, bytesUsed(t).first - lo);
  for (int64_t s : t.sizes()) appendPod(desc, s);
  for (int64_t s : t.strides()) appendPod(desc, s);
  if (index != owner) return;
  const std::vector<int64_t> size{static_cast<int64_t>(hi - lo)}, stride{1};
  const at::Tensor memory =
      at::empty({0}, at::TensorOptions().dtype(c10::kByte)).set_(t.storage(), static_cast<int64_t>(lo), size, stride);
  encodeStrided(memory, Name{index, "memory"}, lendFrom, desc, buffers, lent);
}

// ---- parsing ---------------------------------------------------------------

class Cursor {
 public:
  Cursor(const char*& p, const char* end) : p_(p), end_(end) {}
  bool read(void* out, size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    std::memcpy(out, p_, n);
    p_ += n;
    return true;
  }

 private:
  const char*& p_;
  const char* end_;
};

std::string readHeader(Cursor& c, Name what, Header& h) {
  if (!c.read(&h, sizeof(h))) return "truncated descriptor of " + what.str();
  if (h.reserved[0] != 0 || h.reserved[1] != 0 || h.reserved[2] != 0) return what.str() + " has nonzero reserved bytes";
  if (h.dtype >= static_cast<uint8_t>(c10::ScalarType::NumOptions) ||
      !supportedDtype(static_cast<c10::ScalarType>(h.dtype))) {
    return what.str() + " has unsupported dtype code " + std::to_string(h.dtype);
  }
  if (h.ndim > kMaxTensorDims) {
    return what.str() + " claims " + std::to_string(h.ndim) + " dimensions; the limit is " + std::to_string(kMaxTensorDims);
  }
  if (h.code > static_cast<uint8_t>(Code::kShared)) return what.str() + " has unknown layout code " + std::to_string(h.code);
  return "";
}

// n sizes or strides ("size", "stride"), none negative.
std::string readSizes(Cursor& c, Name what, size_t n, const char* name, std::vector<int64_t>& out) {
  out.resize(n);
  if (!c.read(out.data(), 8 * n)) return "truncated " + std::string(name) + "s of " + what.str();
  for (int64_t s : out) {
    if (s < 0) return what.str() + " has a negative " + name + " " + std::to_string(s);
  }
  return "";
}

// The bytes from the first to the last element of a non-empty strided tensor
// (sizes within the 1 TB limit), or why its strides span more than that.
std::string checkSpan(Name what, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, uint64_t elem,
                      uint64_t& bytes) {
  const uint64_t cap = kMaxTensorBytes / elem;
  uint64_t span = 1;  // elements from the first to the last, inclusive
  for (size_t i = 0; i < sizes.size(); ++i) {
    uint64_t reach = 0;
    if (!mulWithin(static_cast<uint64_t>(sizes[i] - 1), static_cast<uint64_t>(strides[i]), cap, reach) ||
        (span += reach) > cap) {
      return what.str() + "'s strides span more than the 1 TB limit";
    }
  }
  bytes = span * elem;
  return "";
}

// The rest of a strided buffer's descriptor, after its header.
std::string readBuffer(Cursor& c, const Header& h, Name what, BufferSpec& spec) {
  if (h.code != static_cast<uint8_t>(Code::kStrided)) {
    return what.str() + " has layout code " + std::to_string(h.code) + " where a strided tensor belongs";
  }
  if ((h.flags & ~(kLent | kStrides)) != 0) return what.str() + " has unknown flags 0x" + c10::str(std::hex, h.flags);
  spec.dtype = static_cast<c10::ScalarType>(h.dtype);
  const uint64_t elem = c10::elementSize(spec.dtype);
  if (std::string e = readSizes(c, what, h.ndim, "size", spec.sizes); !e.empty()) return e;
  uint64_t numel = 1;
  for (int64_t s : spec.sizes) {
    if (!mulWithin(numel, static_cast<uint64_t>(s), kMaxTensorBytes / elem, numel)) {
      return what.str() + " is larger than the 1 TB limit";
    }
  }
  uint64_t expect = numel * elem;
  if (h.flags & kStrides) {
    if (std::string e = readSizes(c, what, h.ndim, "stride", spec.strides); !e.empty()) return e;
    if (numel == 0) return what.str() + " is empty but has strides";
    if (std::string e = checkSpan(what, spec.sizes, spec.strides, elem, expect); !e.empty()) return e;
  }
  if (!c.read(&spec.nbytes, 8)) return "truncated byte count of " + what.str();
  if (spec.nbytes != expect) {
    return what.str() + " claims " + std::to_string(spec.nbytes) + " bytes but its sizes, strides and dtype " +
           std::string(c10::toString(spec.dtype)) + " need " + std::to_string(expect);
  }
  spec.address = 0;
  if (h.flags & kLent) {
    if (!c.read(&spec.address, 8)) return "truncated address of lent " + what.str();
    if (spec.address == 0 || spec.nbytes == 0) {
      return "lent " + what.str() + " has no memory to copy (address " + std::to_string(spec.address) + ", " +
             std::to_string(spec.nbytes) + " bytes)";
    }
  }
  return "";
}

// The rest of a kShared tensor's descriptor, after its header: which tensor
// carries the memory, the view's offset, sizes and strides, and (the carrier)
// the memory's byte buffer. The view must lie inside that memory.
std::string readShared(Cursor& c, const Header& h, size_t index, const std::vector<TensorSpec>& earlier,
                       TensorSpec& tensor, std::vector<BufferSpec>& buffers) {
  const Name what{index, nullptr};
  if (h.flags != 0) return what.str() + " has unknown flags 0x" + c10::str(std::hex, h.flags);
  uint32_t reserved = 0;
  if (!c.read(&tensor.owner, 4) || !c.read(&reserved, 4) || !c.read(&tensor.byteOffset, 8)) {
    return "truncated descriptor of " + what.str();
  }
  if (reserved != 0) return what.str() + " has nonzero reserved bytes";
  if (std::string e = readSizes(c, what, h.ndim, "size", tensor.sizes); !e.empty()) return e;
  if (std::string e = readSizes(c, what, h.ndim, "stride", tensor.strides); !e.empty()) return e;
  const uint64_t elem = c10::elementSize(tensor.dtype);
  uint64_t numel = 1;
  for (int64_t s : tensor.sizes) {
    if (!mulWithin(numel, static_cast<uint64_t>(s), kMaxTensorBytes / elem, numel)) {
      return what.str() + " is larger than the 1 TB limit";
    }
  }
  uint64_t used = 0;
  if (numel > 0) {
    if (std::string e = checkSpan(what, tensor.sizes, tensor.strides, elem, used); !e.empty()) return e;
  }
  if (tensor.byteOffset % elem != 0) {
    return what.str() + " starts at byte " + std::to_string(tensor.byteOffset) + ", not a multiple of its " +
           std::to_string(elem) + "-byte elements";
  }
  if (tensor.owner == index) {  // it carries the memory
    const Name memory{index, "memory"};
    Header mh;
    if (std::string e = readHeader(c, memory, mh); !e.empty()) return e;
    tensor.firstBuffer = buffers.size();
    tensor.numBuffers = 1;
    buffers.emplace_back();
    if (std::string e = readBuffer(c, mh, memory, buffers.back()); !e.empty()) return e;
    const BufferSpec& b = buffers.back();
    if (b.dtype != c10::kByte || b.sizes.size() != 1 || !b.strides.empty()) return memory.str() + " is not a byte buffer";
  } else {
    if (tensor.owner > index) {
      return what.str() + " shares the memory of tensor #" + std::to_string(tensor.owner) + ", which comes after it";
    }
    const TensorSpec& owner = earlier[tensor.owner];
    if (owner.code != Code::kShared || owner.owner != tensor.owner) {
      return what.str() + " shares the memory of tensor #" + std::to_string(tensor.owner) + ", which carries none";
    }
    tensor.firstBuffer = owner.firstBuffer;
    tensor.numBuffers = 0;
  }
  const uint64_t memoryBytes = buffers[tensor.firstBuffer].nbytes;
  if (numel > 0 && (tensor.byteOffset > memoryBytes || used > memoryBytes - tensor.byteOffset)) {
    return what.str() + " uses bytes " + std::to_string(tensor.byteOffset) + " to " +
           std::to_string(tensor.byteOffset + used) + " of memory that has " + std::to_string(memoryBytes);
  }
  return "";
}

// A received strided buffer as the tensor its descriptor declared.
at::Tensor stridedTensor(const BufferSpec& spec, const at::Tensor& buffer) {
  if (spec.strides.empty()) return buffer;
  return at::empty({0}, buffer.options()).set_(buffer.storage(), 0, spec.sizes, spec.strides);
}

}  // namespace

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

namespace {

void encodeTensor(const at::Tensor& t, size_t index, uint64_t lendFrom, std::string& desc,
                  std::vector<Buffer>& buffers, std::vector<Buffer>& lent) {
  const Name what{index, nullptr};
  if (t.layout() == c10::kStrided) return encodeStrided(t, what, lendFrom, desc, buffers, lent);
  Code code;
  std::vector<at::Tensor> parts;
  at::Tensor s = t.detach();
  TORCH_CHECK(components(s, code, parts), "torchrpc cannot send ", what, ": its layout ", t.layout(),
              " is neither strided nor sparse (COO, CSR, CSC, BSR, BSC)");
  TORCH_CHECK(static_cast<uint32_t>(s.dim()) <= kMaxTensorDims, what, " has ", s.dim(), " dimensions; at most ",
              kMaxTensorDims, " are supported");
  const bool coalesced = code == Code::kSparseCoo && s.is_coalesced();
  try {
    validateSparse(code, s.sizes(), parts, coalesced);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "torchrpc cannot send ", what, ", an invalid ", layoutName(code), " tensor: ",
                e.what_without_backtrace());
  }
  appendHeader(desc, s.scalar_type(), s.dim(), coalesced ? kCoalesced : 0, code);
  for (int64_t v : s.sizes()) appendPod(desc, v);
  for (size_t k = 0; k < parts.size(); ++k) {
    encodeStrided(parts[k], Name{index, componentName(code, k)}, lendFrom, desc, buffers, lent);
  }
}

}  // namespace

void encodeTensors(const std::vector<at::Tensor>& tensors, uint64_t lendFrom, std::string& desc,
                   std::vector<Buffer>& buffers, std::vector<Buffer>& lent) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Name what{i, nullptr};
    TORCH_CHECK(tensors[i].defined(), what, " of the message is undefined");
    TORCH_CHECK(tensors[i].device().is_cpu(), "torchrpc sends CPU tensors only; ", what, " is on ",
                tensors[i].device(), ". Move it with .cpu() before it is sent.");
  }
  const std::vector<int64_t> first = sharers(tensors);
  // Each group's memory: the bytes [lo, hi) of their storage that any of them uses.
  struct Memory {
    uint64_t lo, hi, elementBytes;
  };
  std::unordered_map<int64_t, Memory> memory;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] < 0) continue;
    auto [lo, hi] = bytesUsed(tensors[i]);
    lo -= lo % kMaxElementBytes;  // every view's offset into it stays a multiple of its elements
    auto [it, fresh] = memory.emplace(first[i], Memory{lo, hi, 0});
    it->second = {std::min(it->second.lo, lo), std::max(it->second.hi, hi), it->second.elementBytes + tensors[i].nbytes()};
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Memory* m = first.empty() || first[i] < 0 ? nullptr : &memory.at(first[i]);
    // Views far apart in a large storage (slices of a big tensor) travel on
    // their own instead, so that only about their elements travel.
    if (m == nullptr || (m->hi - m->lo > kSmallSpanBytes && m->hi - m->lo > 2 * m->elementBytes)) {
      encodeTensor(tensors[i], i, lendFrom, desc, buffers, lent);
    } else {
      encodeShared(tensors[i], i, static_cast<size_t>(first[i]), m->lo, m->hi, lendFrom, desc, buffers, lent);
    }
  }
}

std::string parseTensor(const char*& p, const char* end, size_t index, const std::vector<TensorSpec>& earlier,
                        TensorSpec& tensor, std::vector<BufferSpec>& buffers) {
  Cursor c(p, end);
  const Name what{index, nullptr};
  Header h;
  if (std::string e = readHeader(c, what, h); !e.empty()) return e;
  tensor.code = static_cast<Code>(h.code);
  tensor.dtype = static_cast<c10::ScalarType>(h.dtype);
  tensor.firstBuffer = buffers.size();
  tensor.coalesced = false;
  if (tensor.code == Code::kShared) return readShared(c, h, index, earlier, tensor, buffers);
  if (!sparse(tensor.code)) {
    tensor.numBuffers = 1;
    buffers.emplace_back();
    return readBuffer(c, h, what, buffers.back());
  }
  const uint16_t allowed = tensor.code == Code::kSparseCoo ? kCoalesced : 0;
  if ((h.flags & ~allowed) != 0) return what.str() + " has unknown flags 0x" + c10::str(std::hex, h.flags);
  tensor.coalesced = (h.flags & kCoalesced) != 0;
  if (std::string e = readSizes(c, what, h.ndim, "size", tensor.sizes); !e.empty()) return e;
  uint64_t numel = 1;
  for (int64_t s : tensor.sizes) {
    if (!mulWithin(numel, static_cast<uint64_t>(s), std::numeric_limits<int64_t>::max(), numel)) {
      return what.str() + " has more elements than an int64 counts";
    }
  }
  tensor.numBuffers = numComponents(tensor.code);
  for (size_t k = 0; k < tensor.numBuffers; ++k) {
    const Name part{index, componentName(tensor.code, k)};
    Header ph;
    if (std::string e = readHeader(c, part, ph); !e.empty()) return e;
    buffers.emplace_back();
    if (std::string e = readBuffer(c, ph, part, buffers.back()); !e.empty()) return e;
  }
  const BufferSpec* parts = &buffers[tensor.firstBuffer];
  const BufferSpec& values = parts[tensor.numBuffers - 1];
  if (values.dtype != tensor.dtype) {
    return "values of " + what.str() + " are " + c10::toString(values.dtype) + "; its descriptor says " +
           c10::toString(tensor.dtype);
  }
  if (tensor.code == Code::kSparseCoo) {
    if (parts[0].dtype != c10::kLong) return "indices of " + what.str() + " are not int64";
  } else if (parts[0].dtype != parts[1].dtype || (parts[0].dtype != c10::kInt && parts[0].dtype != c10::kLong)) {
    return "indices of " + what.str() + " are not both int32 or both int64";
  }
  return "";
}

at::Tensor allocate(const BufferSpec& spec) {
  std::vector<int64_t> sizes = spec.sizes;
  if (!spec.strides.empty()) sizes = {static_cast<int64_t>(spec.nbytes / c10::elementSize(spec.dtype))};
  if (spec.nbytes >= receive_buffers::kMinBytes) return receive_buffers::empty(sizes, spec.dtype, spec.nbytes);
  return at::empty(sizes, at::TensorOptions().dtype(spec.dtype));
}

std::string assemble(const TensorSpec& tensor, const std::vector<BufferSpec>& specs,
                     const std::vector<at::Tensor>& buffers, size_t index, at::Tensor& out) {
  try {
    if (tensor.code == Code::kShared) {  // parseTensor checked its bounds: set_ grows no storage
      const int64_t offset = static_cast<int64_t>(tensor.byteOffset / c10::elementSize(tensor.dtype));
      out = at::empty({0}, at::TensorOptions().dtype(tensor.dtype))
                .set_(buffers[tensor.firstBuffer].storage(), offset, tensor.sizes, tensor.strides);
      return "";
    }
    if (!sparse(tensor.code)) {
      out = stridedTensor(specs[tensor.firstBuffer], buffers[tensor.firstBuffer]);
      return "";
    }
    std::vector<at::Tensor> parts;
    for (size_t k = tensor.firstBuffer; k < tensor.firstBuffer + tensor.numBuffers; ++k) {
      parts.push_back(stridedTensor(specs[k], buffers[k]));
    }
    validateSparse(tensor.code, tensor.sizes, parts, tensor.coalesced);
    const auto options = parts.back().options().layout(torchLayout(tensor.code));
    if (tensor.code == Code::kSparseCoo) {
      out = at::_sparse_coo_tensor_unsafe(parts[0], parts[1], tensor.sizes, options, tensor.coalesced);
    } else {
      out = at::_sparse_compressed_tensor_unsafe(parts[0], parts[1], parts[2], tensor.sizes, options);
    }
    return "";
  } catch (const c10::Error& e) {
    return "tensor #" + std::to_string(index) + " is not a valid " + layoutName(tensor.code) +
           " tensor: " + e.what_without_backtrace();
  } catch (const std::exception& e) {
    return "tensor #" + std::to_string(index) + " cannot be rebuilt: " + e.what();
  }
}

uint64_t wireBytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  if (t.layout() == c10::kStrided) return t.nbytes();
  Code code;
  std::vector<at::Tensor> parts;
  if (!components(t, code, parts)) return 0;  // the wire refuses it, clearly
  uint64_t bytes = 0;
  for (const auto& p : parts) bytes += p.nbytes();
  return bytes;
}

}  // namespace torchrpc::message::layout
