#include "python_fallback/callback_runner.h"
#include "python_fallback/gil.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <chrono>
#include <iostream>
#include <iterator>

#include "common/intra_op.h"
#include "common/spin.h"
#include "common/thread_name.h"

namespace py = pybind11;

namespace torchrpc::python_fallback {

namespace {
thread_local bool onRunner = false;
}  // namespace

bool CallbackRunner::onRunnerThread() { return onRunner; }

CallbackRunner::CallbackRunner() : state_(std::make_shared<State>()) {
  python_ = std::thread([state = state_] {
    onRunner = true;
    common::nameThisThread("rpc-callbacks");
    common::initIntraOpThreads();
    run(state, true);
  });
  native_ = std::thread([state = state_] {
    onRunner = true;
    common::nameThisThread("rpc-completions");
    common::initIntraOpThreads();
    run(state, false);
  });
  releaser_ = std::thread([state = state_] {
    common::nameThisThread("rpc-release");
    release(state);
  });
}

CallbackRunner::~CallbackRunner() {
  if (!python_.joinable()) return;
  if (PyGILState_Check()) {
    py::gil_scoped_release release;  // the threads may be waiting for the GIL
    stop();
  } else {
    stop();
  }
  if (python_.joinable()) {  // destroyed on a lane's own thread, which cannot join itself
    python_.detach();
    native_.detach();
    releaser_.detach();
  }
}

void CallbackRunner::post(std::shared_ptr<py::object> callback) {
  enqueue(state_->python, Item{std::move(callback), {}, nullptr});
}

void CallbackRunner::post(std::function<void()> task, std::shared_ptr<py::object> callback,
                          std::shared_ptr<py::object> release, bool python) {
  enqueue(python ? state_->python : state_->native, Item{std::move(callback), std::move(task), std::move(release)});
}

void CallbackRunner::enqueue(Lane& lane, Item item) {
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!lane.stopped) {
      lane.queue.push_back(std::move(item));
      lane.queued.store(lane.queue.size());
      // Notified after the unlock: a thread woken under the lock blocks on
      // it at once, and the unlock wakes it a second time.
      lock.unlock();
      lane.cv.notify_one();
      return;
    }
  }
  // Posted after stop(): there is no lane thread left (and no I/O thread
  // either), so run it here rather than lose a completion.
  if (item.task) {
    runNative(item);
    Gil gil;
    releaseNative(item);
  } else {
    runOne(item.callback);
  }
}

void CallbackRunner::discard(std::shared_ptr<py::object> callback) {
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (state_->lanesRunning > 0) {
      state_->discarded.push_back(std::move(callback));
      if (state_->discarded.size() < kDiscardBatch) return;
      std::move(state_->discarded.begin(), state_->discarded.end(), std::back_inserter(state_->releasingCallbacks));
      state_->discarded.clear();
      lock.unlock();
      state_->releaseCv.notify_one();  // after the unlock, as in enqueue()
      return;
    }
  }
  Gil gil;
  callback.reset();
}

void CallbackRunner::runOne(std::shared_ptr<py::object>& cb) {
  Gil gil;
  try {
    (*cb)();
  } catch (py::error_already_set& e) {
    // Callbacks report their errors through their own future; anything
    // reaching here is printed, never swallowed silently.
    e.restore();
    PyErr_Print();
  }
  cb.reset();  // drop the Python references while holding the GIL
}

void CallbackRunner::runNative(Item& item) {
  try {
    item.task();
  } catch (const c10::Error& e) {
    // E.g. a future the user completed himself: printed, as a Python callback's error is.
    std::cerr << "torchrpc: an rpc_async completion failed: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "torchrpc: an rpc_async completion failed: " << e.what() << "\n";
  }
  // The task is kept until releaseNative: what it captured (a value that a
  // waiting thread settled first and Python then let go of, the last
  // reference to a Python future) may take the GIL as it goes.
}

void CallbackRunner::releaseNative(Item& item) {
  item.task = nullptr;
  if (item.release && PyList_Check(item.release->ptr())) {
    PyList_SetSlice(item.release->ptr(), 0, PY_SSIZE_T_MAX, nullptr);
  }
  item.release.reset();
  item.callback.reset();
}

