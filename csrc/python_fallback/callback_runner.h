#pragma once

// CallbackRunner: the thread that completes rpc_async futures and runs their
// callbacks.
//
// Responses complete futures on the agent's I/O thread, which must never wait
// for the GIL: a worker whose main thread is busy in Python would stop reading
// its sockets, and the TorchScript calls it serves would stall with it. So the
// I/O thread only queues the completion here; this thread runs them in order.
// A Python completion runs under the GIL (taken once per batch); a native one
// (a script or builtin result, bindings/glue.h) takes no GIL, so it does not
// stop the thread that is issuing calls. The Python references a native
// completion leaves behind (its call's arguments) are dropped by a second
// thread, "rpc-release", which takes the GIL for that: a completion queued
// behind them never waits for the GIL. Owned by the Python state of one
// init_rpc.

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

class CallbackRunner {
 public:
  CallbackRunner();
  ~CallbackRunner();

  // Any thread, no GIL needed (after stop(), runs the callback inline).
  void post(std::shared_ptr<pybind11::object> callback);
  // A completion that needs no GIL (it may take it itself). Its Python
  // fallback `callback` is not run, and `release` (a list of references the
  // completion made obsolete) is emptied: both under the GIL, once this
  // thread has nothing queued (or kDiscardBatch are waiting).
  void post(std::function<void()> task, std::shared_ptr<pybind11::object> callback,
            std::shared_ptr<pybind11::object> release);
  // A callback that will not run (another thread settled its future): any
  // thread, no GIL needed. Freed under the GIL with the next batch, or once
  // kDiscardBatch have piled up.
  void discard(std::shared_ptr<pybind11::object> callback);
  // Runs what is queued, then joins; returns false (and leaves the thread
  // running, detached) if that takes longer than timeoutSeconds, e.g. a
  // callback that never returns. Call without the GIL.
  bool stop(double timeoutSeconds = 10.0);

  // True on a runner's thread: code there is a completion or one of its
  // callbacks, and a future it waits for is settled by no one else.
  static bool onRunnerThread();

 private:
  // Shared with the thread, which may outlive this object after a stop()
  // that gave up on it.
  static constexpr size_t kDiscardBatch = 64;

  // One queued completion: Python (`callback`), or native (`task`, with the
  // references post() names).
  struct Item {
    std::shared_ptr<pybind11::object> callback;
    std::function<void()> task;
    std::shared_ptr<pybind11::object> release;
  };

  struct State {
    std::mutex mutex;
    std::condition_variable cv;      // work queued, or stopping
    std::condition_variable exited;  // a thread is done
    std::deque<Item> queue;
    std::vector<std::shared_ptr<pybind11::object>> discarded;
    std::atomic<size_t> queued{0};
    bool stopping{false};
    bool stopped{false};  // the thread has exited; post() runs callbacks inline
    // Handed to the release thread: native completions done, and discarded callbacks.
    std::condition_variable releaseCv;  // something to release, or the runner stopped
    std::vector<Item> releasing;
    std::vector<std::shared_ptr<pybind11::object>> releasingCallbacks;
    bool handedOver{false};  // the runner has exited: nothing more comes
    bool released{false};    // the release thread has exited
  };

  void enqueue(Item item);
  static void run(const std::shared_ptr<State>& state);
  // The release thread: drops what run() hands over, under the GIL.
  static void release(const std::shared_ptr<State>& state);
  static void runOne(std::shared_ptr<pybind11::object>& callback);
  static void runNative(Item& item);
  // Drops a native completion's Python references (post()). Needs the GIL.
  static void releaseNative(Item& item);

  std::shared_ptr<State> state_;
  std::thread thread_;
  std::thread releaser_;
};

}  // namespace torchrpc::python_fallback
