#include "common/timers.h"

#include <exception>

#include "common/logging.h"
#include "common/thread_name.h"

namespace torchrpc::common {

Timers::Timers(std::string workerName) : state_(std::make_shared<State>()) {
  state_->workerName = std::move(workerName);
}

Timers::Id Timers::at(Clock::time_point when, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(threadMutex_);
    if (!thread_.joinable() && !state_->stopping) thread_ = std::thread([state = state_] { run(state); });
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  const Id id = state_->nextId++;
  if (state_->stopping) return id;
  const bool earliest = state_->due.empty() || when < state_->due.begin()->first.first;
  state_->due.emplace(std::make_pair(when, id), std::move(fn));
  state_->whenOf[id] = when;
  if (earliest) state_->cv.notify_one();
  return id;
}

Timers::Id Timers::after(double seconds, std::function<void()> fn) {
  return at(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)),
            std::move(fn));
}

void Timers::cancel(Id id) {
  std::function<void()> dropped;  // destroyed unlocked
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->whenOf.find(id);
  if (it == state_->whenOf.end()) return;
  auto due = state_->due.find(std::make_pair(it->second, id));
  dropped = std::move(due->second);
  state_->due.erase(due);
  state_->whenOf.erase(it);
}

void Timers::stop() {
  decltype(state_->due) dropped;  // destroyed unlocked
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    dropped.swap(state_->due);
    state_->whenOf.clear();
    state_->cv.notify_one();
  }
  std::lock_guard<std::mutex> lock(threadMutex_);
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // stop() from a callback: the thread ends after it, holding its state
  } else {
    thread_.join();
  }
}

void Timers::run(const std::shared_ptr<State>& state) {
  nameThisThread("rpc-timers");
  std::unique_lock<std::mutex> lock(state->mutex);
  while (!state->stopping) {
    if (state->due.empty()) {
      state->cv.wait(lock);
      continue;
    }
    auto first = state->due.begin();
    if (first->first.first > Clock::now()) {
      state->cv.wait_until(lock, first->first.first);
      continue;
    }
    auto fn = std::move(first->second);
    state->whenOf.erase(first->first.second);
    state->due.erase(first);
    lock.unlock();
    try {
      fn();
    } catch (const std::exception& e) {
      TORCHRPC_WARN(state->workerName, "a timer callback failed: " << e.what());
    } catch (...) {
      TORCHRPC_WARN(state->workerName, "a timer callback failed with a non-standard exception");
    }
    fn = nullptr;  // its captures die before the lock is taken again
    lock.lock();
  }
}

}  // namespace torchrpc::common
