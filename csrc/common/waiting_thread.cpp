#include "common/waiting_thread.h"

#include <chrono>
#include <exception>

#include "common/error.h"
#include "common/logging.h"
#include "common/spin.h"

namespace torchrpc::common {

WaitingThread::Task WaitingThread::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!hasTask_.load(std::memory_order_relaxed)) return nullptr;
  hasTask_.store(false, std::memory_order_relaxed);
  return std::move(task_);
}

void WaitingThread::close(const std::function<void(Task)>& elsewhere) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepting_ = false;
  }
  if (Task left = take()) elsewhere(std::move(left));
}

void WaitingThread::serveUntil(c10::ivalue::Future& future, const std::function<void()>& onSleep,
                               const std::function<void(Task)>& elsewhere) {
  auto self = shared_from_this();
  future.addCallback([self](c10::ivalue::Future&) {
    { std::lock_guard<std::mutex> lock(self->mutex_); }  // the thread is asleep, or sees completed()
    self->cv_.notify_all();
  });
  struct Closing {  // on every way out, an exception's too
    WaitingThread& t;
    const std::function<void(Task)>& elsewhere;
    ~Closing() { t.close(elsewhere); }
  } closing{*this, elsewhere};
  static thread_local AdaptiveSpin spin;  // this thread's waits of this kind
  while (true) {
    if (!spin.until([&] { return hasTask_.load(std::memory_order_acquire) || future.completed(); })) {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!hasTask_.load(std::memory_order_relaxed) && !future.completed()) {
        if (cv_.wait_for(lock, std::chrono::milliseconds(100)) == std::cv_status::timeout && onSleep) {
          lock.unlock();
          onSleep();
          lock.lock();
        }
      }
    }
    spin.done();
    if (Task task = take()) {
      try {
        task();
      } catch (...) {  // tasks answer their own errors; this one escaped
        TORCHRPC_WARN(worker_, "a task run while waiting in " << what_ << " threw: "
                                  << errorParts(std::current_exception()).message);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        accepting_ = true;
      }
      continue;
    }
    if (future.completed()) return;
  }
}

}  // namespace torchrpc::common
