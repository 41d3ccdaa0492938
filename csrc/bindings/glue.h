#pragma once

// What the binding files share (python_bindings.cpp, rref_bindings.cpp,
// autograd_bindings.cpp, torch_backend_bindings.cpp): how a call in flight, a call message and a result
// look to Python. Each file binds one concept; the module init calls them.

#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>

#include "agent/agent.h"
#include "common/python_held.h"
#include "common/spin.h"
#include "python_fallback/callback_runner.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_turn.h"
#include "python_fallback/run_python.h"

namespace torchrpc::bindings {

namespace py = pybind11;
namespace pf = torchrpc::python_fallback;
using torchrpc::agent::Agent;
using torchrpc::message::Message;

// An error as Python sees it: (kind, message, remote_type, remote_traceback);
// torchrpc.errors.from_native turns it into an exception.
py::tuple errorTuple(const std::exception_ptr& error);
// An IValue as a Python object, with TorchScript RRef objects (also inside
// tuples, lists and dicts) as torchrpc.RRef. Needs the GIL.
py::object pyValue(const c10::IValue& value);
// (True, value) or (False, error tuple) of a completed future. Needs the GIL.
py::tuple outcome(const c10::ivalue::Future& future);

// On Python's main thread, a function that runs Python's signal handlers
// (taking the GIL) and throws py::error_already_set if one raised (Ctrl-C),
// for waits to call now and then; elsewhere none. Needs the GIL.
std::function<void()> signalHandlerRunner();
// Returns once the torch.futures.Future `future` is done; on Python's main
// thread its wait wakes every 100 ms to run signal handlers (so Ctrl-C, or a
// test's timeout, ends a wait that no completion will end), as Call::wait.
void waitForFuture(const py::object& future);

// A call in flight, as Python sees it.
struct Call {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  // Who settles an rpc_async future (made by addDoneCallback: rpc_sync's
  // calls never need it). `claimed`: a thread that waits for it
  // (claimAndWait) or, when the call completes first, the callback runner.
  // `settled`: the one completion of the Python future, by the first of the
  // waiting thread, the runner's Python callback and its native completion.
  // `callbacks`: whether the Python future has Python callbacks (Python
  // adds them through callbacksComing()). Without, the runner completes it
  // without the GIL; with, under the GIL, so that callbacks added while it
  // completes run in the order they were added, as before.
  enum Callbacks : int { kNone, kAdded, kCompleting };
  struct Settling {
    std::atomic<bool> claimed{false};
    std::atomic<bool> settled{false};
    std::atomic<int> callbacks{kNone};
    c10::intrusive_ptr<c10::ivalue::Future> target;  // the Python future, when completed natively
  };
  std::shared_ptr<Settling> settling;

  explicit Call(c10::intrusive_ptr<c10::ivalue::Future> f, std::shared_ptr<Settling> s = nullptr)
      : future(std::move(f)), settling(std::move(s)) {}

  // Returns once the call is done: polls, then sleeps, without the GIL. On
  // Python's main thread the sleep wakes to run signal handlers: one that
  // raises (Ctrl-C) ends the wait with its error (py::error_already_set).
  void wait() const;

  py::tuple result() const {
    wait();
    return outcome(*future);
  }

  // True if this thread claimed the call before it completed; then returns
  // once it is done (see wait()). False if the runner claimed it.
  bool claimAndWait() const {
    if (settling && settling->claimed.exchange(true)) return false;
    wait();
    return true;
  }

  // Gives up a claim whose wait was interrupted: the runner settles the
  // Python future again. Returns whether the call is done (the runner may
  // have passed it by while it was claimed: then the caller settles it).
  bool unclaim() const {
    if (settling) settling->claimed.store(false);
    return future->completed();
  }

  // Whether this thread settles the Python future (once per call).
  bool takeSettle() const { return settling && !settling->settled.exchange(true); }

  // Python is about to add a callback to the Python future: from now on the
  // runner completes it under the GIL. If the runner is completing it
  // without, returns once it has (the callback then runs at once, in order).
  void callbacksComing() const;

  // fn() runs on the runner's Python lane, under the GIL, once the call is
  // done, unless a waiting thread claimed the call first (claimAndWait).
  // With a `target` (a torch.futures.Future, or None), a value that needs no
  // conversion (no RRef in it) completes target on the native lane without
  // the GIL instead (on the Python lane, under it, once target has Python
  // callbacks), unless a thread took the settling over first (takeSettle); the
  // list `release` is then emptied later, under the GIL (what fn would have
  // dropped). `callbacksAdded`: target has Python callbacks already.
  void addDoneCallback(std::shared_ptr<pf::CallbackRunner> runner, py::object fn, const py::object& target,
                       py::object release, bool callbacksAdded);
};

// A call message built by the caller, sent once (Agent.send or
// RRefContext.remote). Python holds it as a capsule, not a pybind object:
// pybind registers each of its instances in a global table, whose inserts
// and erases showed in the issuing thread's profile (making and freeing a
// message went from 0.32 to 0.17 µs).
py::capsule messageCapsule(Message&& m);
// The capsule's message, taken out (TypeError for any other object,
// RuntimeError if it was sent already).
Message takeMessage(const py::capsule& capsule);

// A small send that will not wait keeps the GIL (see glue.cpp).
bool sendMayWait(const Agent& agent, int dst, const Message& m);

// The binding of each concept, called once from the module init.
void bindRRefs(py::module_& m);
void bindAutograd(py::module_& m);
void bindTorchBackend(py::module_& m);

}  // namespace torchrpc::bindings
