#pragma once

// What a call to this worker itself carries. Such a call skips the
// transport, not its copies: the callee works on its own arguments and the
// caller gets a result of its own, as from a peer (upstream's agent sends it
// through a pipe to itself). The copies also keep pool threads from dropping
// the last C++ reference to a caller's Python tensor, which takes the GIL.

#include "message/message.h"

namespace torchrpc::agent {

// `m` copied as the wire copies it (message::loopback), except that a tensor
// that requires grad (with grad mode on) becomes a clone, which passes
// gradients back: torchrpc records no send or receive for a local call
// (autograd/recorder.cpp), so its graph stays local. Throws c10::Error on
// tensors that cannot travel.
message::Message copyForSelf(message::Message&& m);

}  // namespace torchrpc::agent
