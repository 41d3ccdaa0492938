// Distributed autograd (torchrpc/autograd.py): contexts, the backward pass,
// and what a context recorded.

#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "autograd/context.h"
#include "autograd/engine.h"
#include "bindings/glue.h"

namespace torchrpc::bindings {

namespace ag = torchrpc::autograd;

void bindAutograd(py::module_& m) {
  m.def("autograd_new_context", [] { return ag::Container::get().create()->id(); });
  m.def("autograd_current_context", [] { return ag::Container::currentId(); });
  m.def("autograd_release_context", &ag::releaseContext, py::call_guard<py::gil_scoped_release>());
  // Returns the call done (the calling thread ran its part of the pass).
  m.def("autograd_backward", [](Agent& a, int64_t id, std::vector<at::Tensor> roots, bool retainGraph) {
    auto onSleep = signalHandlerRunner();
    py::gil_scoped_release nogil;
    pf::PythonTurn::Pause pause;  // a Python call waiting: others may run
    return Call{ag::backward(a, id, roots, retainGraph, onSleep)};
  });
  m.def("autograd_gradients", [](const Agent& a, int64_t id) {
    return ag::Container::get().retrieve(id, a.options().name)->gradients();
  });
  // (send functions {id: node}, receive functions {id: node}, known worker
  // ranks) of a context; RuntimeError naming the worker if it is unknown.
  m.def("autograd_context_graph", [](const Agent& a, int64_t id) {
    auto g = ag::Container::get().retrieve(id, a.options().name)->graph();
    auto nodes = [](const auto& list) {
      py::dict d;
      for (const auto& [nodeId, node] : list) {
        d[py::int_(nodeId)] = py::reinterpret_steal<py::object>(torch::autograd::functionToPyObject(node));
      }
      return d;
    };
    return py::make_tuple(nodes(g.sends), nodes(g.recvs), py::cast(g.knownWorkers));
  });
  m.def("autograd_live_contexts", [] { return ag::Container::get().liveIds(); });
}

}  // namespace torchrpc::bindings
