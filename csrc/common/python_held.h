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

#include <functional>
#include <memory>
#include <optional>

namespace c10 {
struct IValue;
namespace ivalue {
struct Future;
}  // namespace ivalue
}  // namespace c10

namespace torchrpc::common {

// Whether dropping the last C++ reference to `t` may take the GIL.
bool pythonHeld(const at::Tensor& t);
// The same for a value: a Python object, or a tensor as above, inside; and
// for a future's value (false while it is not completed, or failed).
bool pythonHeld(const c10::IValue& value);
bool pythonHeld(const c10::ivalue::Future& future);

// Whether this reference may be dropped by a thread that must not take the
// GIL, and stays so until it is: nothing in it is pythonHeld, and no one
// else holds a part of it (a tensor, its storage, a container), since
// another holder could give that part a Python object and let go of it
// first, between a look here and the drop. For a future: its value (true
// while it is not completed, or failed).
bool dropsWithoutGil(const at::Tensor& t);
bool dropsWithoutGil(const c10::IValue& value);
bool dropsWithoutGil(const c10::ivalue::Future& future);

// How soon the rpc-drop thread drops what it is handed. kPrompt: this is
// likely the last reference, and frees memory or Python objects: the thread
// wakes (and gathers for half a millisecond). kLazy: someone else still
// holds it: dropped with the next prompt batch, or within 5 ms, without a
// wake-up of its own (every call's future would wake it otherwise).
enum class Drop { kLazy, kPrompt };

// The rule of release() for a holder of a future whose value is `value` (a
// future, an RRef owner), held by this thread `alone` or not: nullopt when
// this thread may drop it itself (alone, and the value dropsWithoutGil);
// otherwise how soon rpc-drop should, kPrompt where this is likely the last
// reference to a Python object.
std::optional<Drop> handOver(bool alone, const c10::ivalue::Future& value);

// Drops `held` on the rpc-drop thread (what it references is freed there).
// Any thread; never blocks on the GIL, never throws.
void dropAside(std::shared_ptr<void> held, Drop urgency = Drop::kPrompt) noexcept;

// How to tell whether this thread holds the GIL (the Python module installs
// PyGILState_Check; without Python, no thread does).
void setGilCheck(bool (*check)());

// At Python's exit, before it finalizes (atexit; call it without the GIL):
// from now on the rpc-drop thread keeps what it is handed instead of
// dropping it. Python ends a thread that asks for the GIL while it
// finalizes, unwinding it through a destructor, which aborts the process
// ("terminate called without an active exception"). Waits, at most
// `seconds`, for a batch being dropped; false if it is still going.
bool stopDropping(double seconds);

// Waits, at most `seconds`, until the rpc-drop thread has dropped all it was
// handed; false if it has not (RRefContext::waitIdle).
bool waitDropped(double seconds);

// Lets go of `t`, from a thread that must not wait for the GIL: here when it
// dropsWithoutGil, or nothing in it is pythonHeld and this thread holds the
// GIL; otherwise on the rpc-drop thread.
void release(at::Tensor& t) noexcept;
// Lets go of a completed future, from a thread that must not take the GIL:
// here only when no one else holds it and its value dropsWithoutGil;
// otherwise on the rpc-drop thread, promptly where this is likely the last
// reference to a Python object.
void release(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept;

// A future that completes as `future` does, in a task handed to `launch` (a
// pool's run). For a future handed to code that adds callbacks (Python's
// `then`, a suspended interpreter), when an I/O or timer thread completes
// `future`: callbacks run where a future completes, and the last reference
// to what they hold, values Python wrapped included, could go there.
c10::intrusive_ptr<c10::ivalue::Future> completedBy(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                                                    std::function<void(std::function<void()>)> launch);
// completedBy torch's inter-op pool, where an interpreter suspended on
// `future` resumes anyway.
c10::intrusive_ptr<c10::ivalue::Future> completedOnInterOpPool(const c10::intrusive_ptr<c10::ivalue::Future>& future);

}  // namespace torchrpc::common
