#pragma once

// Tensors that Python holds a handle to, and dropping them where the GIL
// cannot be waited for.
//
// torch keeps a tensor's Python object (and its storage's: made by
// `untyped_storage()`, `share_memory_()`, a DataLoader's shared memory) alive
// while C++ holds references, and lets go of it when the last C++ reference
// goes, which takes the GIL. The I/O thread must never do that: it would stop
// reading every socket while Python holds the GIL, and a Python thread that
// sends meanwhile would wait for the connection lock the I/O thread holds (a
// deadlock). Such references are dropped by the "rpc-drop" thread instead,
// started the first time one is.

#include <ATen/core/Tensor.h>

#include <memory>

namespace torchrpc::common {

// Whether dropping the last C++ reference to `t` may take the GIL.
bool pythonHeld(const at::Tensor& t);

// Drops `held` on the rpc-drop thread (what it references is freed there).
// Any thread; never blocks on the GIL, never throws.
void dropAside(std::shared_ptr<void> held) noexcept;

// Lets go of `t`: here, or on the rpc-drop thread when pythonHeld(t).
void release(at::Tensor& t) noexcept;

}  // namespace torchrpc::common
