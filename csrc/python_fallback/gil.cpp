#include "python_fallback/gil.h"

#include <atomic>
#include <mutex>
#include <vector>

namespace py = pybind11;

namespace torchrpc::python_fallback {

namespace {

std::atomic<size_t> keptCount{0};  // made by ThreadState and not deleted yet
std::mutex graveyardMutex;
std::vector<PyThreadState*>& graveyard() {
  static auto* states = new std::vector<PyThreadState*>();  // never destroyed: threads exit late
  return *states;
}

// One per thread, made by the thread's first Gil.
struct ThreadState {
  PyThreadState* state = nullptr;

  ThreadState() {
    if (PyGILState_GetThisThreadState() != nullptr) return;  // the thread has one already
    py::gil_scoped_acquire gil;
    gil.inc_ref();  // the acquire made the state; this keeps it past the release
    state = PyThreadState_Get();
    keptCount.fetch_add(1);
  }

  ~ThreadState() {
    if (state == nullptr) return;
    std::lock_guard<std::mutex> lock(graveyardMutex);
    graveyard().push_back(state);
  }
};

}  // namespace

void keepThreadState() { thread_local ThreadState kept; }

Gil::Gil() : outermost_(PyGILState_Check() == 0) {
  if (outermost_ && PyErr_Occurred() != nullptr) PyErr_Clear();  // left by an earlier scope
}

Gil::~Gil() {
  if (outermost_ && PyErr_Occurred() != nullptr) PyErr_Clear();  // nobody above us to handle it
}

void reapThreadStates() {
  std::vector<PyThreadState*> states;
  {
    std::lock_guard<std::mutex> lock(graveyardMutex);
    states.swap(graveyard());
  }
  for (PyThreadState* state : states) {
    PyThreadState_Clear(state);
    PyThreadState_Delete(state);
  }
  keptCount.fetch_sub(states.size());
}

size_t keptThreadStates() { return keptCount.load(); }

}  // namespace torchrpc::python_fallback
