#include "common/python_held.h"

#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>
#include <unistd.h>

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

bool heldInside(const c10::IValue& v, int depth) {
  if (v.isTensor()) return pythonHeld(v.toTensor());
  if (v.isPyObject()) return true;
  if (!v.isTuple() && !v.isList() && !v.isGenericDict()) return false;
  if (depth > 8) return true;  // deeper than results go: assume the worst
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (heldInside(e, depth + 1)) return true;
    }
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (heldInside(e, depth + 1)) return true;
    }
  } else if (v.isGenericDict()) {
    for (const auto& item : v.toGenericDict()) {
      if (heldInside(item.key(), depth + 1) || heldInside(item.value(), depth + 1)) return true;
    }
  }
  return false;
}

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

struct Dropper {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::shared_ptr<void>> queue;
  std::vector<FuturePtr> futures;
  bool idle{false};    // the thread waits for work (a hand-over wakes it)
  pid_t runningIn{0};  // the process whose rpc-drop thread runs (none after a fork)
};

// Never destroyed: the thread may outlive static destruction at exit.
Dropper& dropper() {
  static auto* d = new Dropper;
  return *d;
}

// A woken drop thread first gathers for this long: a busy worker hands it a
// future per call, and one wake-up then serves all those of the moment.
constexpr auto kGather = std::chrono::microseconds(500);

void run(Dropper& d) {
  nameThisThread("rpc-drop");
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(d.mutex);
      d.idle = true;
      d.cv.wait(lock, [&] { return !d.queue.empty() || !d.futures.empty(); });
      d.idle = false;
    }
    std::this_thread::sleep_for(kGather);
    std::vector<std::shared_ptr<void>> batch;
    std::vector<FuturePtr> futures;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      batch.swap(d.queue);
      futures.swap(d.futures);
    }
    batch.clear();  // takes the GIL where Python objects go with them
    futures.clear();
  }
}

// Queues `item` for the rpc-drop thread (started here the first time, and
// again after a fork). Never throws.
template <typename T>
void hand(std::vector<T> Dropper::*list, T item) noexcept {
  Dropper& d = dropper();
  try {
    std::lock_guard<std::mutex> lock(d.mutex);
    (d.*list).push_back(std::move(item));
    const pid_t me = ::getpid();
    if (d.runningIn != me) {
      std::thread([&d] { run(d); }).detach();
      d.runningIn = me;
    }
    if (d.idle) {  // once: the thread gathers what follows
      d.idle = false;
      d.cv.notify_one();
    }
  } catch (const std::exception& e) {
    // No thread (or no memory): kept queued, freed once a later call starts one.
    TORCHRPC_WARN("torchrpc", "could not start the rpc-drop thread: " << e.what());
  }
}

}  // namespace

void dropAside(std::shared_ptr<void> held) noexcept { hand(&Dropper::queue, std::move(held)); }

bool pythonHeld(const c10::IValue& value) { return heldInside(value, 0); }

bool pythonHeld(const c10::ivalue::Future& future) {
  return future.completed() && !future.hasError() && pythonHeld(future.constValue());
}

void release(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept {
  if (!future) return;
  // Another holder (Python, mostly) may take the value and let go of the
  // future between a look here and the drop: only a future that is nobody
  // else's and holds nothing of Python's is dropped here.
  if (future.use_count() == 1 && !pythonHeld(*future)) {
    future.reset();
    return;
  }
  hand(&Dropper::futures, std::move(future));
}

void release(at::Tensor& t) noexcept {
  if (!pythonHeld(t)) {
    t.reset();
    return;
  }
  try {
    dropAside(std::make_shared<at::Tensor>(std::move(t)));
  } catch (...) {
    t.reset();  // no memory for the hand-over: dropped here after all
  }
}

c10::intrusive_ptr<c10::ivalue::Future> completedOnInterOpPool(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  auto out = c10::make_intrusive<c10::ivalue::Future>(future->elementType());
  // Mutable: `out` moves on to the task, so that no reference to it stays
  // on the completing thread.
  future->addCallback([out](c10::ivalue::Future& done) mutable {
    std::exception_ptr error = done.hasError() ? done.exception_ptr() : nullptr;
    c10::IValue value = error ? c10::IValue() : done.value();
    at::launch([out = std::move(out), value = std::move(value), error]() mutable {
      if (error) {
        out->setError(error);
      } else {
        out->markCompleted(std::move(value));
      }
    });
  });
  return out;
}

}  // namespace torchrpc::common
