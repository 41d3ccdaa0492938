// The only pybind11 module: glue between torchrpc/*.py and the C++ core.
// No logic lives here beyond converting values and releasing the GIL around
// every blocking call.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "agent/agent.h"
#include "agent/core_spread.h"
#include "autograd/autograd_messages.h"
#include "autograd/context.h"
#include "autograd/engine.h"
#include "common/error.h"
#include "common/spin.h"
#include "jit_ops/rpc_ops.h"
#include "jit_ops/script_rref.h"
#include "message/receive_buffers.h"
#include "message/wire.h"
#include "optim/optimizer.h"
#include "python_fallback/callback_runner.h"
#include "python_fallback/gil.h"
#include "python_fallback/python_rref.h"
#include "python_fallback/python_turn.h"
#include "python_fallback/run_python.h"
#include "rendezvous/rendezvous.h"
#include "rref/rref_context.h"
#include "rref/rref_messages.h"
#include "script_dispatch/run_script.h"
#include "transport/loop.h"
#include "transport/same_host.h"
#include "worker/worker.h"

namespace py = pybind11;
using torchrpc::Agent;
namespace rref = torchrpc::rref;

namespace {

// ---- RRefs between TorchScript and Python (script_rref.h) --------------------

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

// A call in flight, as Python sees it. result() gives (True, value) or
// (False, (kind, message, remote_type, remote_traceback)); torchrpc.errors
// turns the latter into an exception.
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
    torchrpc::python_fallback::PythonTurn::Pause pause;  // a Python call waiting: others may run
    torchrpc::spinThenWait(*future);
  }

  py::tuple result() const {
    wait();
    if (!future->hasError()) {
      return py::make_tuple(true, pyValue(future->value()));
    }
    try {
      std::rethrow_exception(future->exception_ptr());
    } catch (const torchrpc::RpcError& e) {
      return py::make_tuple(false, py::make_tuple(static_cast<int>(e.kind()), e.message(),
                                                  e.remoteType(), e.remoteTraceback()));
    } catch (const c10::Error& e) {
      return py::make_tuple(false, py::make_tuple(0, e.what_without_backtrace(), "", ""));
    } catch (const std::exception& e) {
      return py::make_tuple(false, py::make_tuple(0, std::string(e.what()), "", ""));
    }
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
  void addDoneCallback(std::shared_ptr<torchrpc::python_fallback::CallbackRunner> runner, py::object fn) {
    auto callback = torchrpc::python_fallback::sharedPyObject(std::move(fn));
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

// A small send that will not wait keeps the GIL: released for a few
// microseconds on every call, it went to the completion thread each time, and
// the caller then waited for it (rpc_async with 128 in flight: ~25% slower).
bool sendMayWait(const Agent& agent, int dst, const torchrpc::Message& m) {
  constexpr uint64_t kSmall = 1u << 20;
  uint64_t bytes = m.payload.size();
  for (const auto& t : m.tensors) {
    if (t.layout() == c10::kStrided) bytes += t.nbytes();  // others: the wire refuses them, clearly
  }
  return bytes > kSmall || !agent.sendsAtOnce(dst, bytes);
}

Call sendOrRaise(Agent& agent, int dst, torchrpc::Message&& m, double timeout,
                 const std::string& kind, const std::string& function) {
  std::optional<py::gil_scoped_release> nogil;
  if (sendMayWait(agent, dst, m)) nogil.emplace();
  return Call{agent.send(dst, std::move(m), timeout, kind, function)};
}

// Matches Python arguments to a schema; a mismatch is the caller's TypeError,
// naming the function and the argument.
std::vector<c10::IValue> stackFor(const c10::FunctionSchema& schema, const py::tuple& args,
                                  const py::dict& kwargs) {
  try {
    return torch::jit::createStackForSchema(schema, torch::jit::tuple_slice(args),
                                            py::reinterpret_borrow<py::kwargs>(kwargs), std::nullopt);
  } catch (const torch::jit::schema_match_error& e) {
    throw py::type_error("arguments do not match '" + schema.name() + "': " + e.what());
  }
}

// c10 errors of the core as Python exceptions, without a C++ backtrace:
// c10::ValueError and c10::TypeError as themselves, any other c10::Error as
// `Otherwise`. Errors raised while sending (an unsupported tensor, a closed
// agent) are the caller's ValueError.
template <typename Otherwise = std::runtime_error, typename F>
auto pythonErrors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::ValueError& e) {
    throw py::value_error(e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    throw py::type_error(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw Otherwise(e.what_without_backtrace());
  }
}

template <typename F>
Call translated(F&& send) {
  return pythonErrors<py::value_error>(std::forward<F>(send));
}

// remote(): like a call, a message that cannot be sent (a tensor the wire
// refuses, a closed agent) is the caller's ValueError.
std::shared_ptr<torchrpc::rref::RRef> remoteOrRaise(torchrpc::rref::RRefContext& c, int dst, torchrpc::Message&& msg,
                                                    double timeout, const std::string& function) {
  return pythonErrors<py::value_error>([&] {
    py::gil_scoped_release nogil;
    return c.remote(dst, std::move(msg), timeout, function);
  });
}

// What decides which overload of a builtin accepts a call's arguments: each
// argument's Python type (for a tensor, its dtype and whether it has 0
// dimensions or one element: int and number parameters accept some such
// tensors), and the keyword names.
// Empty when an argument is of another kind (a list, a dtype, ...): those
// calls are matched from scratch every time.
std::string argumentKinds(const std::string& opName, const py::tuple& args, const py::dict& kwargs) {
  std::string key = opName;
  auto add = [&key](const py::handle& value) {
    PyObject* obj = value.ptr();
    if (THPVariable_Check(obj)) {
      const auto& t = THPVariable_Unpack(obj);
      key += t.dim() == 0 ? "|T0" : (t.numel() == 1 ? "|T1" : "|T");
      key += c10::toString(t.scalar_type());
    } else if (obj == Py_None || PyBool_Check(obj) || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) ||
               PyUnicode_CheckExact(obj)) {
      key += "|";
      key += Py_TYPE(obj)->tp_name;
    } else {
      return false;
    }
    return true;
  };
  for (const auto& arg : args) {
    if (!add(arg)) return "";
  }
  for (const auto& item : kwargs) {
    key += "|" + py::str(item.first).cast<std::string>() + "=";
    if (!add(item.second)) return "";
  }
  return key;
}

// The first overload of builtin `opName` that accepts the arguments, as a
// BUILTIN_CALL message; sets *full to its schema name. Trying an overload
// that refuses the arguments costs an exception (torch.add(x, 1) took 27 us
// against 9 us for torch.add(x, x)), so the overload found for the same kinds
// of arguments (argumentKinds) is remembered and tried alone.
torchrpc::Message builtinMessage(const std::string& opName, const py::tuple& args, const py::dict& kwargs,
                                 std::string* full) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<torch::jit::Operator>> matched;
  auto tryOverload = [&](const torch::jit::Operator& op, std::string* errors) -> std::optional<torchrpc::Message> {
    const auto& schema = op.schema();
    std::vector<c10::IValue> stack;
    try {
      stack = torch::jit::createStackForSchema(schema, torch::jit::tuple_slice(args),
                                               py::reinterpret_borrow<py::kwargs>(kwargs), std::nullopt);
    } catch (const std::exception& e) {
      if (errors != nullptr) *errors += "\n  " + c10::toString(schema) + ": " + e.what();
      return std::nullopt;
    }
    *full = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    return torchrpc::script_dispatch::builtinCallMessage(*full, std::move(stack));
  };
  const std::string key = argumentKinds(opName, args, kwargs);
  std::shared_ptr<torch::jit::Operator> known;
  if (!key.empty()) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = matched.find(key);
    if (it != matched.end()) known = it->second;
  }
  if (known) {
    if (auto message = tryOverload(*known, nullptr)) return std::move(*message);
  }
  std::string errors;
  for (const auto& op : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(opName))) {
    if (auto message = tryOverload(*op, &errors)) {
      if (!key.empty()) {
        std::lock_guard<std::mutex> lock(mutex);
        matched[key] = op;
      }
      return std::move(*message);
    }
  }
  throw py::type_error("no overload of builtin '" + opName +
                       "' accepts these arguments; the candidates said:" + errors);
}

