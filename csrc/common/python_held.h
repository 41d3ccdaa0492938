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
// started the first time one is. tests/multiprocess/test_python_held.py
// checks, with a probe on libpython, that I/O threads never ask for the GIL.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>

namespace c10 {
struct IValue;
namespace ivalue {
struct Future;
}  // namespace ivalue
}  // namespace c10

namespace torchrpc::common {

// Whether dropping the last C++ reference to `t` may take the GIL.
bool pythonHeld(const at::Tensor& t);
// The same for a value: a Python object, or a tensor as above, inside.
bool pythonHeld(const c10::IValue& value);

// Drops `held` on the rpc-drop thread (what it references is freed there).
// Any thread; never blocks on the GIL, never throws.
void dropAside(std::shared_ptr<void> held) noexcept;

// Lets go of `t`: here, or on the rpc-drop thread when pythonHeld(t).
void release(at::Tensor& t) noexcept;
// Lets go of a completed future: on the rpc-drop thread when this is its last
// reference and its value is pythonHeld (Python took the value, then let go).
void release(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept;
// Lets go of a completed future that a thread which must not take the GIL
// may still hold: on the rpc-drop thread when that one's reference would
// then be the last and the value is pythonHeld (the GIL-free side of a race
// that release() above cannot close alone).
void releaseShared(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept;

}  // namespace torchrpc::common
