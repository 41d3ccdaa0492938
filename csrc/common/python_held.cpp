#include "common/python_held.h"

#include <ATen/core/ivalue.h>
#include <unistd.h>

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

struct Dropper {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::shared_ptr<void>> queue;
  pid_t runningIn{0};  // the process whose rpc-drop thread runs (none after a fork)
};

// Never destroyed: the thread may outlive static destruction at exit.
Dropper& dropper() {
  static auto* d = new Dropper;
  return *d;
}

void run(Dropper& d) {
  nameThisThread("rpc-drop");
  for (;;) {
    std::vector<std::shared_ptr<void>> batch;
    {
      std::unique_lock<std::mutex> lock(d.mutex);
      d.cv.wait(lock, [&] { return !d.queue.empty(); });
      batch.swap(d.queue);
    }
    batch.clear();  // takes the GIL where Python objects go with them
  }
}

}  // namespace

void dropAside(std::shared_ptr<void> held) noexcept {
  Dropper& d = dropper();
  try {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.queue.push_back(std::move(held));
    const pid_t me = ::getpid();
    if (d.runningIn != me) {
      std::thread([&d] { run(d); }).detach();
      d.runningIn = me;
    }
    d.cv.notify_one();
  } catch (const std::exception& e) {
    // No thread (or no memory): kept queued, freed once a later call starts one.
    TORCHRPC_WARN("torchrpc", "could not start the rpc-drop thread: " << e.what());
  }
}

bool pythonHeld(const c10::IValue& value) { return heldInside(value, 0); }

namespace {

// Drops `future`: on the rpc-drop thread when `aside`.
void releaseFuture(c10::intrusive_ptr<c10::ivalue::Future>& future, bool aside) noexcept {
  if (aside) {
    try {
      dropAside(std::make_shared<c10::intrusive_ptr<c10::ivalue::Future>>(std::move(future)));
      return;
    } catch (...) {
      // no memory for the hand-over: dropped here after all
    }
  }
  future.reset();
}

bool valueHeld(const c10::ivalue::Future& future) {
  return future.completed() && !future.hasError() && pythonHeld(future.constValue());
}

}  // namespace

void release(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept {
  releaseFuture(future, future && future.use_count() == 1 && valueHeld(*future));
}

void releaseShared(c10::intrusive_ptr<c10::ivalue::Future>& future) noexcept {
  releaseFuture(future, future && future.use_count() > 1 && valueHeld(*future));
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

}  // namespace torchrpc::common
