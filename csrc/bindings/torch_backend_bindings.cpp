// TorchBackendAgent: the TORCHRPC backend's agent (torch_backend/torch_agent.h)
// for torchrpc/torch_backend.py. It subclasses upstream's RpcAgent Python
// type, so upstream's _set_and_start_rpc_agent and the rest of
// torch.distributed.rpc take it as their agent, and its methods (join,
// shutdown, get_worker_infos, ...) are upstream's bindings. Upstream's request
// callback (RequestCallbackImpl) lives in libtorch_python, which is why the
// agent gets it here and libtorchrpc stays free of Python.

#include "bindings/glue.h"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/rpc/python_rpc_handler.h>
#include <torch/csrc/distributed/rpc/request_callback_impl.h>
#include <torch/csrc/utils/pybind.h>

#include "python_fallback/gil.h"
#include "python_fallback/python_turn.h"
#include "torch_backend/torch_agent.h"

namespace torchrpc::bindings {

using torchrpc::torch_backend::SyncWait;
using torchrpc::torch_backend::TorchAgent;

void bindTorchBackend(py::module_& m) {
  py::module::import("torch.distributed.rpc");  // registers upstream's RpcAgent type
  py::class_<TorchAgent, torch::distributed::rpc::RpcAgent, std::shared_ptr<TorchAgent>>(
      m, "TorchBackendAgent", "torch.distributed.rpc's agent on torchrpc's transport (the TORCHRPC backend)")
      .def(py::init([](const py::object& store, const agent::AgentOptions& options) {
             auto s = py::cast<c10::intrusive_ptr<c10d::Store>>(store);
             auto callback = std::make_unique<torch::distributed::rpc::RequestCallbackImpl>();
             python_fallback::reapThreadStates();  // an earlier agent's pool threads (it holds the GIL)
             py::gil_scoped_release nogil;  // the rendezvous waits for every worker
             torchrpc::torch_backend::PythonHooks python{
                 &python_fallback::keepThreadState,
                 [](const std::function<void()>& request) {
                   python_fallback::PythonTurn turn(python_fallback::PythonTurn::When::kAlways);
                   request();
                 },
                 &python_fallback::PythonTurn::giveUp,
                 [](const std::string& name) -> std::shared_ptr<script_dispatch::Callee> {
                   // Where upstream's SCRIPT_CALL finds it (request_callback_impl.cpp runJitFunction).
                   auto cu = torch::distributed::rpc::PythonRpcHandler::getInstance().jitCompilationUnit();
                   torch::jit::Function* fn = cu->find_function(c10::QualifiedName(name));
                   return fn == nullptr ? nullptr : script_dispatch::scriptFunctionCallee(std::move(cu), fn);
                 }};
             return std::make_shared<TorchAgent>(std::move(s), options, std::move(callback), std::move(python));
           }),
           py::arg("store"), py::arg("options"))
      // Upstream binds get_worker_info(id) on its TensorPipe agent only; a
      // method of that name here hides the base's, so all three are here.
      .def("get_worker_info", py::overload_cast<>(&TorchAgent::getWorkerInfo, py::const_),
           py::return_value_policy::reference_internal)
      .def("get_worker_info", py::overload_cast<const std::string&>(&TorchAgent::getWorkerInfo, py::const_),
           py::return_value_policy::reference_internal)
      .def("get_worker_info",
           py::overload_cast<torch::distributed::rpc::worker_id_t>(&TorchAgent::getWorkerInfo, py::const_),
           py::return_value_policy::reference_internal)
      .def_property_readonly("is_static_group", &TorchAgent::isStaticGroup)
      .def("_pending_requests", [](const TorchAgent& a) { return a.torchrpcAgent()->pendingCount(); });

  // torchrpc/torch_backend.py's rpc_sync: made just before upstream sends the call.
  py::class_<SyncWait>(m, "TorchBackendSyncWait", "an rpc_sync that its caller waits for itself")
      .def(py::init<TorchAgent&>(), py::arg("agent"))
      .def("wait",
           [](SyncWait& w) {
             auto onSleep = signalHandlerRunner();
             py::gil_scoped_release nogil;  // upstream's send gave up the thread's Python turn
             w.wait(onSleep);
           })
      .def("close", &SyncWait::close);
}

}  // namespace torchrpc::bindings
