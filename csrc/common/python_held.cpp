#include "common/python_held.h"

#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/thread_name.h"

namespace torchrpc::common {

bool pythonHeld(const at::Tensor& t) {
  if (!t.defined()) return false;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->pyobj_slot()->load_pyobj() != nullptr) return true;
  return impl->has_storage() && t.storage().unsafeGetStorageImpl()->pyobj_slot()->load_pyobj() != nullptr;
}

namespace {

bool sharedTensor(const at::Tensor& t) {
  return t.use_count() > 1 || (t.has_storage() && t.storage().use_count() > 1);
}

// Whether `v` holds a Python object, or (`orShared`) a part that someone
// else holds too.
bool heldInside(const c10::IValue& v, int depth, bool orShared) {
  if (v.isTensor()) return pythonHeld(v.toTensor()) || (orShared && sharedTensor(v.toTensor()));
  if (v.isPyObject()) return true;
  if (!v.isTuple() && !v.isList() && !v.isGenericDict()) return false;
  if (depth > 8 || (orShared && v.use_count() > 1)) return true;  // deeper than results go: assume the worst
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (heldInside(e, depth + 1, orShared)) return true;
    }
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (heldInside(e, depth + 1, orShared)) return true;
    }
  } else {
    for (const auto& item : v.toGenericDict()) {
      if (heldInside(item.key(), depth + 1, orShared) || heldInside(item.value(), depth + 1, orShared)) return true;
    }
  }
  return false;
}

bool completedValue(const c10::ivalue::Future& future) { return future.completed() && !future.hasError(); }

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

struct Dropper {
  std::mutex mutex;
  std::condition_variable cv;
  std::condition_variable drained;  // the thread waits with nothing queued
  std::vector<std::shared_ptr<void>> queue;
  std::vector<FuturePtr> futures;
  std::vector<at::Tensor> tensors;
  // kAsleep: nothing queued, any hand-over wakes it; kTimed: only lazy drops
  // queued, a prompt one wakes it; kBusy: it gathers or drops.
  enum class State { kBusy, kTimed, kAsleep } state{State::kBusy};
  bool prompt{false};   // a prompt drop is queued
  bool running{false};  // the thread was started (in this process: a forked child has none)
  bool keep{false};     // Python is exiting: what is handed from now on is kept, never dropped
  bool dropping{false};  // a batch is being dropped (outside the lock)

  bool empty() const { return queue.empty() && futures.empty() && tensors.empty(); }
};

// Never destroyed: the thread may outlive static destruction at exit.
Dropper& dropper() {
  static Dropper* d = [] {
    auto* made = new Dropper;
    pthread_atfork(nullptr, nullptr, [] { dropper().running = false; });
    return made;
  }();
  return *d;
}

// A thread woken for a prompt drop first gathers for this long: a busy
// worker hands it a future per call, and one wake-up then serves all those
// of the moment. Lazy drops wait for the next prompt batch, or this long.
constexpr auto kGather = std::chrono::microseconds(500);
constexpr auto kLazyWait = std::chrono::milliseconds(5);

void run(Dropper& d) {
  nameThisThread("rpc-drop");
  for (;;) {
    bool gather = false;
    {
      std::unique_lock<std::mutex> lock(d.mutex);
      if (d.empty()) d.drained.notify_all();
      if (!d.prompt) {
        d.state = Dropper::State::kAsleep;
        d.cv.wait(lock, [&] { return !d.empty(); });
      }
      if (!d.prompt) {
        d.state = Dropper::State::kTimed;
        d.cv.wait_for(lock, kLazyWait, [&] { return d.prompt; });
      }
      d.state = Dropper::State::kBusy;
      gather = d.prompt;
    }
    if (gather) std::this_thread::sleep_for(kGather);
    std::vector<std::shared_ptr<void>> batch;
    std::vector<FuturePtr> futures;
    std::vector<at::Tensor> tensors;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      batch.swap(d.queue);
      futures.swap(d.futures);
      tensors.swap(d.tensors);
      d.prompt = false;
      if (d.keep) {  // leaked on purpose: the process is ending (stopDropping)
        new auto(std::move(batch));
        new auto(std::move(futures));
        new auto(std::move(tensors));
        continue;
      }
      d.dropping = true;
    }
    batch.clear();  // takes the GIL where Python objects go with them
    futures.clear();
    tensors.clear();
    std::lock_guard<std::mutex> lock(d.mutex);
    d.dropping = false;
    d.drained.notify_all();
  }
}

std::atomic<bool (*)()> gilCheck{nullptr};

bool holdsGil() {
  auto* check = gilCheck.load(std::memory_order_relaxed);
  return check != nullptr && check();
}

