#pragma once

// CalleePolicy: what a worker runs for its peers and what it takes back from
// them; the C++ face of RpcOptions' script_only, allowed_callables,
// allow_import_by_name and allow_shipped_code (docs/threat-model.md, "Callee
// policy"). The default allows everything (the behaviour before it existed).
// Set once in AgentOptions and never changed: any thread reads it unlocked.
//
// Where each part is checked, once per call, before anything is decoded that
// the part forbids:
//   - Agent::serve refuses, under script-only, requests that unpickle or run
//     Python (refuseRequest); remote() reaches it too (its creating call);
//   - the agent's response path refuses, under script-only, a PYTHON_RET;
//   - script_dispatch::run checks builtin and script names, import by name and
//     shipped code;
//   - the Python bridge checks a Python function's name (refuseCallable, via
//     the bindings), known only once its call is unpickled.

#include <optional>
#include <string>
#include <unordered_set>

#include "message/message_type.h"
#include "message/payload.h"

namespace torchrpc::script_dispatch {

// The remote exception type of a refusal (torchrpc.errors.CalleePolicyError).
inline constexpr const char* kPolicyRefusal = "torchrpc.errors.CalleePolicyError";

struct CalleePolicy {
  bool scriptOnly{false};  // no pickle either way: refuse Python requests and PYTHON_RET responses
  std::optional<std::unordered_set<std::string>> allowedCallables;  // names that may run; nullopt: any
  bool importByName{true};  // resolve a SCRIPT_CALL's name nobody registered (may import its module)
  bool shippedCode{true};   // compile TorchScript code a caller sends (shipped_code.h)

  // The refusal of a request of `type` (script-only: PYTHON_CALL and
  // RREF_METHOD_CALL), or nullopt when it may run.
  std::optional<message::RemoteException> refuseRequest(message::MessageType type, const std::string& worker) const;
  // The refusal of running `callable` (not on the allowlist), or nullopt.
  // `family`, if not empty, is another name that allows it: a builtin's
  // operator without its overload ("aten::add" for "aten::add.Tensor").
  std::optional<message::RemoteException> refuseCallable(const std::string& callable, const std::string& worker,
                                                         const std::string& family = "") const;
  // The refusal of compiling the shipped code of `function`, or nullopt.
  std::optional<message::RemoteException> refuseShippedCode(const std::string& function,
                                                             const std::string& worker) const;
  // Why a PYTHON_RET is refused (script-only), or "" when it is taken.
  std::string refuseResponse(message::MessageType type, const std::string& worker) const;
};

}  // namespace torchrpc::script_dispatch
