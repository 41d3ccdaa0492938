// RRefs (torchrpc/rref.py): handles shared by Python RRef objects, and the
// RRef context that runs the protocol (csrc/rref/rref_context.h).

#include <ATen/Parallel.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "bindings/glue.h"
#include "common/error.h"
#include "jit_ops/script_rref.h"
#include "python_fallback/call_messages.h"
#include "python_fallback/python_rref.h"
#include "rref/rref_context.h"

namespace torchrpc::bindings {

namespace rref = torchrpc::rref;

void bindRRefs(py::module_& m) {
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
      // remote()'s call as a Call, once answered and recorded in the profiler
      // (None for an RRef not made by remote() here while a profiler watched).
      .def("profiled_creation",
           [](const rref::RRef& r) -> std::optional<Call> {
             if (!r.creation()) return std::nullopt;
             return Call{r.creation(), nullptr};
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
                                                                 " was not created within " + torchrpc::common::secondsText(timeout) +
                                                                 " s",
                                                             "", ""));
               }
             }
             return outcome(*owner.value());
           })
      // Owner only: None once the value exists (or failed), else a
      // torch.futures.Future that completes when it does (its value unused),
      // on the pool: the I/O or a timer thread may complete the value, and
      // Python's callbacks (a user's method) must not run there.
      .def("pending_value",
           [](const rref::RRef& r) -> py::object {
             TORCH_CHECK(r.isOwner(), "pending_value() of a user RRef");
             const auto& value = static_cast<const rref::OwnerRRef&>(r).value();
             if (value->completed()) return py::none();
             std::weak_ptr<rref::RRefContext> ctx = r.context();
             auto onPool = torchrpc::common::completedBy(value, [ctx](std::function<void()> task) {
               if (auto live = ctx.lock()) {
                 live->agent().pool().run(std::move(task));
               } else {
                 at::launch(std::move(task));  // torchrpc shut down: torch's pool
               }
             });
             return torch::jit::toPyObject(c10::IValue(std::move(onPool)));
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
           [](rref::RRefContext& c, int dst, const py::capsule& msg, double timeout, const std::string& function) {
             Message call = takeMessage(msg);
             py::gil_scoped_release nogil;
             return c.remote(dst, std::move(call), timeout, function);
           })
      .def("fetch",
           [](rref::RRefContext& c, const std::shared_ptr<rref::RRef>& r, double timeout) {
             TORCH_CHECK(!r->isOwner(), "fetch() of an owner RRef");
             auto user = std::static_pointer_cast<rref::UserRRef>(r);
             py::gil_scoped_release nogil;
             return Call(c.fetch(user, timeout));
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
             return Call(std::move(future));
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
}

}  // namespace torchrpc::bindings
