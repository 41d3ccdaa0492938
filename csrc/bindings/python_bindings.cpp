// The pybind11 module: glue between torchrpc/*.py and the C++ core. The
// RRef and autograd bindings live beside it (rref_bindings.cpp,
// autograd_bindings.cpp; what they share in glue.h). No logic lives here beyond converting values and releasing the GIL around
// every blocking call. C++ errors become Python exceptions in one place
// (translateErrors); tests reach internals through tests/csrc/, not here.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <variant>
#include <tuple>

#include "agent/agent.h"
#include "autograd/engine.h"
#include "bindings/glue.h"
#include "common/error.h"
#include "common/wait_policy.h"
#include "message/pickle_check.h"
#include "message/receive_buffers.h"
#include "optim/optimizer.h"
#include "profiling/profiler.h"
#include "script_dispatch/exported_program.h"
#include "python_fallback/call_messages.h"
#include "python_fallback/run_python.h"
#include "transport/loop.h"
#include "transport/same_host.h"
#include "worker/worker.h"

namespace rref = torchrpc::rref;
namespace ag = torchrpc::autograd;
using namespace torchrpc::bindings;  // glue.h: Call, messageCapsule, errorTuple, ...

namespace {

// The one translation of C++ errors into Python exceptions, without a C++
// backtrace: c10's ValueError and TypeError, and a call refused before it was
// sent, as themselves; any other c10::Error as RuntimeError.
void translateErrors(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const torchrpc::common::RpcError& e) {
    if (e.kind() == torchrpc::common::ErrorKind::kInvalidArgument) {
      PyErr_SetString(PyExc_ValueError, e.message().c_str());
    } else {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

// RpcOptions' callee policy: (script_only, allowed_callables or None,
// allow_import_by_name, allow_shipped_code).
torchrpc::script_dispatch::CalleePolicy calleePolicy(
    const std::tuple<bool, std::optional<std::vector<std::string>>, bool, bool>& options) {
  const auto& [scriptOnly, allowed, importByName, shippedCode] = options;
  torchrpc::script_dispatch::CalleePolicy p;
  p.scriptOnly = scriptOnly;
  if (allowed) p.allowedCallables.emplace(allowed->begin(), allowed->end());
  p.importByName = importByName;
  p.shippedCode = shippedCode;
  return p;
}

// Sends; a call refused before anything was sent raises (ValueError).
Call send(Agent& agent, int dst, Message&& m, double timeout, const std::string& kind, const std::string& function) {
  std::optional<py::gil_scoped_release> nogil;
  if (sendMayWait(agent, dst, m)) nogil.emplace();
  auto future = agent.send(dst, std::move(m), timeout, kind, function);
  if (auto refused = torchrpc::agent::refusedBeforeSending(future)) std::rethrow_exception(refused);
  return Call(std::move(future));
}

// Runs Python's signal handlers (from a thread without the GIL); a handler
// that raised (Ctrl-C) sets `interrupted`, and the error stays set.
bool checkSignals(bool& interrupted) {
  py::gil_scoped_acquire gil;
  interrupted = interrupted || PyErr_CheckSignals() != 0;
  return interrupted;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  // Threads that hold the GIL drop sent tensors themselves (common/python_held.h).
  torchrpc::common::setGilCheck([] { return PyGILState_Check() != 0; });
  m.doc() = "torchrpc native core (internal; use the torchrpc package)";
  m.def("stop_dropping", [](double seconds) {
    py::gil_scoped_release released;  // the rpc-drop thread may need it to finish its batch
    return torchrpc::common::stopDropping(seconds);
  });
  py::register_local_exception_translator(translateErrors);
  pf::registerFutureErrorTranslator();  // a failed Python future raises a copy of its error
  torchrpc::bindings::bindTorchBackend(m);  // the TORCHRPC backend (torch_backend_bindings.cpp)

  py::class_<Call>(m, "Call")
      .def("result", &Call::result)
      .def("claim_and_wait", &Call::claimAndWait)
      .def("take_settle", &Call::takeSettle)
      .def("unclaim", &Call::unclaim)
      .def("callbacks_coming", &Call::callbacksComing)
      .def("done", [](const Call& c) { return c.future->completed(); })
      .def("add_done_callback", &Call::addDoneCallback);

  py::class_<pf::CallbackRunner, std::shared_ptr<pf::CallbackRunner>>(m, "CallbackRunner")
      .def(py::init<>())
      .def("stop", &pf::CallbackRunner::stop, py::arg("timeout") = 10.0, py::call_guard<py::gil_scoped_release>());

  m.def("set_future_error", &pf::setFutureError);
  m.def("on_callback_thread", &pf::CallbackRunner::onRunnerThread);
  m.def("wait_for_future", &waitForFuture);
  m.def("local_host_id", &torchrpc::worker::localHostId);

  // A connection's limits (transport/connection.h Limits), as RpcOptions names them.
  using torchrpc::transport::Limits;
  py::class_<Limits>(m, "Limits")
      .def_readwrite("max_message_bytes", &Limits::maxFrameBytes)
      .def_readwrite("max_peer_bytes", &Limits::maxPeerBytes)
      .def_readwrite("max_calls_in_flight", &Limits::maxCallsInFlight)
      .def_readwrite("heartbeat_timeout", &Limits::heartbeatSeconds);

  // What a worker is (agent/agent.h AgentOptions), filled by torchrpc.lifecycle.
  py::class_<torchrpc::agent::AgentOptions>(m, "AgentOptions")
      .def(py::init<>())
      .def_readwrite("name", &torchrpc::agent::AgentOptions::name)
      .def_readwrite("rank", &torchrpc::agent::AgentOptions::rank)
      .def_readwrite("world_size", &torchrpc::agent::AgentOptions::worldSize)
      .def_readwrite("num_worker_threads", &torchrpc::agent::AgentOptions::numWorkerThreads)
      .def_readwrite("rpc_timeout", &torchrpc::agent::AgentOptions::defaultTimeoutSeconds)
      .def_readwrite("listen_host", &torchrpc::agent::AgentOptions::listenHost)
      .def_readwrite("host_id", &torchrpc::agent::AgentOptions::hostId)
      .def_readwrite("options_type", &torchrpc::agent::AgentOptions::optionsType)
      .def_readwrite("limits", &torchrpc::agent::AgentOptions::limits)  // a reference: set its fields
      .def_property(
          "secret", [](const torchrpc::agent::AgentOptions& o) { return py::bytes(o.secret); },
          [](torchrpc::agent::AgentOptions& o, const py::bytes& s) { o.secret = std::string(s); })
      // Set from RpcOptions.callee_policy(); read back as (script_only, allowed or None, ...).
      .def_property(
          "callee_policy",
          [](const torchrpc::agent::AgentOptions& o) {
            const auto& p = o.policy;
            std::optional<std::vector<std::string>> allowed;
            if (p.allowedCallables) allowed.emplace(p.allowedCallables->begin(), p.allowedCallables->end());
            return std::make_tuple(p.scriptOnly, allowed, p.importByName, p.shippedCode);
          },
          [](torchrpc::agent::AgentOptions& o,
             const std::tuple<bool, std::optional<std::vector<std::string>>, bool, bool>& policy) {
            o.policy = calleePolicy(policy);
          });

  // The lifecycle (worker/worker.h). before_serving(agent, rref_context)
  // installs the Python handlers and session before the first call is served.
  py::class_<torchrpc::worker::Worker, std::shared_ptr<torchrpc::worker::Worker>>(m, "Worker")
      .def(py::init([](const torchrpc::agent::AgentOptions& o, const py::object& store, py::object beforeServing) {
             auto s = py::cast<c10::intrusive_ptr<c10d::Store>>(store);
             auto hook = pf::sharedPyObject(std::move(beforeServing));
             bool interrupted = false;
             try {
               py::gil_scoped_release nogil;  // the rendezvous waits for the whole job
               return std::make_shared<torchrpc::worker::Worker>(
                   o, std::move(s),
                   [hook](Agent& a, rref::RRefContext& c) {
                     py::gil_scoped_acquire gil;
                     (*hook)(a.shared_from_this(), c.shared_from_this());
                   },
                   [&interrupted] { return checkSignals(interrupted); });
             } catch (...) {
               if (interrupted) throw py::error_already_set();  // Ctrl-C: KeyboardInterrupt
               throw;
             }
           }),
           py::arg("options"), py::arg("store"), py::arg("before_serving"))
      .def_property_readonly("agent", [](const torchrpc::worker::Worker& w) { return w.agentPtr(); })
      .def_property_readonly("rrefs", [](const torchrpc::worker::Worker& w) { return w.rrefs(); })
      // (None or the error tuple of why the graceful part failed, leaked owner RRefs)
      .def("stop", [](torchrpc::worker::Worker& w, bool graceful, double timeout) {
        torchrpc::worker::Worker::StopReport report;
        bool interrupted = false;
        {
          py::gil_scoped_release nogil;
          // A signal's Python handler runs between the polls of the meeting:
          // Ctrl-C (KeyboardInterrupt) ends it, raised once the worker stopped.
          report = w.stop(graceful, timeout, [&interrupted] { return checkSignals(interrupted); });
        }
        if (interrupted) throw py::error_already_set();
        py::object failure = report.failure ? py::object(errorTuple(report.failure)) : py::none();
        return py::make_tuple(failure, py::cast(report.leaked));
      });

  // Call messages, built once by the caller, then sent (Agent.send) or made a
  // remote() (RRefContext.remote).
  m.def("script_message", [](const std::string& name, const std::string& moduleHint, py::handle fn,
                             const py::tuple& args, const py::dict& kwargs, const py::object& shipped,
                             bool asyncExecution) {
    return messageCapsule(pf::scriptCallMessage(name, moduleHint, fn, args, kwargs, shipped, asyncExecution));
  });
  m.def(
      "named_message",
      [](const std::string& name, const py::tuple& args, const py::dict& kwargs, const std::string& kind,
         const py::object& shipped) {
        return messageCapsule(pf::namedCallMessage(name, args, kwargs, kind, shipped));
      },
      py::arg("name"), py::arg("args"), py::arg("kwargs"), py::arg("kind"), py::arg("shipped") = py::none());
  // (message, the overload's schema name)
  m.def("builtin_message", [](const std::string& opName, const py::tuple& args, const py::dict& kwargs) {
    std::string schemaName;
    py::capsule out = messageCapsule(pf::builtinCallMessage(opName, args, kwargs, &schemaName));
    return py::make_tuple(std::move(out), schemaName);
  });
  // "" if a peer's pickle may be unpickled, else what is wrong with it.
  m.def("check_pickle", [](const py::buffer& data) {
    py::buffer_info info = data.request();
    return torchrpc::message::checkPickle(static_cast<const char*>(info.ptr), info.size * info.itemsize);
  });
  m.def("python_message", [](const py::bytes& payload, std::vector<at::Tensor> tensors) {
    return messageCapsule(pf::pythonCallMessage(payload, std::move(tensors)));
  });
  // The call as IValues, or None when an argument needs a pickle.
  m.def("plain_python_message",
        [](const py::bytes& digest, const std::string& name, const py::tuple& args,
           const py::dict& kwargs) -> std::optional<py::capsule> {
          auto message = pf::plainPythonCallMessage(digest, name, args, kwargs);
          if (!message) return std::nullopt;
          return messageCapsule(std::move(*message));
        });

  py::class_<Agent, std::shared_ptr<Agent>>(m, "Agent")
      .def(py::init([](const torchrpc::agent::AgentOptions& o) { return std::make_shared<Agent>(o); }),
           py::arg("options"))
      .def("listen", &Agent::listen)
      // The refusal message of running the Python callable `name` (not in
      // allowed_callables), or None.
      .def("callable_refusal",
           [](const Agent& a, const std::string& name) -> std::optional<std::string> {
             auto refused = a.options().policy.refuseCallable(name, a.options().name);
             if (!refused) return std::nullopt;
             return refused->message;
           })
      // (name, rank, tcp address, unix address, host id) of every member, by
      // rank, once set; a dynamic job's change as workers join and leave.
      .def("peers",
           [](const Agent& a) {
             py::list out;
             for (const auto& p : a.members().list()) {
               out.append(py::make_tuple(p.name, p.rank, p.tcpAddress, p.unixAddress, p.hostId));
             }
             return out;
           })
      // Changes whenever peers() does.
      .def("membership_version", [](const Agent& a) { return a.members().version(); })
      // Why the worker of this rank (int) or name (str) is no member any more
      // ("worker1 (rank 1) left the job ..."), or None.
      .def("departed",
           [](const Agent& a, const std::variant<int, std::string>& who) -> std::optional<std::string> {
             std::string why = std::holds_alternative<int>(who) ? a.members().departed(std::get<int>(who))
                                                                 : a.members().departed(std::get<std::string>(who));
             if (why.empty()) return std::nullopt;
             return why;
           })
      .def("set_peers",
           [](Agent& a, const std::vector<std::tuple<std::string, int, std::string, std::string, std::string>>& peers) {
             std::vector<torchrpc::agent::PeerInfo> out;
             for (const auto& [name, rank, tcp, unixAddr, host] : peers) {
               out.push_back(torchrpc::agent::PeerInfo{name, rank, tcp, unixAddr, host});
             }
             a.setPeers(std::move(out));
           })
      .def("set_python_handler",
           [](Agent& a, py::object call, py::object remote, py::object encoder) {
             pf::installPythonHandler(a, std::move(call), std::move(remote), std::move(encoder));
           })
      .def("set_script_resolver", [](Agent& a, py::object fn) { pf::installScriptResolver(a, std::move(fn)); })
      .def("register_script",
           [](Agent& a, const std::string& name, py::handle fn) { a.registry().add(name, pf::calleeFromPython(fn)); })
      // An AOTInductor package (exported_program.h), with one model instance per pool thread.
      .def("register_exported",
           [](Agent& a, const std::string& name, const std::string& path, const std::string& signature) {
             a.registry().add(name, torchrpc::script_dispatch::exportedProgramCallee(
                                        path, name, a.registry().concurrency(), signature));
           },
           py::call_guard<py::gil_scoped_release>())
      .def("send",
           [](Agent& a, int dst, const py::capsule& msg, double timeout, const std::string& kind,
              const std::string& function) { return send(a, dst, takeMessage(msg), timeout, kind, function); })
      // rpc_sync's send and wait in one native call: Call.result() of the
      // sent message, with no Python object for the call in between.
      .def("call",
           [](Agent& a, int dst, const py::capsule& msg, double timeout, const std::string& kind,
              const std::string& function) { return send(a, dst, takeMessage(msg), timeout, kind, function).result(); })
      .def("start_serving", &Agent::startServing)
      .def("wait_pending", &Agent::waitPending, py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &Agent::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("pending_count", &Agent::pendingCount)
      .def("connection_count", &Agent::connectionCount)
      .def("script_names", [](Agent& a) { return a.registry().names(); });

  torchrpc::bindings::bindRRefs(m);
  torchrpc::bindings::bindAutograd(m);

  // DistributedOptimizer's functional optimizers (torchrpc/optim/).
  m.def("optimizer_register", [](const py::object& optimizer, std::vector<at::Tensor> params) {
    return torchrpc::optim::registerOptimizer(py::cast<torch::jit::Object>(optimizer)._ivalue(), std::move(params));
  });
  m.def("optimizer_unregister", &torchrpc::optim::unregisterOptimizer);

  m.def("reap_thread_states", &pf::reapThreadStates);

  // The process-global profiler (torchrpc/profiler.py): events are torch's ProfilerEvent.
  m.def("profiler_global_start", [](bool recordShapes, bool profileMemory) {
    torchrpc::profiling::startGlobal(
        torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU, recordShapes, profileMemory));
  });
  m.def("profiler_global_stop", &torchrpc::profiling::stopGlobal);

  // Counters of this process's internals, for debugging and tests.
  m.def("debug_counters", [] {
    auto [byReports, byResponses] = ag::backwardEndings();
    py::dict d;
    d["kept_thread_states"] = pf::keptThreadStates();
    d["receive_cache_bytes"] = torchrpc::message::receive_buffers::cachedBytes();
    d["same_host_copied_bytes"] = torchrpc::transport::same_host::copiedBytes();
    d["loop_events_served_by_others"] = torchrpc::transport::Loop::servedByOthers();
    d["polls_withheld"] = torchrpc::common::WaitPolicy::process().withheld();
    d["pool_tasks"] = torchrpc::agent::ThreadPool::tasksQueued();
    d["inline_calls"] = torchrpc::script_dispatch::inlineCalls();
    d["backwards_ended_by_reports"] = byReports;
    d["backwards_ended_by_responses"] = byResponses;
    return d;
  });
}
