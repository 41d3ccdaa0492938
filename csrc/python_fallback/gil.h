#pragma once

// Gil: takes the GIL on a thread that torchrpc owns (pool, callback runner),
// keeping that thread's Python thread state for the thread's life.
//
// pybind11::gil_scoped_acquire on a thread without a Python thread state
// makes one and deletes it again when it releases the GIL. Python 3.11
// frees the state's frame stack with munmap, and on a VM the TLB shootdown
// that follows interrupts every core: a Python call that took the GIL twice
// (run the function, drop a tensor's Python object) paid it twice. With the
// state kept, every later acquire on the thread (ours, and torch's own when
// it drops a tensor's Python object) only takes the lock.
//
// A thread that exits leaves its state to reapThreadStates(), which deletes
// it under the GIL (a thread at exit cannot wait for the GIL: the thread
// that joins it may hold it).

#include <pybind11/pybind11.h>

#include <cstddef>

namespace torchrpc::python_fallback {

// Gives this thread a Python thread state that lives as long as the thread
// (nothing to do on a thread that has one: Python's own threads).
void keepThreadState();

// Deletes the thread states of torchrpc threads that have exited. Needs the GIL.
void reapThreadStates();

// Thread states kept for torchrpc threads and not deleted yet (for tests).
size_t keptThreadStates();

namespace detail {
struct ThreadStateKept {
  ThreadStateKept() { keepThreadState(); }
};
}  // namespace detail

// An outermost Gil (the thread did not hold the GIL) starts and ends with no
// Python error set: a kept thread state would otherwise carry an error that
// an earlier scope left behind into the next Python call on that thread,
// which then fails with SystemError (seen: the exception of a Python
// autograd function that failed in a distributed backward pass stayed set). A
// thread state made per acquire used to drop such errors with itself.
class Gil : private detail::ThreadStateKept {
 public:
  Gil();
  ~Gil();

 private:
  const bool outermost_;
  pybind11::gil_scoped_acquire acquire_;
};

}  // namespace torchrpc::python_fallback
