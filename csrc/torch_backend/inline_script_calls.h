#pragma once

// The backend's SCRIPT_CALLs (a TorchScript function by qualified name, or a
// builtin operator) without decoding them twice, and the short ones on the
// thread that read them, under the rule of script_dispatch/inline_calls.h.
//
// A request is a candidate when its frame holds a SCRIPT_CALL with at most
// kMaxInputBytes of strided tensors and of payload, and no RRef (decoding
// one would register it). The reading thread unpickles a candidate, with
// no type resolver (an argument of a class type makes it no candidate), to
// learn its callee's name. On the first call of a name a pool thread finds
// the callee (a script_dispatch::Callee) as upstream's callback would,
// decoding that call once more; every call then runs the decoded arguments
// itself and answers upstream's SCRIPT_RET, or upstream's EXCEPTION with
// what the run threw, as upstream's callback would. A call runs on the
// thread that read it once its callee's time is bounded
// (script_dispatch/bounded.h) and its runs proved short; on the pool
// otherwise. Upstream's callback still runs a
// call whose arguments do not fit the callee's schema, a callee that may
// suspend, a builtin of several results (upstream refuses it), and every
// call while a server-side profile (rpc._server_process_global_profile),
// which only the callback records, is on.
//
// Threads: candidate() and see() on the reading thread, made() on a pool
// thread (it reads the function's graph), run() on either; all at once.

#include <torch/csrc/distributed/rpc/message.h>

#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "message/message.h"
#include "script_dispatch/callee.h"

namespace torchrpc::torch_backend {

namespace upstream = torch::distributed::rpc;

class InlineScriptCalls {
 public:
  // The TorchScript function upstream runs for a qualified name, as a
  // callee, or null. Upstream's compilation unit lives in libtorch_python:
  // the bindings look it up.
  using FindFunction = std::function<std::shared_ptr<script_dispatch::Callee>(const std::string& qualifiedName)>;

  // What the reading thread learned of a candidate.
  struct Sighting {
    std::string key;                                  // its callee's name as the request gives it; empty: no candidate
    std::shared_ptr<script_dispatch::Callee> callee;  // null until a run made it (made())
    std::vector<c10::IValue> args;                    // as upstream's caller matched them to the callee's schema
    bool runsHere() const { return callee && callee->bounded() && callee->runs.provenShort(); }
  };

  explicit InlineScriptCalls(FindFunction find) : find_(std::move(find)) {}

  // Whether a TORCH_REQUEST frame holds a candidate (above). Reads the frame only.
  static bool candidate(const message::Message& frame);
  // Decodes a candidate's call, which unwrapRequest checked (envelope.h); never
  // throws (a call it cannot decode is no candidate).
  Sighting see(const upstream::Message& request) const;
  // The sighting's callee, made on its first run (from upstream's decoding
  // of `request`); null if it has no name or names no function or operator
  // this worker has.
  std::shared_ptr<script_dispatch::Callee> made(const Sighting& sighting, const upstream::Message& request);
  // Runs the sighting's decoded call (above) and records the run's time;
  // returns upstream's response, or null having run nothing (upstream's
  // callback must run it).
  c10::intrusive_ptr<upstream::Message> run(Sighting& sighting) const;

 private:
  const FindFunction find_;
  mutable std::shared_mutex mutex_;
  // One per function and operator run here.
  std::unordered_map<std::string, std::shared_ptr<script_dispatch::Callee>> callees_;
};

}  // namespace torchrpc::torch_backend