// Queues `item` for the rpc-drop thread (started here the first time, and
// again after a fork). Never throws.
template <typename T>
void hand(std::vector<T> Dropper::*list, T item, Drop urgency) noexcept {
  Dropper& d = dropper();
  try {
    std::lock_guard<std::mutex> lock(d.mutex);
    (d.*list).push_back(std::move(item));
    if (!d.running) {
      std::thread([&d] { run(d); }).detach();
      d.running = true;
    }
    if (urgency == Drop::kPrompt) d.prompt = true;
    if (d.state == Dropper::State::kAsleep || (d.prompt && d.state == Dropper::State::kTimed)) {
      d.state = Dropper::State::kBusy;  // once: the thread takes what follows
      d.cv.notify_one();
    }
  } catch (const std::exception& e) {
    // No thread (or no memory): kept queued, freed once a later call starts one.
    TORCHRPC_WARN("torchrpc", "could not start the rpc-drop thread: " << e.what());
  }
}

}  // namespace

void dropAside(std::shared_ptr<void> held, Drop urgency) noexcept { hand(&Dropper::queue, std::move(held), urgency); }

void setGilCheck(bool (*check)()) { gilCheck.store(check); }

bool stopDropping(double seconds) {
  Dropper& d = dropper();
  std::unique_lock<std::mutex> lock(d.mutex);
  d.keep = true;
  return d.drained.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return !d.dropping; });
}

bool waitDropped(double seconds) {
  Dropper& d = dropper();
  std::unique_lock<std::mutex> lock(d.mutex);
  if (!d.empty()) {  // lazy drops too, now
    d.prompt = true;
    if (d.state != Dropper::State::kBusy) d.cv.notify_one();
  }
  return d.drained.wait_for(lock, std::chrono::duration<double>(seconds),
                            [&] { return !d.running || (d.state != Dropper::State::kBusy && d.empty()); });
}

bool dropsWithoutGil(const at::Tensor& t) { return !pythonHeld(t) && !sharedTensor(t); }

bool pythonHeld(const c10::IValue& value) { return heldInside(value, 0, false); }

bool dropsWithoutGil(const c10::IValue& value) { return !heldInside(value, 0, true); }

bool pythonHeld(const c10::ivalue::Future& future) { return completedValue(future) && pythonHeld(future.constValue()); }

bool dropsWithoutGil(const c10::ivalue::Future& future) {
  return !completedValue(future) || dropsWithoutGil(future.constValue());
}

std::optional<Drop> handOver(bool alone, const c10::ivalue::Future& value) {
  // Another holder (Python, mostly) may take the value and let go between a
  // look here and the drop: only what is nobody else's is dropped here.
  if (alone && dropsWithoutGil(value)) return std::nullopt;
  return alone && pythonHeld(value) ? Drop::kPrompt : Drop::kLazy;
}

void release(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept {
  if (!future) return;
  if (auto urgency = handOver(future.use_count() == 1, *future)) {
    hand(&Dropper::futures, std::move(future), *urgency);
  } else {
    future.reset();
  }
}

void release(at::Tensor& t) noexcept {
  if (!t.defined()) return;
  const bool python = pythonHeld(t);
  const bool shared = sharedTensor(t);
  // A thread that holds the GIL (Python's, sending a small message) cannot
  // wait for it, so it drops what has no Python object yet itself: handed
  // aside, tiny calls read 64 µs instead of 37-42 (benchmarks/HISTORY.md).
  if (!python && (!shared || holdsGil())) {
    t.reset();
    return;
  }
  hand(&Dropper::tensors, std::move(t), shared ? Drop::kLazy : Drop::kPrompt);
}

c10::intrusive_ptr<c10::ivalue::Future> completedBy(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                                                    std::function<void(std::function<void()>)> launch) {
  auto out = c10::make_intrusive<c10::ivalue::Future>(future->elementType());
  // Mutable: `out` moves on to the task, so that no reference to it stays
  // on the completing thread.
  future->addCallback([out, launch = std::move(launch)](c10::ivalue::Future& done) mutable {
    std::exception_ptr error = done.hasError() ? done.exception_ptr() : nullptr;
    c10::IValue value = error ? c10::IValue() : done.value();
    launch([out = std::move(out), value = std::move(value), error]() mutable {
      if (error) {
        out->setError(error);
      } else {
        out->markCompleted(std::move(value));
      }
    });
  });
  return out;
}

c10::intrusive_ptr<c10::ivalue::Future> completedOnInterOpPool(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  return completedBy(future, [](std::function<void()> task) { at::launch(std::move(task)); });
}

}  // namespace torchrpc::common
