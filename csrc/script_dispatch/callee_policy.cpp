#include "script_dispatch/callee_policy.h"

namespace torchrpc::script_dispatch {

namespace {

message::RemoteException refusal(std::string why, const std::string& function, const std::string& worker) {
  return message::RemoteException{kPolicyRefusal, std::move(why), "", function, worker};
}

}  // namespace

std::optional<message::RemoteException> CalleePolicy::refuseRequest(message::MessageType type,
                                                                    const std::string& worker) const {
  if (!scriptOnly) return std::nullopt;
  const char* what = nullptr;
  if (type == message::MessageType::kPythonCall) what = "a pickled Python call";
  if (type == message::MessageType::kRRefMethodCall) what = "a Python method of an RRef's value";
  if (what == nullptr) return std::nullopt;
  const std::string name = message::messageTypeName(type);
  return refusal(name + " (" + what + ") refused by " + worker + ": it runs with RpcOptions(script_only=True), "
                     "which unpickles nothing a peer sends and runs no Python for it; call a "
                     "@torch.jit.script function or a builtin instead",
                 name, worker);
}

std::optional<message::RemoteException> CalleePolicy::refuseCallable(const std::string& callable,
                                                                     const std::string& worker,
                                                                     const std::string& family) const {
  if (!allowedCallables || allowedCallables->count(callable) ||
      (!family.empty() && allowedCallables->count(family))) {
    return std::nullopt;
  }
  return refusal("'" + callable + "' refused by " + worker + ": it is not in " + worker +
                     "'s RpcOptions(allowed_callables=...)",
                 callable, worker);
}

std::optional<message::RemoteException> CalleePolicy::refuseShippedCode(const std::string& function,
                                                                        const std::string& worker) const {
  if (shippedCode && !allowedCallables) return std::nullopt;
  const std::string why = !shippedCode ? "RpcOptions(allow_shipped_code=False) compiles no code a caller sends"
                                       : "with RpcOptions(allowed_callables=...) set it compiles no code a caller "
                                         "sends (shipped code runs whatever the caller chose, under any name)";
  return refusal("the shipped code (TorchScript or AOTInductor package) of '" + function + "' refused by " + worker +
                     ": " + why + "; register it there (torchrpc.register) instead",
                 function, worker);
}

std::string CalleePolicy::refuseResponse(message::MessageType type, const std::string& worker) const {
  if (!scriptOnly || type != message::MessageType::kPythonRet) return "";
  return "the PYTHON_RET (a pickled result) was refused: " + worker +
         " runs with RpcOptions(script_only=True), which unpickles nothing a peer sends; call a "
         "@torch.jit.script function or a builtin";
}

}  // namespace torchrpc::script_dispatch
