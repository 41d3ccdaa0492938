#pragma once

// The backend's short calls, run on the thread that read them: upstream's
// SCRIPT_CALL (a TorchScript function by qualified name, or a builtin
// operator) under the rule of script_dispatch/inline_calls.h. A request is a
// candidate when its frame holds a SCRIPT_CALL with at most
// kMaxInputBytes of strided tensors and of payload, and no RRef (decoding
// one would register it). The reading thread unpickles a candidate, with no
// type resolver (an argument of a class type is never bounded), to learn
// its callee's name; the callee runs there once its time is bounded
// (script_dispatch/bounded.h, from the function's graph or the operator's
// schema, found on its first run on the pool) and its runs proved short.
// Upstream's request callback runs it either way, so what the caller gets
// is the same. The time recorded is the callback's, which decodes the
// request and encodes the response around the run.
//
// Threads: candidate() and see() on the reading thread, made() on a pool
// thread (it reads the function's graph); all of them at once.

#include <torch/csrc/distributed/rpc/message.h>

#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "message/message.h"
#include "script_dispatch/inline_calls.h"

namespace torch::jit {
struct Function;
struct Operator;
}

namespace torchrpc::torch_backend {

namespace upstream = torch::distributed::rpc;

class InlineScriptCalls {
 public:
  // The TorchScript function upstream runs for a qualified name, or null.
  // Upstream's compilation unit lives in libtorch_python: the bindings look it up.
  using FindFunction = std::function<torch::jit::Function*(const std::string& qualifiedName)>;

  // A function or operator this worker ran: whether its time is bounded and how its runs went.
  struct Callee {
    Callee(bool b, std::shared_ptr<torch::jit::Operator> o) : bounded(b), op(std::move(o)) {}
    const bool bounded;
    const std::shared_ptr<torch::jit::Operator> op;  // a builtin's; null for a function
    script_dispatch::RunRecord runs;
  };

  // What the reading thread learned of a candidate.
  struct Sighting {
    std::string key;                 // its callee's name as the request gives it; empty: it never runs there
    std::shared_ptr<Callee> callee;  // null until a run made it (made())
    std::vector<c10::IValue> args;   // a builtin's arguments, as upstream's caller matched them to its schema
    bool runsHere() const { return callee && callee->bounded && callee->runs.provenShort(); }
  };

  explicit InlineScriptCalls(FindFunction find) : find_(std::move(find)) {}

  // Whether a TORCH_REQUEST frame holds a candidate (above). Reads the frame only.
  static bool candidate(const message::Message& frame);
  // Decodes a candidate's call; never throws (a call it cannot decode never runs there).
  Sighting see(const upstream::Message& request) const;
  // The sighting's callee, made on its first run (from upstream's decoding
  // of `request`); null if it has no name or names no function or operator
  // this worker has.
  std::shared_ptr<Callee> made(const Sighting& sighting, const upstream::Message& request);
  // Runs a builtin whose operator a run made known, as upstream's callback
  // would (runJitOperator) but without decoding the request again (upstream
  // finds the operator by comparing the schema's text with each overload's,
  // about 25 µs of a builtin's 50 on this VM), and records the run's time.
  // Upstream's SCRIPT_RET, or null: not such a builtin, or its run failed
  // (upstream's callback then runs it again and answers upstream's error;
  // a bounded operator writes none of its arguments).
  c10::intrusive_ptr<upstream::Message> runOperator(Sighting& sighting) const;

 private:
  const FindFunction find_;
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Callee>> callees_;  // as many as the functions and operators run
};

}  // namespace torchrpc::torch_backend