void CallbackRunner::run(const std::shared_ptr<State>& state, bool python) {
  Lane& lane = python ? state->python : state->native;
  common::AdaptiveSpin spin;
  std::vector<Item> ran;  // native completions whose Python references are still held
  while (true) {
    spin.until([&] { return lane.queued.load() > 0; });
    std::deque<Item> batch;
    std::vector<std::shared_ptr<py::object>> discarded;
    bool exit = false;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      lane.cv.wait(lock, [&] { return state->stopping || !lane.queue.empty(); });
      spin.done();
      batch.swap(lane.queue);
      lane.queued.store(0);
      // Discarded callbacks go with a Python batch, under the GIL it takes anyway.
      if (python && !batch.empty()) discarded.swap(state->discarded);
      // Stopping, nothing left to run: from now on post() runs this lane's items inline.
      exit = lane.stopped = batch.empty() && state->stopping;
    }
    if (python) {
      if (!batch.empty()) {
        Gil gil;  // once for the batch (runOne's and the tasks' own acquires nest)
        for (auto& item : batch) {
          if (item.task) {
            runNative(item);
            releaseNative(item);
          } else {
            runOne(item.callback);
          }
        }
        discarded.clear();
      }
    } else {
      for (auto& item : batch) {
        runNative(item);
        ran.push_back(std::move(item));
      }
      // Their references go once nothing is queued (their arguments, say,
      // should not outlive the burst of calls), on the release thread, so
      // that the next completion does not wait for the GIL behind them.
      const bool idle = lane.queued.load() == 0;
      if (!ran.empty() && (idle || exit || ran.size() >= kDiscardBatch)) {
        {
          std::lock_guard<std::mutex> lock(state->mutex);
          std::move(ran.begin(), ran.end(), std::back_inserter(state->releasing));
        }
        state->releaseCv.notify_one();  // after the unlock, as in enqueue()
        ran.clear();
      }
    }
    if (exit) {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (--state->lanesRunning == 0) {  // the release thread drains what is left and exits
        std::move(state->discarded.begin(), state->discarded.end(), std::back_inserter(state->releasingCallbacks));
        state->discarded.clear();
        state->releaseCv.notify_one();
      }
      state->exited.notify_all();
      return;
    }
  }
}

void CallbackRunner::release(const std::shared_ptr<State>& state) {
  while (true) {
    std::vector<Item> items;
    std::vector<std::shared_ptr<py::object>> callbacks;
    bool exit = false;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->releaseCv.wait(lock, [&] {
        return state->lanesRunning == 0 || !state->releasing.empty() || !state->releasingCallbacks.empty();
      });
      items.swap(state->releasing);
      callbacks.swap(state->releasingCallbacks);
      exit = state->lanesRunning == 0;
    }
    if (!items.empty() || !callbacks.empty()) {
      Gil gil;
      for (auto& item : items) releaseNative(item);
      callbacks.clear();
    }
    if (exit) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->released = true;
      state->exited.notify_all();
      return;
    }
  }
}

bool CallbackRunner::stop(double timeoutSeconds) {
  if (!python_.joinable()) return true;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stopping = true;
  state_->python.cv.notify_one();
  state_->native.cv.notify_one();
  const auto self = std::this_thread::get_id();
  if (python_.get_id() == self || native_.get_id() == self) return true;  // a callback shutting down
  bool done = state_->exited.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                                      [&] { return state_->lanesRunning == 0 && state_->released; });
  lock.unlock();
  if (done) {
    python_.join();
    native_.join();
    releaser_.join();
    return true;
  }
  std::cerr << "torchrpc: rpc_async completion callbacks were still running " << timeoutSeconds
            << " s after shutdown began (a callback that does not return?); leaving them\n";
  python_.detach();
  native_.detach();
  releaser_.detach();
  return false;
}

namespace {

// The error of a future that Python failed (setFutureError). Each wait()
// raises a copy of its exception (torchrpc.errors.raised_copy): raising the
// stored object would append the waiting frames to its traceback, and the
// future, holding it here where Python's collector cannot see, would keep
// them alive. Upstream's futures fail with C++ errors, which each wait()
// turns into a new exception. Code that catches python_error restores the
// stored exception itself.
struct StoredPythonError : ::python_error {};

void raiseCopy(const StoredPythonError& error) {
  if (error.value == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return;
  }
  pybind11::object raised;
  try {
    raised = pybind11::module_::import("torchrpc.errors").attr("raised_copy")(pybind11::handle(error.value));
  } catch (const pybind11::error_already_set&) {
    raised = pybind11::reinterpret_borrow<pybind11::object>(error.value);
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised.ptr())), raised.ptr());
}

}  // namespace

void registerFutureErrorTranslator() {
  // Global, not local to this module: torch's bindings (Future.wait, value,
  // wait_all) are what raise these errors.
  pybind11::register_exception_translator([](std::exception_ptr error) {
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const StoredPythonError& e) {
      raiseCopy(e);
    }
  });
}

void setFutureError(pybind11::handle future, pybind11::handle exception) {
  auto wrapper = pybind11::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(future);
  // A python_error, unlike pybind11's error_already_set, can be raised again
  // by each wait() of the future.
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  StoredPythonError error;
  error.persist();
  pybind11::gil_scoped_release release;  // the future's callbacks take the GIL themselves
  wrapper->fut->setError(std::make_exception_ptr(std::move(error)));
}

}  // namespace torchrpc::python_fallback
