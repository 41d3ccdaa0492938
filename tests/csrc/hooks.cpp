// Test hooks: internals of libtorchrpc driven from the tests, built at test
// time (tests/csrc/__init__.py), never shipped. Glue only, as the shipped
// bindings are.

#include <ATen/ops/ones.h>
#include <torch/csrc/jit/mobile/type_parser.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <tuple>

#include "agent/core_spread.h"
#include "agent/thread_pool.h"
#include "auth/handshake.h"
#include "auth/hmac.h"
#include "common/python_held.h"
#include "common/waiting_thread.h"
#include "common/wait_policy.h"
#include "autograd/autograd_messages.h"
#include "message/payload.h"
#include "message/pickle_check.h"
#include "message/wire.h"
#include "rref/rref_context.h"
#include "script_dispatch/bounded.h"
#include "script_dispatch/exported_signature.h"
#include "script_dispatch/inline_calls.h"
#include "script_dispatch/registry.h"
#include "script_dispatch/shipped_code.h"
#include "torch_backend/envelope.h"
#include "torch_backend/upstream_payloads.h"
#include "transport/same_host.h"

namespace py = pybind11;
namespace ag = torchrpc::autograd;

namespace {

// A report is (passId, [child pass ids]) or None.
using Report = std::optional<std::pair<int64_t, std::vector<int64_t>>>;

Report toReport(const std::optional<ag::PassReport>& r) {
  if (!r) return std::nullopt;
  return std::make_pair(r->passId, r->children);
}

// The type an annotation names ("Dict[str, Any]"), as TorchScript's own.
c10::TypePtr staticType(const std::string& annotation) {
  c10::TypePtr type = c10::parseType(annotation);
  if (auto dynamic = type->castRaw<c10::DynamicType>()) return dynamic->fallback();
  return type;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The wire format (tests/unit/test_wire.py): encode one frame, and parse a
  // byte string fed in chunks of `chunk` bytes, alternating the buffered and
  // the direct (zero-copy) read paths as the transport does.
  m.def(
      "encode_frame",
      [](int type, uint64_t id, py::bytes payload, std::vector<at::Tensor> tensors, uint64_t lendFrom) {
        torchrpc::message::Message msg{static_cast<torchrpc::message::MessageType>(type), id, std::string(payload), std::move(tensors)};
        torchrpc::message::OutgoingFrame f = torchrpc::message::encodeFrame(std::move(msg), lendFrom);
        std::string out = f.prefix;
        for (const auto& b : f.buffers) out.append(b.data, b.bytes);
        return py::bytes(out);
      },
      py::arg("type"), py::arg("id"), py::arg("payload"), py::arg("tensors"), py::arg("lend_from") = 0);
  m.def("parse_frames", [](py::bytes data, size_t chunk, uint64_t maxFrameBytes) {
    std::string bytes(data);
    torchrpc::message::FrameReader reader(maxFrameBytes);
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
      // Lent buffers are copied from their address in this process, as the
      // transport copies them from the sender's: the test keeps the tensors
      // it sent alive.
      if (!f.lent.empty()) {
        for (const auto& l : f.lent) {
          std::memcpy(f.buffers[l.index].data_ptr(), reinterpret_cast<const void*>(l.address),
                      f.bufferSpecs[l.index].nbytes);
        }
        std::string why = torchrpc::message::assembleTensors(f);
        TORCH_CHECK(why.empty(), "cannot assemble a lent frame: ", why);
      }
      const auto& msg = f.message;
      py::list lent;
      for (const auto& l : f.lent) lent.append(py::make_tuple(l.index, l.address));
      messages.append(py::make_tuple(static_cast<int>(msg.type), msg.id, py::bytes(msg.payload), msg.tensors, lent));
    }
    return py::make_tuple(messages, reader.error(), reader.midFrame());
  }, py::arg("data"), py::arg("chunk"), py::arg("max_frame_bytes") = torchrpc::message::kDefaultMaxFrameBytes);
  // Feeds `data` (a frame's start) to a reader and keeps it, mid-frame, for
  // `seconds` of a test's measurements: what does a declaration alone cost?
  m.def("hold_partial_frame", [](py::bytes data) {
    auto reader = std::make_shared<torchrpc::message::FrameReader>();
    std::string bytes(data);
    size_t pos = 0;
    while (pos < bytes.size()) {
      auto direct = reader->directReadRegion();
      if (direct) {
        size_t n = std::min(direct->second, bytes.size() - pos);
        std::memcpy(direct->first, bytes.data() + pos, n);
        reader->commitDirectRead(n);
        pos += n;
      } else {
        pos += reader->consume(bytes.data() + pos, bytes.size() - pos);
      }
      if (!reader->error().empty()) break;
    }
    return py::make_tuple(py::capsule(new std::shared_ptr<torchrpc::message::FrameReader>(reader), [](void* p) {
      delete static_cast<std::shared_ptr<torchrpc::message::FrameReader>*>(p);
    }), reader->error());
  });

