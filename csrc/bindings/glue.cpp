#include "bindings/glue.h"

#include <torch/csrc/jit/python/pybind_utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/error.h"
#include "jit_ops/script_rref.h"
#include "message/tensor_layout.h"

namespace torchrpc::bindings {

py::tuple errorTuple(const std::exception_ptr& error) {
  auto parts = torchrpc::common::errorParts(error);
  return py::make_tuple(static_cast<int>(parts.kind), parts.message, parts.remoteType, parts.remoteTraceback);
}

py::object pyValue(const c10::IValue& value) {
  if (!torchrpc::jit_ops::containsRRef(value)) return torch::jit::toPyObject(value);
  if (auto r = torchrpc::jit_ops::rrefOf(value)) {
    return py::module_::import("torchrpc.rref").attr("RRef").attr("_wrap")(std::move(r));
  }
  if (value.isTuple()) {
    const auto& el = value.toTupleRef().elements();
    py::tuple out(el.size());
    for (size_t i = 0; i < el.size(); ++i) out[i] = pyValue(el[i]);
    return out;
  }
  if (value.isList()) {
    py::list out;
    for (const auto& v : value.toListRef()) out.append(pyValue(v));
    return out;
  }
  if (value.isGenericDict()) {
    py::dict out;
    for (const auto& item : value.toGenericDict()) out[pyValue(item.key())] = pyValue(item.value());
    return out;
  }
  return torch::jit::toPyObject(value);  // e.g. an RRef inside a script object's attribute
}

py::tuple outcome(const c10::ivalue::Future& future) {
  if (future.hasError()) return py::make_tuple(false, errorTuple(future.exception_ptr()));
  return py::make_tuple(true, pyValue(future.constValue()));
}

namespace {

// Python's main thread, the one that runs signal handlers. Called with the
// GIL. Not a function-local static: its guard would be held across Python
// calls that may hand the GIL to a thread that then waits on that guard.
unsigned long mainThreadIdent() {
  static std::atomic<unsigned long> ident{0};
  unsigned long known = ident.load(std::memory_order_relaxed);
  if (known == 0) {
    known = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
    ident.store(known, std::memory_order_relaxed);
  }
  return known;
}

void runSignalHandlers() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// future.wait(), waking every 100 ms or so to run Python's signal handlers.
// Its callback wakes it, but runs after the future's earlier callbacks, so
// the wait also checks completed(), at intervals that grow from 1 ms: it
// returns once the value is set, as torch's wait does, not once a slow
// callback added before it has returned (which may wait for this thread).
void waitRunningSignalHandlers(c10::ivalue::Future& future) {
  struct Waiter {
    std::mutex mutex;
    std::condition_variable cv;
  };
  auto waiter = std::make_shared<Waiter>();
  future.addCallback([waiter](c10::ivalue::Future&) {
    // The future is completed already; the lock orders this wake-up after
    // the waiter's check of completed().
    { std::lock_guard<std::mutex> lock(waiter->mutex); }
    waiter->cv.notify_all();
  });
  using std::chrono::milliseconds;
  constexpr milliseconds kSignalsEvery(100);
  milliseconds slice(1), sinceSignals(0);
  std::unique_lock<std::mutex> lock(waiter->mutex);
  while (!waiter->cv.wait_for(lock, slice, [&] { return future.completed(); })) {
    sinceSignals += slice;
    slice = std::min(slice * 2, kSignalsEvery);
    if (sinceSignals >= kSignalsEvery) {
      sinceSignals = milliseconds(0);
      lock.unlock();
      runSignalHandlers();
      lock.lock();
    }
  }
}

}  // namespace

std::function<void()> signalHandlerRunner() {
  if (PyThread_get_thread_ident() != mainThreadIdent()) return nullptr;
  return runSignalHandlers;
}

void waitForFuture(const py::object& future) {
  auto fut = py::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(future)->fut;
  if (fut->completed() || PyThread_get_thread_ident() != mainThreadIdent()) return;  // the caller's wait does it
  py::gil_scoped_release nogil;
  waitRunningSignalHandlers(*fut);
}

void Call::wait() const {
  if (future->completed()) return;  // completion callbacks find it done: they keep the GIL
  const bool mainThread = PyThread_get_thread_ident() == mainThreadIdent();
  py::gil_scoped_release nogil;
  pf::PythonTurn::Pause pause;  // a Python call waiting: others may run
  if (mainThread) {
    torchrpc::common::spinThenWait(*future, [this] { waitRunningSignalHandlers(*future); });
  } else {
    torchrpc::common::spinThenWait(*future);
  }
}

void Call::callbacksComing() const {
  if (!settling) return;
  int state = kNone;
  if (settling->callbacks.compare_exchange_strong(state, kAdded) || state != kCompleting) return;
  // Bounded: the runner is inside markCompleted, which marks the future
  // done before it runs the (native) callbacks.
  py::gil_scoped_release nogil;
  settling->target->wait();
}

namespace {

// The completion callback's own reference to a call's settling state, on the
// I/O thread. The last one frees the Python future with it (Python let go of
// the call first): that future goes as common::release says. Not deferred
// otherwise: the future's value (RRefs too) must go when Python's does.
void letGoOf(std::shared_ptr<Call::Settling>& s) {
  if (s.use_count() == 1 && s->target) {
    auto target = std::move(s->target);
    s.reset();
    torchrpc::common::release(target);
    return;
  }
  s.reset();
}

}  // namespace

void Call::addDoneCallback(std::shared_ptr<pf::CallbackRunner> runner, py::object fn, const py::object& target,
                           py::object release, bool callbacksAdded) {
  auto callback = pf::sharedPyObject(std::move(fn));
  if (!settling) settling = std::make_shared<Settling>();
  std::shared_ptr<py::object> references;
  if (!target.is_none()) {
    settling->target = py::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(target)->fut;
    references = pf::sharedPyObject(std::move(release));
  }
  if (callbacksAdded) settling->callbacks.store(kAdded);
  // Mutable: the Python objects move on to the runner, so their last
  // reference is never dropped here, on the I/O thread, which must not wait
  // for the GIL (nor is the settling state's, letGoOf).
  future->addCallback([runner, callback = std::move(callback), s = settling,
                       references = std::move(references)](c10::ivalue::Future& done) mutable {
    if (s->claimed.exchange(true)) {
      runner->discard(std::move(callback));
      if (references) runner->discard(std::move(references));
      letGoOf(s);
    } else if (s->target && !done.hasError() && !torchrpc::jit_ops::containsRRef(done.constValue())) {
      // A future with Python callbacks is completed on the Python lane, under
      // the GIL (Python cannot add more while they start). One whose first
      // callback comes after this post is completed under the GIL where it
      // is: handed over to the Python lane, it would never complete if a
      // callback there waited for it (that callback's own thread).
      const bool python = s->callbacks.load() != kNone;
      auto task = [s = std::move(s), value = done.constValue()]() mutable {
        if (s->settled.exchange(true)) return;
        int state = kNone;
        if (s->callbacks.compare_exchange_strong(state, kCompleting)) {
          s->target->markCompleted(std::move(value));
          return;
        }
        pf::Gil gil;
        s->target->markCompleted(std::move(value));
      };
      runner->post(std::move(task), std::move(callback), std::move(references), python);
    } else {
      if (references) runner->discard(std::move(references));  // before the post: freed with its batch
      runner->post(std::move(callback));
      letGoOf(s);
    }
  });
}

namespace {
constexpr const char* kMessageCapsule = "torchrpc.Message";
}  // namespace

py::capsule messageCapsule(Message&& m) {
  auto* held = new std::optional<Message>(std::move(m));
  return py::capsule(held, kMessageCapsule, [](PyObject* o) {
    delete static_cast<std::optional<Message>*>(PyCapsule_GetPointer(o, kMessageCapsule));
  });
}

Message takeMessage(const py::capsule& capsule) {
  auto* held = static_cast<std::optional<Message>*>(PyCapsule_GetPointer(capsule.ptr(), kMessageCapsule));
  if (held == nullptr) {
    PyErr_Clear();
    throw py::type_error("expected a call message built by torchrpc");
  }
  TORCH_CHECK(held->has_value(), "this call message was sent already");
  Message m = std::move(**held);
  held->reset();
  return m;
}

// A small send that will not wait keeps the GIL: released for a few
// microseconds on every call, it went to the completion thread each time, and
// the caller then waited for it.
bool sendMayWait(const Agent& agent, int dst, const Message& m) {
  constexpr uint64_t kSmall = 1u << 20;
  uint64_t bytes = m.payload.size();
  for (const auto& t : m.tensors) bytes += torchrpc::message::layout::wireBytes(t);
  return bytes > kSmall || !agent.sendsAtOnce(dst, bytes);
}

}  // namespace torchrpc::bindings