// `shipped`: None, or the (format, sha1, code) of shipped_code.h.
torchrpc::Message scriptMessage(const std::string& name, const std::string& moduleHint, py::handle fn,
                                const py::tuple& args, const py::dict& kwargs,
                                const py::object& shipped = py::none()) {
  auto f = py::cast<torch::jit::StrongFunctionPtr>(fn);
  auto stack = stackFor(f.function_->getSchema(), args, kwargs);
  c10::IValue code = shipped.is_none() ? c10::IValue() : torch::jit::toIValue(shipped, c10::AnyType::get());
  return torchrpc::script_dispatch::scriptCallMessage(
      name, moduleHint, std::move(stack), c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()),
      std::move(code));
}

torchrpc::Message pythonMessage(py::bytes payload, std::vector<at::Tensor> tensors) {
  torchrpc::Message msg;
  msg.type = torchrpc::MessageType::kPythonCall;
  msg.payload = std::string(payload);
  msg.tensors = std::move(tensors);
  return msg;
}

// (ok, value) or (ok=False, (kind, message, remote_type, remote_traceback)),
// like Call.result(), for an error kept as an exception_ptr.
py::tuple errorTuple(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const torchrpc::RpcError& e) {
    return py::make_tuple(false, py::make_tuple(static_cast<int>(e.kind()), e.message(), e.remoteType(),
                                                e.remoteTraceback()));
  } catch (const c10::Error& e) {
    return py::make_tuple(false, py::make_tuple(0, e.what_without_backtrace(), "", ""));
  } catch (const std::exception& e) {
    return py::make_tuple(false, py::make_tuple(0, std::string(e.what()), "", ""));
  }
}


}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchrpc native core (internal; use the torchrpc package)";

  py::class_<Call>(m, "Call")
      .def("result", &Call::result)
      .def("claim_and_wait", &Call::claimAndWait)
      .def("done", [](const Call& c) { return c.future->completed(); })
      .def("add_done_callback", &Call::addDoneCallback);

  py::class_<torchrpc::python_fallback::CallbackRunner,
             std::shared_ptr<torchrpc::python_fallback::CallbackRunner>>(m, "CallbackRunner")
      .def(py::init<>())
      .def("stop", &torchrpc::python_fallback::CallbackRunner::stop, py::arg("timeout") = 10.0,
           py::call_guard<py::gil_scoped_release>());

  m.def("local_host_id", &torchrpc::localHostId);

  // Records are (name, rank, tcp address, unix address, host id) tuples.
  py::class_<torchrpc::Rendezvous>(m, "Rendezvous")
      .def(py::init([](py::object store, int rank, int worldSize) {
             auto s = py::cast<c10::intrusive_ptr<c10d::Store>>(store);
             py::gil_scoped_release nogil;
             return std::make_unique<torchrpc::Rendezvous>(std::move(s), rank, worldSize);
           }),
           py::arg("store"), py::arg("rank"), py::arg("world_size"))
      .def("exchange",
           [](torchrpc::Rendezvous& r, const std::tuple<std::string, int, std::string, std::string, std::string>& me) {
             const auto& [name, rank, tcp, unixAddr, host] = me;
             std::vector<torchrpc::PeerInfo> peers;
             try {
               py::gil_scoped_release nogil;
               peers = r.exchange(torchrpc::PeerInfo{name, rank, tcp, unixAddr, host});
             } catch (const c10::ValueError& e) {
               throw py::value_error(e.what_without_backtrace());
             }
             py::list out;
             for (const auto& p : peers) out.append(py::make_tuple(p.name, p.rank, p.tcpAddress, p.unixAddress, p.hostId));
             return out;
           })
      .def("barrier", &torchrpc::Rendezvous::barrier, py::call_guard<py::gil_scoped_release>());

  py::class_<Agent, std::shared_ptr<Agent>>(m, "Agent")
      .def(py::init([](const std::string& name, int rank, int worldSize, size_t numThreads,
                       double rpcTimeout, const std::string& listenHost, const std::string& hostId) {
             torchrpc::AgentOptions o;
             o.name = name;
             o.rank = rank;
             o.worldSize = worldSize;
             o.numWorkerThreads = numThreads;
             o.defaultTimeoutSeconds = rpcTimeout;
             o.listenHost = listenHost;
             o.hostId = hostId;
             return std::make_shared<Agent>(o);
           }),
           py::arg("name"), py::arg("rank"), py::arg("world_size"), py::arg("num_worker_threads"),
           py::arg("rpc_timeout"), py::arg("listen_host"), py::arg("host_id"))
      .def("listen", &Agent::listen)
      .def("set_peers",
           [](Agent& a, const std::vector<std::tuple<std::string, int, std::string, std::string, std::string>>& peers) {
             std::vector<torchrpc::PeerInfo> out;
             for (const auto& [name, rank, tcp, unixAddr, host] : peers) {
               out.push_back(torchrpc::PeerInfo{name, rank, tcp, unixAddr, host});
             }
             a.setPeers(std::move(out));
           })
      .def("set_python_handler",
           [](Agent& a, py::object call, py::object remote) {
             torchrpc::python_fallback::installPythonHandler(a, std::move(call), std::move(remote));
           })
      .def("set_script_resolver",
           [](Agent& a, py::object fn) { torchrpc::python_fallback::installScriptResolver(a, std::move(fn)); })
      .def("register_script",
           [](Agent& a, const std::string& name, py::handle fn) {
             a.registry().add(name, torchrpc::python_fallback::calleeFromPython(fn));
           })
      .def("script_call",
           [](Agent& a, int dst, const std::string& name, const std::string& moduleHint, py::handle fn,
              py::tuple args, py::dict kwargs, double timeout, const std::string& kind, py::object shipped) {
             auto msg = scriptMessage(name, moduleHint, fn, args, kwargs, shipped);
             return translated([&] { return sendOrRaise(a, dst, std::move(msg), timeout, kind, name); });
           })
      .def("named_call",
           [](Agent& a, const std::string& to, const std::string& name, py::tuple args, py::dict kwargs,
              double timeout, const std::string& kind) {
             std::vector<c10::IValue> stack;
             for (auto arg : args) stack.push_back(torch::jit::toIValue(arg, c10::AnyType::get()));
             c10::impl::GenericDict kw(c10::StringType::get(), c10::AnyType::get());
             for (auto item : kwargs) {
               kw.insert(py::cast<std::string>(item.first), torch::jit::toIValue(item.second, c10::AnyType::get()));
             }
             return translated([&] {
               py::gil_scoped_release nogil;
               return Call{torchrpc::jit_ops::namedScriptCall(a, to, name, c10::ivalue::Tuple::create(std::move(stack)),
                                                              std::move(kw), timeout, kind)};
             });
           })
      .def("make_current", [](std::shared_ptr<Agent> a) { Agent::setCurrent(std::move(a)); })
      .def("builtin_call",
           [](Agent& a, int dst, const std::string& opName, py::tuple args, py::dict kwargs, double timeout,
              const std::string& kind) {
             std::string full;
             auto msg = builtinMessage(opName, args, kwargs, &full);
             return translated([&] { return sendOrRaise(a, dst, std::move(msg), timeout, kind, full); });
           })
      .def("python_call",
           [](Agent& a, int dst, py::bytes payload, std::vector<at::Tensor> tensors, double timeout,
              const std::string& kind, const std::string& function) {
             auto msg = pythonMessage(payload, std::move(tensors));
             return translated([&] { return sendOrRaise(a, dst, std::move(msg), timeout, kind, function); });
           })
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
      .def("confirmed",
           [](const rref::RRef& r) {
             return r.isOwner() || static_cast<const rref::UserRRef&>(r).confirmed();
           })
      .def("creation_error",
           [](const rref::RRef& r) -> py::object {
             if (r.isOwner()) return py::none();
             auto e = static_cast<const rref::UserRRef&>(r).creationError();
             if (!e) return py::none();
             return py::make_tuple(e->first, e->second, "", "");
           })
      // Owner only: (True, value) once the value exists, or (False, error info).
      .def("local_value", [](const rref::RRef& r, double timeout) -> py::tuple {
        TORCH_CHECK(r.isOwner(), "local_value() of a user RRef");
        const auto& owner = static_cast<const rref::OwnerRRef&>(r);
        const auto& future = owner.value();
        if (!future->completed()) {
          bool late;
          {
            py::gil_scoped_release nogil;
            torchrpc::python_fallback::PythonTurn::Pause pause;
            late = !owner.waitValue(timeout);
          }
          if (late) {
            return py::make_tuple(false, py::make_tuple(1, "the value of RRef " + r.id().str() +
                                                               " was not created within " +
                                                               std::to_string(timeout) + " s", "", ""));
          }
        }
        if (future->hasError()) return errorTuple(future->exception_ptr());
        return py::make_tuple(true, pyValue(future->value()));
      })
      // The TorchScript object (torch.classes.torchrpc.RRef) of this RRef.
      .def("script_object",
           [](const std::shared_ptr<rref::RRef>& r) { return torch::jit::toPyObject(torchrpc::jit_ops::scriptRRef(r)); });

  // The RRef of a TorchScript RRef object (a torch.ScriptObject), or None.
  m.def("rref_of_script_object", [](const py::handle& obj) -> std::shared_ptr<rref::RRef> {
    if (!py::isinstance<torch::jit::Object>(obj)) return nullptr;
    return torchrpc::jit_ops::rrefOf(py::cast<torch::jit::Object>(obj)._ivalue());
  });

  py::class_<rref::RRefContext, std::shared_ptr<rref::RRefContext>>(m, "RRefContext")
      .def(py::init([](std::shared_ptr<Agent> agent, py::object encoder, py::object methodRunner) {
        auto ctx = rref::RRefContext::create(std::move(agent));
        torchrpc::python_fallback::installRRefPython(*ctx, std::move(encoder), std::move(methodRunner));
        return ctx;
      }))
      .def("create_owner",
           [](rref::RRefContext& c, py::object value) -> std::shared_ptr<rref::RRef> {
             // A plain tensor is kept as a tensor (the same object comes back),
             // so TorchScript can fetch it too; anything else as a Python object.
             if (THPVariable_CheckExact(value.ptr())) {
               const auto& t = THPVariable_Unpack(value.ptr());
               if (!t.requires_grad()) return c.createOwner(c10::IValue(t));
             }
             return c.createOwner(torchrpc::python_fallback::pyObjectIValue(std::move(value)));
           })
      .def("remote_script",
           [](rref::RRefContext& c, int dst, const std::string& name, const std::string& moduleHint, py::handle fn,
              py::tuple args, py::dict kwargs, double timeout) {
             auto msg = scriptMessage(name, moduleHint, fn, args, kwargs);
             return remoteOrRaise(c, dst, std::move(msg), timeout, name);
           })
      .def("remote_named",
           [](rref::RRefContext& c, int dst, const std::string& name, py::tuple args, py::dict kwargs,
              double timeout) {
             std::vector<c10::IValue> stack;
             for (auto arg : args) stack.push_back(torch::jit::toIValue(arg, c10::AnyType::get()));
             c10::impl::GenericDict kw(c10::StringType::get(), c10::AnyType::get());
             for (auto item : kwargs) {
               kw.insert(py::cast<std::string>(item.first), torch::jit::toIValue(item.second, c10::AnyType::get()));
             }
             auto msg = torchrpc::jit_ops::namedCallMessage(name, c10::ivalue::Tuple::create(std::move(stack)),
                                                            std::move(kw), "remote");
             return remoteOrRaise(c, dst, std::move(msg), timeout, name);
           })
      .def("remote_builtin",
           [](rref::RRefContext& c, int dst, const std::string& opName, py::tuple args, py::dict kwargs,
              double timeout) {
             std::string full;
             auto msg = builtinMessage(opName, args, kwargs, &full);
             return remoteOrRaise(c, dst, std::move(msg), timeout, full);
           })
      .def("remote_python",
           [](rref::RRefContext& c, int dst, py::bytes payload, std::vector<at::Tensor> tensors, double timeout,
              const std::string& function) {
             auto msg = pythonMessage(payload, std::move(tensors));
             return remoteOrRaise(c, dst, std::move(msg), timeout, function);
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
             const bool grads = torchrpc::python_fallback::gradsRecorded();
             auto argValues = torchrpc::python_fallback::plainIValue(args, grads);
             if (!argValues) return std::nullopt;
             c10::impl::GenericDict kwValues(c10::StringType::get(), c10::AnyType::get());
             for (auto item : kwargs) {
               auto v = torchrpc::python_fallback::plainIValue(item.second, grads);
               if (!v) return std::nullopt;
               kwValues.insert(py::cast<std::string>(item.first), std::move(*v));
             }
             return translated([&] {
               auto msg = rref::methodCallMessage(r->id(), name, std::move(*argValues), std::move(kwValues));
               std::optional<py::gil_scoped_release> nogil;
               if (sendMayWait(c.agent(), r->owner(), msg)) nogil.emplace();
               return Call{c.methodCall(r, std::move(msg), name, timeout, kind)};
             });
           })
      .def("fork",
           [](rref::RRefContext& c, const std::shared_ptr<rref::RRef>& r, int requestTo) {
             return py::tuple(py::cast(c.fork(r, requestTo).toInts()));
           }, py::arg("rref"), py::arg("request_to") = -1)
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
      .def("snapshot",
           [](const rref::RRefContext& c) {
             auto s = c.snapshot();
             py::dict d;
             py::list owners;
             for (const auto& [id, forks, ready, failed] : s.owners) {
               owners.append(py::make_tuple(id, forks, ready, failed));
             }
             py::list users;
             for (const auto& [id, fork, owner, confirmed, deleted] : s.users) {
               users.append(py::make_tuple(id, fork, owner, confirmed, deleted));
             }
             d["owners"] = owners;
             d["owner_objects"] = s.localOwners;
             d["users"] = users;
             d["pending_users"] = s.pendingUsers;
             d["pending_children"] = s.pendingChildren;
             d["in_flight"] = s.inFlight;
             return d;
           })
      // Test hooks: protocol messages as if they had arrived, in any order.
      .def("_on_fork_request",
           [](rref::RRefContext& c, int rw, int64_t rl, int fw, int64_t fl) { c.onForkRequest({rw, rl}, {fw, fl}); },
           py::call_guard<py::gil_scoped_release>())
      .def("_on_user_delete",
           [](rref::RRefContext& c, int rw, int64_t rl, int fw, int64_t fl) { c.onUserDelete({rw, rl}, {fw, fl}); },
           py::call_guard<py::gil_scoped_release>())
      .def("_on_child_accept", [](rref::RRefContext& c, int fw, int64_t fl) { c.onChildAccept({fw, fl}); },
           py::call_guard<py::gil_scoped_release>());

  // Test hooks for the wire format (tests/unit/test_wire.py): encode one
  // frame, and parse a byte string fed in chunks of `chunk` bytes, alternating
  // the buffered and the direct (zero-copy) read paths as the transport does.
  // Distributed autograd (torchrpc/autograd.py).
  namespace ag = torchrpc::autograd;
  m.def("autograd_install", [](Agent& a) { ag::install(a); });
  m.def("autograd_new_context", [] { return pythonErrors([] { return ag::Container::get().create()->id(); }); });
  m.def("autograd_current_context", [] { return ag::Container::currentId(); });
  m.def("autograd_release_context", &ag::releaseContext, py::call_guard<py::gil_scoped_release>());
  m.def("autograd_backward",
        [](Agent& a, int64_t id, std::vector<at::Tensor> roots, bool retainGraph) {
          py::gil_scoped_release nogil;
          return pythonErrors([&] { return Call{ag::backward(a, id, roots, retainGraph)}; });
        });
  m.def("autograd_gradients", [](const Agent& a, int64_t id) {
    return pythonErrors([&] { return ag::Container::get().retrieve(id, a.options().name)->gradients(); });
  });
  m.def("autograd_live_contexts", [] { return ag::Container::get().liveIds(); });

  // DistributedOptimizer's functional optimizers (torchrpc/optim/).
  m.def("optimizer_register", [](const py::object& optimizer, std::vector<at::Tensor> params) {
    return pythonErrors([&] {
      return torchrpc::optim::registerOptimizer(py::cast<torch::jit::Object>(optimizer)._ivalue(),
                                                std::move(params));
    });
  });
  m.def("optimizer_unregister", &torchrpc::optim::unregisterOptimizer);

  m.def("_encode_frame", [](int type, uint64_t id, py::bytes payload, std::vector<at::Tensor> tensors,
                            uint64_t lendFrom) {
    torchrpc::Message msg{static_cast<torchrpc::MessageType>(type), id, std::string(payload), std::move(tensors)};
    torchrpc::OutgoingFrame f = torchrpc::encodeFrame(std::move(msg), lendFrom);
    std::string out = f.prefix;
    for (const auto& t : f.tensors) out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    return py::bytes(out);
  }, py::arg("type"), py::arg("id"), py::arg("payload"), py::arg("tensors"), py::arg("lend_from") = 0);
  m.def("_parse_frames", [](py::bytes data, size_t chunk) {
    std::string bytes(data);
    torchrpc::FrameReader reader;
    size_t pos = 0;
    while (pos < bytes.size() && reader.error().empty()) {
      size_t n = std::min(std::max<size_t>(chunk, 1), bytes.size() - pos);
      auto direct = reader.directReadRegion();
      if (direct) {
        n = std::min(n, direct->second);
        std::memcpy(direct->first, bytes.data() + pos, n);
        reader.commitDirectRead(n);
      } else {
        reader.consume(bytes.data() + pos, n);
      }
      pos += n;
    }
    py::list messages;
    for (auto& f : reader.takeFrames()) {
      const auto& m = f.message;
      py::list lent;
      for (const auto& l : f.lent) lent.append(py::make_tuple(l.index, l.address));
      messages.append(py::make_tuple(static_cast<int>(m.type), m.id, py::bytes(m.payload), m.tensors, lent));
    }
    return py::make_tuple(messages, reader.error(), reader.midFrame());
  });

  // Distributed autograd's binary messages (autograd/autograd_messages.h).
  // Test hooks: a report is (passId, [child pass ids]) or None.
  using Report = std::optional<std::pair<int64_t, std::vector<int64_t>>>;
  auto toReport = [](const std::optional<ag::PassReport>& r) -> Report {
    if (!r) return std::nullopt;
    return std::make_pair(r->passId, r->children);
  };
  m.def("_encode_backward", [](int64_t contextId, int64_t sendId, bool retain,
                               std::vector<std::optional<at::Tensor>> grads, int32_t rootRank,
                               int64_t backwardId, int64_t passId, Report report) {
    ag::BackwardRequest r{contextId, sendId, retain, std::move(grads), rootRank, backwardId, passId, std::nullopt};
    if (report) r.report = ag::PassReport{report->first, report->second};
    auto msg = ag::backwardMessage(std::move(r));
    return py::make_tuple(py::bytes(msg.payload), msg.tensors);
  }, py::arg("context_id"), py::arg("send_id"), py::arg("retain"), py::arg("grads"),
     py::arg("root") = 0, py::arg("backward_id") = 0, py::arg("pass_id") = 0, py::arg("report") = py::none());
  m.def("_parse_backward", [toReport](py::bytes payload, std::vector<at::Tensor> tensors) {
    torchrpc::Message msg{torchrpc::MessageType::kAutogradBackward, 0, std::string(payload), std::move(tensors)};
    auto r = pythonErrors([&] { return ag::parseBackward(std::move(msg)); });
    return py::make_tuple(r.contextId, r.sendId, r.retainGraph, r.grads, r.rootRank, r.backwardId,
                          r.passId, toReport(r.report));
  });
  m.def("_backward_endings", &ag::backwardEndings);
  m.def("_encode_pass_done", [](int64_t backwardId, int64_t passId, std::vector<int64_t> children) {
    return py::bytes(ag::passDoneMessage(backwardId, {passId, std::move(children)}).payload);
  });
  m.def("_parse_pass_done", [](py::bytes payload) {
    torchrpc::Message msg{torchrpc::MessageType::kAutogradPassDone, 0, std::string(payload), {}};
    auto [backwardId, report] = pythonErrors([&] { return ag::parsePassDone(msg); });
    return py::make_tuple(backwardId, report.passId, report.children);
  });

  m.def("_receive_cache_bytes", &torchrpc::receive_buffers::cachedBytes);
  m.def("_same_host_copied_bytes", &torchrpc::same_host::copiedBytes);
  m.def("_same_host_offer", [] { return py::bytes(torchrpc::same_host::offer()); });
  m.def("_same_host_verify", [](py::bytes offer) {
    std::string why;
    int pid = torchrpc::same_host::verify(offer, &why);
    return py::make_tuple(pid, why);
  });

  m.def("_loop_events_served_by_others", &torchrpc::Loop::servedByOthers);
  // Tests: a pool's core bookkeeping, driven from Python threads.
  py::class_<torchrpc::CoreSpread>(m, "_CoreSpread")
      .def(py::init<>())
      .def("settle", &torchrpc::CoreSpread::settle)
      .def_static("leave", &torchrpc::CoreSpread::leave);
  m.def("reap_thread_states", &torchrpc::python_fallback::reapThreadStates);
  m.def("_kept_thread_states", &torchrpc::python_fallback::keptThreadStates);
  // Test helper: holds the GIL (never releasing it) for `seconds`, so tests can
  // prove that script calls on this worker complete without it.
  m.def("_hold_gil_for_test", [](double seconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  });
}