  // IValue payloads (message/payload.h, plain_codec.h): a Python value as
  // TorchScript infers its type, encoded; a payload decoded, with its type.
  // `type` ("Dict[str, Any]"), if given, instead of the inferred one.
  m.def(
      "encode_payload",
      [](py::handle value, const std::string& type) {
        auto msg = torchrpc::message::ivalueMessage(
            torchrpc::message::MessageType::kScriptRet, 0,
            torch::jit::toIValue(value, type.empty() ? c10::AnyType::get() : staticType(type)));
        return py::make_tuple(py::bytes(msg.payload), msg.tensors);
      },
      py::arg("value"), py::arg("type") = "");
  m.def("decode_payload", [](py::bytes payload, std::vector<at::Tensor> tensors) {
    torchrpc::message::Message msg{torchrpc::message::MessageType::kScriptRet, 0, std::string(payload),
                                   std::move(tensors)};
    c10::IValue value = torchrpc::message::messageIValue(msg);
    return py::make_tuple(torch::jit::toPyObject(value), value.type()->annotation_str());
  });
  m.def("inferred_type", [](py::handle value) {
    return torch::jit::toIValue(value, c10::AnyType::get()).type()->annotation_str();
  });

  // Distributed autograd's binary messages (autograd/autograd_messages.h).
  m.def(
      "encode_backward",
      [](int64_t contextId, int64_t sendId, bool retain, std::vector<std::optional<at::Tensor>> grads,
         int32_t rootRank, int64_t backwardId, int64_t passId, Report report) {
        ag::BackwardRequest r{contextId, sendId, retain, std::move(grads), rootRank, backwardId, passId, std::nullopt};
        if (report) r.report = ag::PassReport{report->first, report->second};
        auto msg = ag::backwardMessage(std::move(r));
        return py::make_tuple(py::bytes(msg.payload), msg.tensors);
      },
      py::arg("context_id"), py::arg("send_id"), py::arg("retain"), py::arg("grads"), py::arg("root") = 0,
      py::arg("backward_id") = 0, py::arg("pass_id") = 0, py::arg("report") = py::none());
  m.def("parse_backward", [](py::bytes payload, std::vector<at::Tensor> tensors) {
    torchrpc::message::Message msg{torchrpc::message::MessageType::kAutogradBackward, 0, std::string(payload), std::move(tensors)};
    auto r = ag::parseBackward(std::move(msg));
    return py::make_tuple(r.contextId, r.sendId, r.retainGraph, r.grads, r.rootRank, r.backwardId, r.passId,
                          toReport(r.report));
  });
  m.def("encode_pass_done", [](int64_t backwardId, int64_t passId, std::vector<int64_t> children) {
    return py::bytes(ag::passDoneMessage(backwardId, {passId, std::move(children)}).payload);
  });
  m.def("parse_pass_done", [](py::bytes payload) {
    torchrpc::message::Message msg{torchrpc::message::MessageType::kAutogradPassDone, 0, std::string(payload), {}};
    auto [backwardId, report] = ag::parsePassDone(msg);
    return py::make_tuple(backwardId, report.passId, report.children);
  });

  // The same-host copy's proof of pid (transport/same_host.h): (pid, "") or (-1, why).
  m.def("same_host_offer", [] { return py::bytes(torchrpc::transport::same_host::offer()); });
  m.def("same_host_verify", [](py::bytes offer) {
    auto pid = torchrpc::transport::same_host::verify(offer);
    return py::make_tuple(pid.value, pid.error.what());
  });

  // A pool's core bookkeeping, driven from Python threads.
  py::class_<torchrpc::agent::CoreSpread>(m, "CoreSpread")
      .def(py::init<>())
      .def("settle", &torchrpc::agent::CoreSpread::settle)
      .def_static("leave", &torchrpc::agent::CoreSpread::leave);

