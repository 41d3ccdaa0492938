#pragma once

// Memory for large received tensors, kept for reuse after the tensor is freed.
//
// A received tensor is read straight from the socket into its own memory.
// Fresh memory costs page faults, which are most of the time of a large
// receive, and on some VMs faulting in freshly allocated huge pages is
// erratic (64 MB: 9 ms or 160 ms at random; the host has taken the free
// pages back). Tensors of at least kMinBytes therefore take their memory from
// a cache of blocks that earlier received tensors left behind: a job that
// sends the same shapes again and again (activations, gradients) faults
// them in once. New blocks are 2 MB-aligned and ask for transparent huge
// pages; the reader faults them in (populate) one window ahead of the bytes
// that arrive, so a peer that only declares a size costs no memory.
//
// The cache holds at most TORCHRPC_RECEIVE_CACHE_MB (default 256) of free
// blocks; a block that does not fit is returned to the system. A tensor's
// storage stays resizable (resizing moves it to torch's allocator).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torchrpc::message::receive_buffers {

constexpr uint64_t kMinBytes = 4u << 20;

// An uninitialized contiguous CPU tensor of `sizes` and `dtype` whose
// `nbytes` (>= kMinBytes) bytes come from the cache.
at::Tensor empty(const std::vector<int64_t>& sizes, c10::ScalarType dtype, uint64_t nbytes);

// Faults in [begin, begin + bytes) of such a tensor (writable, zero or old
// contents), in one call rather than a fault per page.
void populate(char* begin, uint64_t bytes);

// Bytes of free blocks now cached (for tests and debugging).
uint64_t cachedBytes();

}  // namespace torchrpc::message::receive_buffers
