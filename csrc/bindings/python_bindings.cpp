// The only pybind11 module: glue between torchrpc/*.py and the C++ core.
// No logic lives here beyond converting values and releasing the GIL around
// every blocking call. C++ errors become Python exceptions in one place
// (translateErrors); tests reach internals through tests/csrc/, not here.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <variant>
#include <tuple>

#include "agent/agent.h"
#include "autograd/context.h"
#include "autograd/engine.h"
#include "bindings/torch_backend_bindings.h"
#include "common/error.h"
#include "common/spin.h"
#include "jit_ops/script_rref.h"
#include "message/receive_buffers.h"
#include "message/tensor_layout.h"
#include "optim/optimizer.h"
#include "profiling/profiler.h"
#include "python_fallback/call_messages.h"
#include "python_fallback/callback_runner.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_rref.h"
#include "python_fallback/python_turn.h"
#include "python_fallback/run_python.h"
#include "rendezvous/rendezvous.h"
#include "rref/rref_context.h"
#include "transport/loop.h"
#include "transport/same_host.h"
#include "worker/worker.h"

namespace py = pybind11;
using torchrpc::agent::Agent;
using torchrpc::message::Message;
namespace rref = torchrpc::rref;
namespace pf = torchrpc::python_fallback;

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

// An error as Python sees it: (kind, message, remote_type, remote_traceback);
// torchrpc.errors.from_native turns it into an exception.
py::tuple errorTuple(const std::exception_ptr& error) {
  auto parts = torchrpc::common::errorParts(error);
  return py::make_tuple(static_cast<int>(parts.kind), parts.message, parts.remoteType, parts.remoteTraceback);
}

// An IValue as a Python object, with TorchScript RRef objects (also inside
// tuples, lists and dicts) as torchrpc.RRef. Needs the GIL.
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

// (True, value) or (False, error tuple) of a completed future. Needs the GIL.
py::tuple outcome(const c10::ivalue::Future& future) {
  if (future.hasError()) return py::make_tuple(false, errorTuple(future.exception_ptr()));
  return py::make_tuple(true, pyValue(future.constValue()));
}

// A call in flight, as Python sees it.
struct Call {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  // Who settles an rpc_async future: a thread that waits for it
  // (claimAndWait), or, when the call completes first, the callback runner.
  // Made by addDoneCallback: rpc_sync's calls never need it.
  std::shared_ptr<std::atomic<bool>> claimed;

  // Returns once the call is done: polls, then sleeps, without the GIL.
  void wait() const {
    if (future->completed()) return;  // completion callbacks find it done: they keep the GIL
    py::gil_scoped_release nogil;
    pf::PythonTurn::Pause pause;  // a Python call waiting: others may run
    torchrpc::common::spinThenWait(*future);
  }

  py::tuple result() const {
    wait();
    return outcome(*future);
  }

  // True if this thread claimed the call before it completed; then returns
  // once it is done (see wait()). False if the runner claimed it.
  bool claimAndWait() const {
    if (claimed && claimed->exchange(true)) return false;
    wait();
    return true;
  }

  // fn() runs on the runner's thread, under the GIL, once the call is done,
  // unless a waiting thread claimed the call first (claimAndWait).
  void addDoneCallback(std::shared_ptr<pf::CallbackRunner> runner, py::object fn) {
    auto callback = pf::sharedPyObject(std::move(fn));
    if (!claimed) claimed = std::make_shared<std::atomic<bool>>(false);
    future->addCallback([runner, callback, claimed = claimed](c10::ivalue::Future&) {
      if (claimed->exchange(true)) {
        runner->discard(callback);
      } else {
        runner->post(callback);
      }
    });
  }
};

// A call message built by the caller, sent once (Agent.send or RRefContext.remote).
struct OutgoingMessage {
  std::optional<Message> message;

  Message take() {
    TORCH_CHECK(message, "this call message was sent already");
    Message m = std::move(*message);
    message.reset();
    return m;
  }
};