  // A pool of `threads` running at most `cap` fresh tasks at once
  // (agent/thread_pool.h). `blockers` tasks wait until a task queued after
  // them runs; returns the seconds until all finished, or -1 at `timeout`.
  m.def(
      "pool_blocked_until_a_queued_task",
      [](size_t threads, size_t cap, size_t blockers, double timeout) {
        auto pool = std::make_unique<torchrpc::agent::ThreadPool>(threads, "hooks", nullptr, cap);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its threads asleep, as in a waiting worker
        auto state = std::make_shared<std::tuple<std::mutex, std::condition_variable, bool, size_t>>();
        auto& [mutex, cv, released, finished] = *state;
        const auto start = std::chrono::steady_clock::now();
        for (size_t i = 0; i < blockers; ++i) {
          pool->run([state] {
            auto& [mutex, cv, released, finished] = *state;
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait(lock, [&] { return released; });
            ++finished;
            cv.notify_all();
          });
        }
        pool->run([state] {
          auto& [mutex, cv, released, finished] = *state;
          std::lock_guard<std::mutex> lock(mutex);
          released = true;
          cv.notify_all();
        });
        std::unique_lock<std::mutex> lock(mutex);
        const bool done = cv.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return finished == blockers; });
        released = true;  // frees the blockers of a failed run, so the pool can stop
        cv.notify_all();
        lock.unlock();
        pool->stop();
        return done ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() : -1.0;
      },
      py::call_guard<py::gil_scoped_release>());
  // The most tasks that ran at the same time when `tasks` tasks that each
  // sleep `micros` were queued at once on such a pool, whose tasks count as
  // stalled after `stallMicros`.
  m.def(
      "pool_most_at_once",
      [](size_t threads, size_t cap, size_t tasks, int64_t micros, int64_t stallMicros) {
        torchrpc::agent::ThreadPool pool(threads, "hooks", nullptr, cap, std::chrono::microseconds(stallMicros));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its threads asleep, as in a waiting worker
        auto now = std::make_shared<std::atomic<size_t>>(0);
        auto most = std::make_shared<std::atomic<size_t>>(0);
        auto done = std::make_shared<std::atomic<size_t>>(0);
        for (size_t i = 0; i < tasks; ++i) {
          pool.run([now, most, done, micros] {
            const size_t at = ++*now;
            size_t seen = most->load();
            while (at > seen && !most->compare_exchange_weak(seen, at)) {
            }
            std::this_thread::sleep_for(std::chrono::microseconds(micros));
            --*now;
            ++*done;
          });
        }
        // Before stop(), which wakes every thread for what is still queued.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (done->load() < tasks && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        pool.stop();
        return most->load();
      },
      py::call_guard<py::gil_scoped_release>());

  // The handshake's primitives (auth/hmac.h), checked against hashlib and hmac.
  auto digestBytes = [](const torchrpc::auth::Digest& d) {
    return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
  };
  m.def("sha256", [digestBytes](py::bytes data) { return digestBytes(torchrpc::auth::sha256(std::string(data))); });
  m.def("hmac_sha256", [digestBytes](py::bytes key, py::bytes message) {
    return digestBytes(torchrpc::auth::hmacSha256(std::string(key), std::string(message)));
  });

  // One end of the connection handshake (auth/handshake.h), driven by hand.
  using HS = torchrpc::auth::Handshake;
  py::class_<HS>(m, "Handshake")
      .def(py::init([](bool connector, py::bytes secret, int32_t rank, int32_t expectedPeer, int32_t worldSize) {
        return std::make_unique<HS>(connector ? HS::Role::kConnector : HS::Role::kAcceptor, std::string(secret), rank,
                                    expectedPeer, [worldSize, rank](int32_t r) { return r >= 0 && r < worldSize && r != rank; });
      }))
      .def("start", [](HS& h) { return py::bytes(h.start()); })
      // (reply, bytes used)
      .def("consume",
           [](HS& h, py::bytes data) {
             std::string bytes(data);
             size_t used = 0;
             std::string reply = h.consume(bytes.data(), bytes.size(), &used);
             return py::make_tuple(py::bytes(reply), used);
           })
      .def("state", [](const HS& h) {
        switch (h.state()) {
          case HS::State::kWaiting: return "waiting";
          case HS::State::kDone: return "done";
          default: return "failed";
        }
      })
      .def("error", &HS::error)
      .def("peer_rank", &HS::peerRank);

  // RRef protocol messages as if they had arrived, in any order.
  using Ctx = std::shared_ptr<torchrpc::rref::RRefContext>;
  m.def(
      "on_fork_request",
      [](const Ctx& c, int rw, int64_t rl, int fw, int64_t fl, int holder) {
        c->onForkRequest({rw, rl}, {fw, fl}, holder);
      },
      py::arg("ctx"), py::arg("rw"), py::arg("rl"), py::arg("fw"), py::arg("fl"), py::arg("holder") = -1,
      py::call_guard<py::gil_scoped_release>());
  // A peer declared gone (worker/peer_watch.h), and what its requests made.
  m.def(
      "release_peer", [](const Ctx& c, int rank) { c->releasePeer(rank); }, py::call_guard<py::gil_scoped_release>());
  m.def("awaited_count", [](const Ctx& c, int rank) { return c->awaitedCount(rank); });
  m.def(
      "on_user_delete",
      [](const Ctx& c, int rw, int64_t rl, int fw, int64_t fl) { c->onUserDelete({rw, rl}, {fw, fl}); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "on_child_accept", [](const Ctx& c, int fw, int64_t fl) { c->onChildAccept({fw, fl}); },
      py::call_guard<py::gil_scoped_release>());
  // common/python_held's rule (tests/multiprocess/test_python_held.py) on
  // values made here, which Python never saw.
  m.def("drops_without_gil_cases", [] {
    namespace c = torchrpc::common;
    at::Tensor alone = at::ones({4});
    at::Tensor held = at::ones({4});
    at::Tensor twin = held;  // a second holder of the tensor
    at::Tensor base = at::ones({4});
    at::Tensor slice = base.narrow(0, 0, 2);  // a second holder of the storage
    c10::IValue tuple = c10::ivalue::Tuple::create({at::ones({2}), 1});
    c10::IValue sharedTuple = c10::ivalue::Tuple::create({at::ones({2})});
    c10::IValue tupleTwin = sharedTuple;
    py::dict out;
    out["alone"] = c::dropsWithoutGil(alone);
    out["tensor_shared"] = c::dropsWithoutGil(held);
    out["storage_shared"] = c::dropsWithoutGil(slice);
    out["tuple"] = c::dropsWithoutGil(tuple);
    out["tuple_shared"] = c::dropsWithoutGil(sharedTuple);
    return out;
  });
  // The wait policy (tests/unit/test_wait_policy.py): its rules fed made-up
  // measurements, a policy whose sampler is a Python callable returning
  // (runnable, other_pollers) and whose clock is the caller's (µs), and one
  // real sample of this host.
  namespace wp = torchrpc::common;
  using us = std::chrono::microseconds;
  m.def("wait_core_free", [](int runnable, int otherPollers, int ourPollers, int cores) {
    return wp::WaitPolicy::coreFree(wp::WaitSample{runnable, otherPollers}, ourPollers, cores);
  });
  m.def("wait_lost_core", [](int64_t waitedUs, int64_t arrivals) {
    return wp::WaitPolicy::lostCore(us(waitedUs), arrivals);
  });
  py::class_<wp::WaitPolicy>(m, "WaitPolicy")
      .def(py::init([](int cores, py::function sampler) {
        return new wp::WaitPolicy(cores, [sampler] {
          py::gil_scoped_acquire gil;
          auto [runnable, others, othersCores] = sampler().cast<std::tuple<int, int, double>>();
          return wp::WaitSample{runnable, others, othersCores};
        });
      }))
      .def("enter", [](wp::WaitPolicy& p, int64_t nowUs) { return p.enter(wp::WaitPolicy::Clock::time_point(us(nowUs))); })
      .def("keep", [](wp::WaitPolicy& p, int64_t nowUs) { return p.keep(wp::WaitPolicy::Clock::time_point(us(nowUs))); })
      .def("leave", &wp::WaitPolicy::leave)
      .def("probed", [](wp::WaitPolicy& p, int64_t endUs, int64_t waitedUs, int64_t arrivals) {
        p.probed(wp::WaitPolicy::Clock::time_point(us(endUs)), us(waitedUs), arrivals);
      })
      .def_property_readonly("pollers", &wp::WaitPolicy::pollers)
      .def_property_readonly("withheld", &wp::WaitPolicy::withheld);
  m.def("host_wait_sample", [] {
    const auto& p = wp::WaitPolicy::process();
    const auto s = p.sample();
    return py::make_tuple(s.runnable, s.otherPollers, p.cores(), p.measures(), s.othersCores);
  });
  // This process's scheduling group as the host's table of torchrpc
  // processes knows it (claims this process's slot).
  m.def("group_pids", [] {
    std::vector<int32_t> pids;
    for (const auto& process : wp::HostPollers::instance().group()) pids.push_back(process.pid);
    return pids;
  });
  m.def("group_key_of", [](const std::string& cgroupPath, const std::string& autogroupPath) {
    return wp::HostPollers::groupKeyOf(cgroupPath.c_str(), autogroupPath.c_str());
  });

  // A thread that runs tasks while it waits (tests/unit/test_waiting_thread.py).
  // Tasks are Python callables, run with the GIL; a task that does not run
  // on the waiting thread runs on a thread of its own, as on the pool.
  using WT = torchrpc::common::WaitingThread;
  auto pyTask = [](py::object fn) {
    auto held = std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* o) {
      py::gil_scoped_acquire gil;
      delete o;
    });
    return WT::Task([held] {
      py::gil_scoped_acquire gil;
      (*held)();
    });
  };
  auto elsewhere = [](WT::Task task) { std::thread(std::move(task)).detach(); };
  py::class_<WT, std::shared_ptr<WT>>(m, "WaitingThread")
      .def(py::init([] { return std::make_shared<WT>("hooks", "a test's wait"); }))
      .def("offer", [pyTask](WT& w, py::object fn) { return w.offer([&] { return pyTask(std::move(fn)); }); })
      .def("serve_until",
           [elsewhere](WT& w, const std::shared_ptr<torch::jit::PythonFutureWrapper>& future) {
             py::gil_scoped_release nogil;
             w.serveUntil(*future->fut, nullptr, elsewhere);
           })
      .def("close", [elsewhere](WT& w) {
        py::gil_scoped_release nogil;
        w.close(elsewhere);
      });

  // An exported program's signature (tests/unit/test_exported_signature.py):
  // the schema it gives, and its checks of some inputs (Tensor or not).
  m.def("exported_schema", [](const std::string& text, const std::string& name) {
    return c10::toString(torchrpc::script_dispatch::ExportedSignature::parse(text).schema(name));
  });
  m.def("exported_check", [](const std::string& text, std::vector<at::Tensor> inputs) {
    auto sig = torchrpc::script_dispatch::ExportedSignature::parse(text);
    torch::jit::Stack stack(inputs.begin(), inputs.end());
    sig.check(stack, c10::DeviceType::CPU);
  });

  // Whose time the size of its tensor inputs bounds (tests/unit/test_bounded.py).
  m.def("bounded_operator", [](const std::string& name) {
    auto callee = torchrpc::script_dispatch::Registry().findOperator(name);
    TORCH_CHECK(callee, "no operator ", name);
    return callee->bounded();
  });
  m.def("bounded_function", [](const torch::jit::StrongFunctionPtr& fn) {
    return torchrpc::script_dispatch::boundedRun(*fn.function_);
  });

  // The backend's check of upstream's payloads (tests/unit/test_upstream_payloads.py),
  // and upstream's message types by name.
  m.def("upstream_payload_check", [](int type, py::bytes payload, std::vector<at::Tensor> tensors) {
    const std::string p = payload;
    return torchrpc::torch_backend::checkUpstreamPayload(static_cast<torch::distributed::rpc::MessageType>(type),
                                                          p.data(), p.size(), tensors);
  });
  m.def("upstream_message_types", [] {
    std::map<std::string, int> types;
    for (int t = 0; t < 0x400; ++t) {
      auto name = torchrpc::torch_backend::upstreamTypeName(static_cast<torch::distributed::rpc::MessageType>(t));
      if (name.rfind("type ", 0) != 0) types[name] = t;
    }
    return types;
  });

  // How deep shipped TorchScript source nests, and where (tests/unit/test_shipped_code.py).
  m.def("shipped_source_depth", [](const std::string& source) {
    auto d = torchrpc::script_dispatch::shippedSourceDepth(source.data(), source.size());
    return std::make_pair(d.depth, d.line);
  });

  // Whether `runs` runs, each `busyUs` of work then `offCoreUs` asleep (as a
  // thread the scheduler took off its core), prove a callee short
  // (tests/unit/test_inline_calls.py).
  m.def("proven_after_runs", [](int runs, int busyUs, int offCoreUs) {
    py::gil_scoped_release noGil;
    torchrpc::script_dispatch::RunRecord record;
    for (int i = 0; i < runs; ++i) {
      const torchrpc::script_dispatch::RunTimer run;
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(busyUs);
      while (std::chrono::steady_clock::now() < until) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(offCoreUs));
      record.record(run);
    }
    return record.provenShort();
  });

  // Whether a run reads the CPU clock: after `idleMs` with no run, then
  // after a run of 2 ms off the core (tests/unit/test_inline_calls.py).
  m.def("cpu_clock_read", [](int idleMs) {
    py::gil_scoped_release noGil;
    std::this_thread::sleep_for(std::chrono::milliseconds(idleMs));
    torchrpc::script_dispatch::RunRecord record;
    const torchrpc::script_dispatch::RunTimer first;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    record.record(first);
    const torchrpc::script_dispatch::RunTimer next;
    return std::make_pair(first.timedByCpu(), next.timedByCpu());
  });
}
