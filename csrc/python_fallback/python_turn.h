#pragma once

// PythonTurn: the pool's Python calls take turns instead of sharing the GIL.
//
// Two threads that run Python at once do not run in parallel: they pass the
// GIL back and forth, and since every torch op releases the GIL, the waiting
// thread is woken on every op (a futex wake, on a VM an interrupt to the other
// core) and goes back to sleep. A CPU-bound Python callee with 2 callers ran at
// 0.67-0.8x the rate of 1 caller; in one process, 2 threads of the same code
// ran at 0.6-0.7x one thread, and 1.0x when a lock made them take turns.
//
// So a Python call that the pool runs (a PYTHON_CALL, the Python value of a
// remote()) first waits for the one running to finish, but never longer than
// kPatience: a call that sleeps, waits on I/O or on a torch future must not
// hold up the others, and a call longer than that shares the GIL as before.
// A call that waits for a torchrpc result (rpc_sync, to_here, local_value)
// pauses its turn meanwhile, so the nested calls it waits for, which may need
// this worker's Python, start at once.

#include <chrono>

namespace torchrpc::python_fallback {

class PythonTurn {
 public:
  static constexpr std::chrono::milliseconds kPatience{5};  // Python's own switch interval
  // Turns are taken only while calls are long: the last one lasted this or
  // more. Short calls share the GIL for a few ops each, and a turn would add a
  // wake-up to every call (with turns for every call, tiny calls with 16 in
  // flight read 11-25% slower in two of three interleaved A/B runs).
  static constexpr std::chrono::milliseconds kLongTurn{1};

  enum class When { kLongCalls, kAlways };
  // Waits for the turn, at most kPatience; nests on one thread. kAlways:
  // even while calls are short, for calls that take the GIL many times each
  // (upstream's request callback, for the TORCHRPC backend: with 128 tiny
  // Python requests in flight, 3.8-5.4 voluntary switches a request without
  // turns and 1.2-2.3 with them; benchmarks/HISTORY.md).
  explicit PythonTurn(When when = When::kLongCalls);
  ~PythonTurn();

  // Gives this thread's turn up for the rest of its call, if it holds one:
  // for a call about to wait where no Pause can be put (the TORCHRPC
  // backend's nested calls wait inside upstream's code).
  static void giveUp();
  PythonTurn(const PythonTurn&) = delete;
  PythonTurn& operator=(const PythonTurn&) = delete;

  // Gives the turn up while this thread waits for something else, if it holds
  // one; takes a turn again (the same way) when the wait is over.
  class Pause {
   public:
    Pause();
    ~Pause();
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    int depth_;    // the turns it paused, 0 if it holds none
    bool always_;  // their When
  };
};

}  // namespace torchrpc::python_fallback