// A small send that will not wait keeps the GIL: released for a few
// microseconds on every call, it went to the completion thread each time, and
// the caller then waited for it.
bool sendMayWait(const Agent& agent, int dst, const Message& m) {
  constexpr uint64_t kSmall = 1u << 20;
  uint64_t bytes = m.payload.size();
  for (const auto& t : m.tensors) bytes += torchrpc::message::layout::wireBytes(t);
  return bytes > kSmall || !agent.sendsAtOnce(dst, bytes);
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
  return Call{std::move(future)};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchrpc native core (internal; use the torchrpc package)";
  py::register_local_exception_translator(translateErrors);
  torchrpc::bindings::registerTorchBackend(m);  // the TORCHRPC backend (torch_backend_bindings.cpp)

  py::class_<Call>(m, "Call")
      .def("result", &Call::result)
      .def("claim_and_wait", &Call::claimAndWait)
      .def("done", [](const Call& c) { return c.future->completed(); })
      .def("add_done_callback", &Call::addDoneCallback);

  py::class_<pf::CallbackRunner, std::shared_ptr<pf::CallbackRunner>>(m, "CallbackRunner")
      .def(py::init<>())
      .def("stop", &pf::CallbackRunner::stop, py::arg("timeout") = 10.0, py::call_guard<py::gil_scoped_release>());

  m.def("set_future_error", &pf::setFutureError);
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
             py::gil_scoped_release nogil;  // the rendezvous waits for the whole job
             return std::make_shared<torchrpc::worker::Worker>(o, std::move(s), [hook](Agent& a, rref::RRefContext& c) {
               py::gil_scoped_acquire gil;
               (*hook)(a.shared_from_this(), c.shared_from_this());
             });
           }),
           py::arg("options"), py::arg("store"), py::arg("before_serving"))
      .def_property_readonly("agent", [](const torchrpc::worker::Worker& w) { return w.agentPtr(); })
      .def_property_readonly("rrefs", [](const torchrpc::worker::Worker& w) { return w.rrefs(); })
      // (None or the error tuple of why the graceful part failed, leaked owner RRefs)
      .def("stop", [](torchrpc::worker::Worker& w, bool graceful, double timeout) {
        torchrpc::worker::Worker::StopReport report;
        {
          py::gil_scoped_release nogil;
          report = w.stop(graceful, timeout);
        }
        py::object failure = report.failure ? py::object(errorTuple(report.failure)) : py::none();
        return py::make_tuple(failure, py::cast(report.leaked));
      });

  // Call messages, built once by the caller, then sent (Agent.send) or made a
  // remote() (RRefContext.remote).
  py::class_<OutgoingMessage>(m, "Message");
  m.def("script_message", [](const std::string& name, const std::string& moduleHint, py::handle fn,
                             const py::tuple& args, const py::dict& kwargs, const py::object& shipped,
                             bool asyncExecution) {
    return OutgoingMessage{pf::scriptCallMessage(name, moduleHint, fn, args, kwargs, shipped, asyncExecution)};
  });
  m.def("named_message", [](const std::string& name, const py::tuple& args, const py::dict& kwargs,
                            const std::string& kind) {
    return OutgoingMessage{pf::namedCallMessage(name, args, kwargs, kind)};
  });
  // (message, the overload's schema name)
  m.def("builtin_message", [](const std::string& opName, const py::tuple& args, const py::dict& kwargs) {
    std::string schemaName;
    OutgoingMessage out{pf::builtinCallMessage(opName, args, kwargs, &schemaName)};
    return py::make_tuple(py::cast(std::move(out)), schemaName);
  });
  m.def("python_message", [](const py::bytes& payload, std::vector<at::Tensor> tensors) {
    return OutgoingMessage{pf::pythonCallMessage(payload, std::move(tensors))};
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
           [](Agent& a, py::object call, py::object remote) {
             pf::installPythonHandler(a, std::move(call), std::move(remote));
           })
      .def("set_script_resolver", [](Agent& a, py::object fn) { pf::installScriptResolver(a, std::move(fn)); })
      .def("register_script",
           [](Agent& a, const std::string& name, py::handle fn) { a.registry().add(name, pf::calleeFromPython(fn)); })
      .def("send",
           [](Agent& a, int dst, OutgoingMessage& msg, double timeout, const std::string& kind,
              const std::string& function) { return send(a, dst, msg.take(), timeout, kind, function); })
      .def("start_serving", &Agent::startServing)
      .def("wait_pending", &Agent::waitPending, py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &Agent::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("pending_count", &Agent::pendingCount)
      .def("connection_count", &Agent::connectionCount)
      .def("script_names", [](Agent& a) { return a.registry().names(); });

  // RRefs. Handles are shared by Python RRef objects; the protocol lives in
  // csrc/rref/ (see rref_context.h).
  py::class_<rref::RRef, std::shared_ptr<rref::RRef>>(m, "RRefHandle")
      .def("is_owner", &rref::RRef::isOwner)
      .def("owner", &rref::RRef::owner)
      .def("id", [](const rref::RRef& r) { return r.id().str(); })
      .def("fork_id",
           [](const rref::RRef& r) -> py::object {
             if (r.isOwner()) return py::none();
             return py::str(static_cast<const rref::UserRRef&>(r).forkId().str());
           })
      .def("confirmed", &rref::RRef::confirmedByOwner)
      // A user whose one USER_DELETE was sent (dropped, or released at shutdown).
      .def("deleted",
           [](const rref::RRef& r) { return !r.isOwner() && static_cast<const rref::UserRRef&>(r).deleted(); })
      // A Call that completes once the value exists (or failed to).
      .def("creation",
           [](const rref::RRef& r) {
             if (r.isOwner()) return Call{static_cast<const rref::OwnerRRef&>(r).value(), nullptr};
             return Call{static_cast<const rref::UserRRef&>(r).creation(), nullptr};
           })
      .def("creation_error",
           [](const rref::RRef& r) -> py::object {
             if (r.isOwner()) return py::none();
             auto e = static_cast<const rref::UserRRef&>(r).creationError();
             if (!e) return py::none();
             return py::make_tuple(e->first, e->second, "", "");
           })
      // remote()'s call, as a torch.futures.Future (None for an RRef not made by remote() here).
      .def("creation_future",
           [](const rref::RRef& r) -> py::object {
             if (!r.creation()) return py::none();
             return torch::jit::toPyObject(c10::IValue(r.creation()));
           })
      // Owner only: (True, value) once the value exists, or (False, error tuple).
      .def("local_value",
           [](const rref::RRef& r, double timeout) -> py::tuple {
             TORCH_CHECK(r.isOwner(), "local_value() of a user RRef");
             const auto& owner = static_cast<const rref::OwnerRRef&>(r);
             if (!owner.value()->completed()) {
               bool late;
               {
                 py::gil_scoped_release nogil;
                 pf::PythonTurn::Pause pause;
                 late = !owner.waitValue(timeout);
               }
               if (late) {
                 return py::make_tuple(false, py::make_tuple(static_cast<int>(torchrpc::common::ErrorKind::kTimeout),
                                                             "the value of RRef " + r.id().str() +
                                                                 " was not created within " + std::to_string(timeout) +
                                                                 " s",
                                                             "", ""));
               }
             }
             return outcome(*owner.value());
           })
      // Owner only: None once the value exists (or failed), else a
      // torch.futures.Future that completes when it does (its value unused).
      .def("pending_value",
           [](const rref::RRef& r) -> py::object {
             TORCH_CHECK(r.isOwner(), "pending_value() of a user RRef");
             const auto& value = static_cast<const rref::OwnerRRef&>(r).value();
             if (value->completed()) return py::none();
             return torch::jit::toPyObject(c10::IValue(value));
           })
      // The TorchScript object (torch.classes.torchrpc.RRef) of this RRef.
      .def("script_object", [](const std::shared_ptr<rref::RRef>& r) {
        return torch::jit::toPyObject(torchrpc::jit_ops::scriptRRef(r));
      });

  // The RRef of a TorchScript RRef object (a torch.ScriptObject), or None.
  m.def("rref_of_script_object", [](const py::handle& obj) -> std::shared_ptr<rref::RRef> {
    if (!py::isinstance<torch::jit::Object>(obj)) return nullptr;
    return torchrpc::jit_ops::rrefOf(py::cast<torch::jit::Object>(obj)._ivalue());
  });

  py::class_<rref::RRefContext, std::shared_ptr<rref::RRefContext>>(m, "RRefContext")
      .def(py::init([](std::shared_ptr<Agent> agent, py::object encoder, py::object methodRunner) {
        auto ctx = rref::RRefContext::create(std::move(agent));
        pf::installRRefPython(*ctx, std::move(encoder), std::move(methodRunner));
        return ctx;
      }))
      .def("install_python",
           [](rref::RRefContext& c, py::object encoder, py::object methodRunner) {
             pf::installRRefPython(c, std::move(encoder), std::move(methodRunner));
           })
      .def("create_owner",
           [](rref::RRefContext& c, py::object value) -> std::shared_ptr<rref::RRef> {
             // A plain tensor is kept as a tensor (the same object comes back),
             // so TorchScript can fetch it too; anything else as a Python object.
             if (THPVariable_CheckExact(value.ptr())) {
               const auto& t = THPVariable_Unpack(value.ptr());
               if (!t.requires_grad()) return c.createOwner(c10::IValue(t));
             }
             return c.createOwner(pf::pyObjectIValue(std::move(value)));
           })
      .def("remote",
           [](rref::RRefContext& c, int dst, OutgoingMessage& msg, double timeout, const std::string& function) {
             Message call = msg.take();
             py::gil_scoped_release nogil;
             return c.remote(dst, std::move(call), timeout, function);
           })
      .def("fetch",
           [](rref::RRefContext& c, const std::shared_ptr<rref::RRef>& r, double timeout) {
             TORCH_CHECK(!r->isOwner(), "fetch() of an owner RRef");
             auto user = std::static_pointer_cast<rref::UserRRef>(r);
             py::gil_scoped_release nogil;
             return Call{c.fetch(user, timeout)};
           })
      // rref.rpc_sync().name(*args, **kwargs) with plain arguments
      // (python_fallback::plainIValue); None when one is not (the caller
      // then pickles the call).
      .def("method_call",
           [](rref::RRefContext& c, const std::shared_ptr<rref::RRef>& r, const std::string& name,
              const py::tuple& args, const py::dict& kwargs, double timeout,
              const std::string& kind) -> std::optional<Call> {
             auto msg = pf::methodCallMessage(r->id(), name, args, kwargs);
             if (!msg) return std::nullopt;
             std::optional<py::gil_scoped_release> nogil;
             if (sendMayWait(c.agent(), r->owner(), *msg)) nogil.emplace();
             auto future = c.methodCall(r, std::move(*msg), name, timeout, kind);
             if (auto refused = torchrpc::agent::refusedBeforeSending(future)) std::rethrow_exception(refused);
             return Call{std::move(future)};
           })
      .def(
          "fork",
          [](rref::RRefContext& c, const std::shared_ptr<rref::RRef>& r, int requestTo) {
            return py::tuple(py::cast(c.fork(r, requestTo).toInts()));
          },
          py::arg("rref"), py::arg("request_to") = -1)
      .def("release_when_answered",
           [](rref::RRefContext& c, const Call& call, const std::vector<std::vector<int64_t>>& forks) {
             std::vector<rref::ForkData> data;
             for (const auto& t : forks) data.push_back(rref::ForkData::fromInts(t));
             py::gil_scoped_release nogil;
             c.releaseWhenAnswered(call.future, data);
           })
      .def("receive",
           [](rref::RRefContext& c, const std::vector<int64_t>& t) {
             auto f = rref::ForkData::fromInts(t);
             py::gil_scoped_release nogil;
             return c.receive(f);
           })
      .def("cancel_fork",
           [](rref::RRefContext& c, const std::vector<int64_t>& t) {
             auto f = rref::ForkData::fromInts(t);
             py::gil_scoped_release nogil;
             c.cancelFork(f);
           })
      .def("release_all_users", &rref::RRefContext::releaseAllUsers, py::call_guard<py::gil_scoped_release>())
      .def("wait_idle", &rref::RRefContext::waitIdle, py::call_guard<py::gil_scoped_release>())
      .def("stop", &rref::RRefContext::stop, py::call_guard<py::gil_scoped_release>())
      .def("snapshot", [](const rref::RRefContext& c) {
        auto s = c.snapshot();
        py::dict d;
        d["owners"] = py::cast(s.owners);
        d["owner_objects"] = s.localOwners;
        d["users"] = py::cast(s.users);
        d["pending_users"] = s.pendingUsers;
        d["pending_children"] = s.pendingChildren;
        d["in_flight"] = s.inFlight;
        return d;
      });

  // Distributed autograd (torchrpc/autograd.py).
  namespace ag = torchrpc::autograd;
  m.def("autograd_new_context", [] { return ag::Container::get().create()->id(); });
  m.def("autograd_current_context", [] { return ag::Container::currentId(); });
  m.def("autograd_release_context", &ag::releaseContext, py::call_guard<py::gil_scoped_release>());
  m.def("autograd_backward", [](Agent& a, int64_t id, std::vector<at::Tensor> roots, bool retainGraph) {
    py::gil_scoped_release nogil;
    return Call{ag::backward(a, id, roots, retainGraph)};
  });
  m.def("autograd_gradients", [](const Agent& a, int64_t id) {
    return ag::Container::get().retrieve(id, a.options().name)->gradients();
  });
  m.def("autograd_live_contexts", [] { return ag::Container::get().liveIds(); });

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
    d["backwards_ended_by_reports"] = byReports;
    d["backwards_ended_by_responses"] = byResponses;
    return d;
  });
}
