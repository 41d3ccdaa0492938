#pragma once

#include <cstdint>

namespace torchrpc::message {

// Every kind of frame on the wire. The numbers ARE the wire format: never
// renumber or reuse one; leave the gaps for the concept that owns them.
enum class MessageType : uint16_t {
  // Connection control (1-9).
  kHello = 1,    // retired (the handshake, auth/handshake.h, names the peer now); never sent
  kGoodbye = 2,  // orderly close: the sender shuts down, nothing more will come
  kPing = 3,     // are you there? (heartbeat: answered with PONG by the connection itself)
  kPong = 4,     // yes

  // Same-host copy (5-7): see csrc/transport/same_host.h. Between the two
  // ends of one connection only; they never reach the agent.
  kLendOffer = 5,    // the sender's pid and where the peer can read proof of it
  kLendAccept = 6,   // the receiver read the proof: tensors may be lent to it
  kLendRelease = 7,  // the receiver copied the lent tensors of this many frames

  // Calls (10-29). Requests have a request id; responses echo it.
  kScriptCall = 10,   // TorchScript function by registered name (no GIL)
  kBuiltinCall = 11,  // operator by schema name, run through the dispatcher
  kPythonCall = 12,   // cloudpickled callable, run under the GIL
  kScriptRet = 20,    // result of a script or builtin call (an IValue)
  kPythonRet = 21,    // result of a Python call (Python pickle + tensors)
  kException = 29,    // the callee failed: type, message, traceback

  // RRef protocol (30-49): see csrc/rref/rref_messages.h. All are requests;
  // their responses are the ordinary SCRIPT_RET / PYTHON_RET / EXCEPTION.
  kRemoteCall = 30,       // create an owner RRef's value by running a call
  kRRefFetch = 31,        // to_here(): the owner's value
  kRRefUserDelete = 32,   // a user RRef is gone
  kRRefForkRequest = 33,  // a user received an RRef from a non-owner
  kRRefChildAccept = 34,  // the owner confirmed the fork a parent sent
  kRRefMethodCall = 35,   // rref.rpc_sync().m(...): a method of the owner's value

  // Distributed autograd (50-69): see csrc/autograd/.
  kAutogradCall = 50,     // a request sent in an autograd context: envelope + request
  kAutogradRet = 51,      // the response to one: envelope + response
  kAutogradBackward = 52, // gradients for a send function, from the worker that received its tensors
  kAutogradCleanup = 53,  // a context is released: drop it and tell the workers it called
  kAutogradPassDone = 54, // to the worker that called backward(): a pass is done, these it started

  // Membership of a dynamic job (70-79): see csrc/worker/membership.h. Requests,
  // answered with SCRIPT_RET (None) or EXCEPTION.
  kMemberJoin = 70,   // the sender joined the job: its record (name, rank, addresses)
  kMemberLeave = 71,  // the sender leaves the job
  // Profiling (80-89): see csrc/profiling/.
  kProfiledCall = 80,  // a request sent while the caller profiles: envelope + request
  kProfiledRet = 81,   // the response to one: the callee's profiler events + response

  // torch.distributed.rpc's own messages (90-99), carried for the TORCHRPC
  // backend (csrc/torch_backend/): upstream's message type, then its payload;
  // tensors beside, as for every message. torchrpc never decodes the payload.
  kTorchRequest = 90,
  kTorchResponse = 91,
};

inline bool isRequest(MessageType t) {
  return t == MessageType::kScriptCall || t == MessageType::kBuiltinCall ||
         t == MessageType::kPythonCall ||
         (t >= MessageType::kRemoteCall && t <= MessageType::kRRefMethodCall) ||
         t == MessageType::kAutogradCall || t == MessageType::kAutogradBackward ||
         t == MessageType::kAutogradCleanup || t == MessageType::kAutogradPassDone ||
         t == MessageType::kMemberJoin || t == MessageType::kMemberLeave ||
         t == MessageType::kProfiledCall || t == MessageType::kTorchRequest;
}

inline bool isResponse(MessageType t) {
  return t == MessageType::kScriptRet || t == MessageType::kPythonRet ||
         t == MessageType::kException || t == MessageType::kAutogradRet ||
         t == MessageType::kProfiledRet || t == MessageType::kTorchResponse;
}

const char* messageTypeName(MessageType t);

}  // namespace torchrpc::message
