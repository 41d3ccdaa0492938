#pragma once

// InFlight: counts the RRef protocol steps this worker started and has not
// finished (a message not yet answered, a value being created), so that
// graceful shutdown can wait until there are none (waitIdle).
//
// A step is counted while any copy of its Token lives: take one when the step
// starts and let the last copy go when it ends, on whatever path it ends.
// Thread-safe; tokens may outlive the InFlight that issued them.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

namespace torchrpc::rref {

class InFlight {
 public:
  using Token = std::shared_ptr<void>;

  InFlight() : state_(std::make_shared<State>()) {}

  Token begin() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      ++state_->count;
    }
    return Token(nullptr, [state = state_](void*) {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (--state->count == 0) state->idle.notify_all();
    });
  }

  // Waits until nothing is in flight, at most `seconds`; returns what still is.
  size_t waitIdle(double seconds) const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->idle.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return state_->count == 0; });
    return state_->count;
  }

  size_t count() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->count;
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable idle;
    size_t count{0};
  };
  std::shared_ptr<State> state_;
};

}  // namespace torchrpc::rref
