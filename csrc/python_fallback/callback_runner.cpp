#include "python_fallback/callback_runner.h"

#include "common/intra_op.h"

#include "common/spin.h"

namespace py = pybind11;

namespace torchrpc::python_fallback {

CallbackRunner::CallbackRunner() {
  thread_ = std::thread([this] {
    initIntraOpThreads();
    run();
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

void CallbackRunner::post(std::shared_ptr<py::object> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_) {
      queue_.push_back(std::move(callback));
      queued_.store(queue_.size());
      cv_.notify_one();
      return;
    }
  }
  // Posted after stop(): there is no runner thread left (and no I/O thread
  // either), so run it here rather than lose a completion.
  runOne(callback);
}

void CallbackRunner::runOne(std::shared_ptr<py::object>& cb) {
  py::gil_scoped_acquire gil;
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

void CallbackRunner::run() {
  while (true) {
    spinUntil([this] { return queued_.load() > 0; });
    std::deque<std::shared_ptr<py::object>> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {  // stopping, nothing left
        stopped_ = true;
        return;
      }
      batch.swap(queue_);
      queued_.store(0);
    }
    py::gil_scoped_acquire gil;  // once per batch; runOne's acquire nests
    for (auto& cb : batch) runOne(cb);
  }
}

void CallbackRunner::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace torchrpc::python_fallback
