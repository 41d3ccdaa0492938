#pragma once

// Same-host copy: large tensors lent between two processes of one host.
//
// Through a socket a tensor is copied twice (into the kernel, out of it);
// between processes of one host the receiver can copy it once, straight from
// the sender's memory, with process_vm_readv (cross-memory attach, as
// TensorPipe's CMA channel does).
//
// The protocol, on each Unix-socket connection (transport/connection.cpp):
// 1. Both ends send LEND_OFFER: their pid, the address of a random secret in
//    their memory, and the secret.
// 2. A receiver reads the secret at that address from that pid. Only if the
//    bytes match (the pid is the peer, not a namesake in another pid
//    namespace, and the kernel lets this process read it) it answers
//    LEND_ACCEPT. Without it, everything travels through the socket.
// 3. A sender that was accepted lends tensors of kMinBytes or more: the frame
//    carries their address instead of their bytes (message/wire.h), and the
//    sender keeps them alive.
// 4. The receiver copies them as it parses the frame, then sends
//    LEND_RELEASE; the sender drops the oldest lent frames it names.
//
// As with the socket, a tensor must not be modified in place until the call
// that sends it has completed. TORCHRPC_SAME_HOST_COPY=0 turns lending off.

#include <cstdint>
#include <string>

#include "common/error.h"

namespace torchrpc::transport::same_host {

// Tensors of at least this many bytes are lent; below it the release
// message costs about what the second copy saves (benchmarks/HISTORY.md).
constexpr uint64_t kMinBytes = 64u << 10;

// False when TORCHRPC_SAME_HOST_COPY=0.
bool enabled();

// The payload of this process's LEND_OFFER.
std::string offer();

// Checks a peer's LEND_OFFER by reading its secret from its memory. Returns
// the peer's pid, or why not.
common::Fallible<int> verify(const std::string& offerPayload);

// Copies nbytes at `address` in process `pid` to dst. Returns the error (the
// peer exited, the address is not readable), if any.
common::Error copy(int pid, uint64_t address, void* dst, uint64_t nbytes);

// Bytes this process copied from its peers' memory (for tests and debugging).
uint64_t copiedBytes();

}  // namespace torchrpc::transport::same_host
