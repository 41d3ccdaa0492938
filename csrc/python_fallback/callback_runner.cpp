#include "python_fallback/callback_runner.h"
#include "python_fallback/gil.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <iterator>
#include <optional>

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
  thread_ = std::thread([state = state_] {
    onRunner = true;
    common::nameThisThread("rpc-callbacks");
    common::initIntraOpThreads();
    run(state);
  });
  releaser_ = std::thread([state = state_] {
    common::nameThisThread("rpc-release");
    release(state);
  });
}

CallbackRunner::~CallbackRunner() {
  if (!thread_.joinable()) return;
  if (PyGILState_Check()) {
    py::gil_scoped_release release;  // the thread may be waiting for the GIL
    stop();
  } else {
    stop();
  }
}

void CallbackRunner::post(std::shared_ptr<py::object> callback) { enqueue(Item{std::move(callback), {}, nullptr}); }

void CallbackRunner::post(std::function<void()> task, std::shared_ptr<py::object> callback,
                          std::shared_ptr<py::object> release) {
  enqueue(Item{std::move(callback), std::move(task), std::move(release)});
}

void CallbackRunner::enqueue(Item item) {
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->stopped) {
      state_->queue.push_back(std::move(item));
      state_->queued.store(state_->queue.size());
      // Notified after the unlock: a thread woken under the lock blocks on
      // it at once, and the unlock wakes it a second time.
      lock.unlock();
      state_->cv.notify_one();
      return;
    }
  }
  // Posted after stop(): there is no runner thread left (and no I/O thread
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
    if (!state_->stopped) {
      state_->discarded.push_back(std::move(callback));
      const bool full = state_->discarded.size() >= kDiscardBatch;
      lock.unlock();
      if (full) state_->cv.notify_one();  // after the unlock, as in enqueue()
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
  item.task = nullptr;
}

void CallbackRunner::releaseNative(Item& item) {
  if (item.release && PyList_Check(item.release->ptr())) {
    PyList_SetSlice(item.release->ptr(), 0, PY_SSIZE_T_MAX, nullptr);
  }
  item.release.reset();
  item.callback.reset();
}

void CallbackRunner::run(const std::shared_ptr<State>& state) {
  common::AdaptiveSpin spin;
  std::vector<Item> ran;  // native completions whose Python references are still held
  while (true) {
    spin.until([&] { return state->queued.load() > 0; });
    std::deque<Item> batch;
    std::vector<std::shared_ptr<py::object>> discarded;
    bool exit = false;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->cv.wait(lock, [&] {
        return state->stopping || !state->queue.empty() || state->discarded.size() >= kDiscardBatch;
      });
      spin.done();
      batch.swap(state->queue);
      state->queued.store(0);
      // Discarded callbacks are freed under the GIL: with a batch that takes
      // it anyway, or by the release thread once kDiscardBatch have piled up,
      // or at the end.
      bool python = std::any_of(batch.begin(), batch.end(), [](const Item& i) { return !i.task; });
      if (python || state->stopping || state->discarded.size() >= kDiscardBatch) discarded.swap(state->discarded);
      // Stopping, nothing left to run: from now on post() and discard() run inline.
      exit = state->stopped = batch.empty() && state->stopping;
    }
    // The GIL from the first Python completion to the batch's end (runOne's
    // acquire nests); a batch of native ones takes none.
    std::optional<Gil> gil;
    for (auto& item : batch) {
      if (item.task) {
        runNative(item);
        ran.push_back(std::move(item));
      } else {
        if (!gil) gil.emplace();
        runOne(item.callback);
      }
    }
    // Native completions drop their references once nothing is queued (their
    // arguments, say, should not outlive the burst of calls): here, with the
    // GIL taken anyway, or else on the release thread, so that the next
    // completion does not wait for the GIL behind them.
    bool idle = state->queued.load() == 0;
    if (gil) {
      for (auto& item : ran) releaseNative(item);
      ran.clear();
      discarded.clear();
    } else if ((!ran.empty() && (idle || exit || ran.size() >= kDiscardBatch)) || !discarded.empty()) {
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        std::move(ran.begin(), ran.end(), std::back_inserter(state->releasing));
        std::move(discarded.begin(), discarded.end(), std::back_inserter(state->releasingCallbacks));
      }
      state->releaseCv.notify_one();  // after the unlock, as in enqueue()
      ran.clear();
      discarded.clear();
    }
    if (exit) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->handedOver = true;  // the release thread drains and exits
      state->releaseCv.notify_one();
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
        return state->handedOver || !state->releasing.empty() || !state->releasingCallbacks.empty();
      });
      items.swap(state->releasing);
      callbacks.swap(state->releasingCallbacks);
      exit = state->handedOver;
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
  if (!thread_.joinable()) return true;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stopping = true;
  state_->cv.notify_one();
  if (thread_.get_id() == std::this_thread::get_id()) return true;  // a callback shutting down
  bool done = state_->exited.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                                      [&] { return state_->stopped && state_->released; });
  lock.unlock();
  if (done) {
    thread_.join();
    releaser_.join();
    return true;
  }
  std::cerr << "torchrpc: rpc_async completion callbacks were still running " << timeoutSeconds
            << " s after shutdown began (a callback that does not return?); leaving them\n";
  thread_.detach();
  releaser_.detach();
  return false;
}

void setFutureError(pybind11::handle future, pybind11::handle exception) {
  auto wrapper = pybind11::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(future);
  // A python_error, unlike pybind11's error_already_set, can be raised again
  // by each wait() of the future.
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  ::python_error error;
  error.persist();
  pybind11::gil_scoped_release release;  // the future's callbacks take the GIL themselves
  wrapper->fut->setError(std::make_exception_ptr(std::move(error)));
}

}  // namespace torchrpc::python_fallback
