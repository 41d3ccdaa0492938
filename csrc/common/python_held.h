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
// deadlock). Nor must the timer threads (every peer's grace period waits on
// one). Such references are dropped by the "rpc-drop" thread instead,
// started the first time one is. tests/multiprocess/test_python_held.py
// checks, with a probe on libpython, that those threads never ask for the GIL.

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
// The same for a future's value (false while it is not completed, or failed).
bool pythonHeld(const c10::ivalue::Future& future);

// Drops `held` on the rpc-drop thread (what it references is freed there).
// Any thread; never blocks on the GIL, never throws.
void dropAside(std::shared_ptr<void> held) noexcept;

// Lets go of `t`: here, or on the rpc-drop thread when pythonHeld(t).
void release(at::Tensor& t) noexcept;
// Lets go of a completed future, from a thread that must not take the GIL:
// here only when no one else holds it and its value holds nothing of
// Python's; otherwise on the rpc-drop thread, which gathers such drops for
// up to half a millisecond.
void release(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept;

// A future that completes as `future` does, on torch's inter-op pool, where an
// interpreter suspended on it resumes anyway. For a future handed to code
// that adds callbacks (Python's `then`, a suspended interpreter), when an I/O
// or timer thread completes `future`: callbacks run where a future completes,
// and the last reference to what they hold, values Python wrapped included,
// could go there.
c10::intrusive_ptr<c10::ivalue::Future> completedOnInterOpPool(const c10::intrusive_ptr<c10::ivalue::Future>& future);

}  // namespace torchrpc::common
