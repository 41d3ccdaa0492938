#pragma once

// CallbackRunner: the threads that complete rpc_async futures and run their
// callbacks.
//
// Responses complete futures on the agent's I/O thread, which must never wait
// for the GIL: a worker whose main thread is busy in Python would stop reading
// its sockets, and the TorchScript calls it serves would stall with it. So the
// I/O thread only queues the completion here, on one of two lanes, each a
// thread that runs its completions in order:
// - "rpc-callbacks", the Python lane: completions that run Python (a pickled
//   value, an RRef, an error, a resend, a future with Python callbacks), under
//   the GIL, taken once per batch;
// - "rpc-completions", the native lane: a script, builtin or exported result
//   (bindings/glue.h), which takes no GIL (callbacks that torch's Python
//   bindings put on the future, collect_all's, may; so does a future whose
//   first Python callback came while its completion was queued here, which
//   completes here, under the GIL: glue.cpp says why). It neither stops the
//   thread that is issuing calls nor waits behind a Python completion that
//   waits for the GIL.
// The Python references a native completion leaves behind (its call's
// arguments, a value Python took, the completion itself) are dropped by a
// third thread, "rpc-release", which takes the GIL for that. Owned by the
// Python state of one init_rpc.

#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace torchrpc::python_fallback {

// Completes the torch.futures.Future `future` with the Python exception
// `exception` as an error of its C++ future, as upstream's RPC futures fail:
// wait() raises that exception, and torch.futures.wait_all / collect_all
// stop at the first error. (Future.set_exception only stores the exception
// as a value that wait() raises, which collect_all cannot see.) GIL held.
void setFutureError(pybind11::handle future, pybind11::handle exception);
// Makes each raise of such an error a copy of its exception; once, at module init.
void registerFutureErrorTranslator();

class CallbackRunner {
 public:
  CallbackRunner();
  ~CallbackRunner();

  // Any thread, no GIL needed (after stop(), runs the callback inline).
  void post(std::shared_ptr<pybind11::object> callback);
  // A completion that needs no GIL, on the native lane; or, with `python`
  // (it takes the GIL itself: its future has Python callbacks), on the
  // Python lane. Its Python fallback `callback` is not run, and `release` (a
  // list of references the completion made obsolete) is emptied: both under
  // the GIL, with the task, once the lane has nothing queued (or
  // kDiscardBatch are waiting).
  void post(std::function<void()> task, std::shared_ptr<pybind11::object> callback,
            std::shared_ptr<pybind11::object> release, bool python);
  // A callback that will not run (another thread settled its future): any
  // thread, no GIL needed. Freed under the GIL with the Python lane's next
  // batch, or by the release thread once kDiscardBatch have piled up.
  void discard(std::shared_ptr<pybind11::object> callback);
  // Runs what is queued, then joins; returns false (and leaves the threads
  // running, detached) if that takes longer than timeoutSeconds, e.g. a
  // callback that never returns. Call without the GIL.
  bool stop(double timeoutSeconds = 10.0);

  // True on a lane's thread: code there is a completion or one of its
  // callbacks, and a future it waits for is settled by no one else.
  static bool onRunnerThread();

 private:
  // Shared with the threads, which may outlive this object after a stop()
  // that gave up on them.
  static constexpr size_t kDiscardBatch = 64;

  // One queued completion: Python (`callback`), or native (`task`, with the
  // references post() names).
  struct Item {
    std::shared_ptr<pybind11::object> callback;
    std::function<void()> task;
    std::shared_ptr<pybind11::object> release;
  };

  // One lane's queue (guarded by State::mutex, but `queued`, which its
  // thread polls).
  struct Lane {
    std::condition_variable cv;  // work queued, or stopping
    std::deque<Item> queue;
    std::atomic<size_t> queued{0};
    bool stopped{false};  // its thread has exited: post() runs its items inline
  };

  struct State {
    std::mutex mutex;
    std::condition_variable exited;  // a thread is done
    Lane python, native;
    std::vector<std::shared_ptr<pybind11::object>> discarded;
    bool stopping{false};
    int lanesRunning{2};  // 0: nothing more comes to the release thread
    // Handed to the release thread: native completions done, and discarded callbacks.
    std::condition_variable releaseCv;  // something to release, or both lanes exited
    std::vector<Item> releasing;
    std::vector<std::shared_ptr<pybind11::object>> releasingCallbacks;
    bool released{false};  // the release thread has exited
  };

  void enqueue(Lane& lane, Item item);
  static void run(const std::shared_ptr<State>& state, bool python);
  // The release thread: drops what the lanes hand over, under the GIL.
  static void release(const std::shared_ptr<State>& state);
  static void runOne(std::shared_ptr<pybind11::object>& callback);
  static void runNative(Item& item);
  // Drops a native completion's Python references (post()) and the task,
  // with what it captured. Needs the GIL.
  static void releaseNative(Item& item);

  std::shared_ptr<State> state_;
  std::thread python_;
  std::thread native_;
  std::thread releaser_;
};

}  // namespace torchrpc::python_fallback
