#pragma once

// The RRef protocol's messages (types 30-49 of message_type.h). Payloads are
// fixed binary headers (ids as int32 worker + int64 counter, little endian),
// no pickle: they are small and frequent.
//
//   REMOTE_CALL        rrefId, forkId, inner call type, then the inner call's
//                      payload; tensors = the inner call's tensors.
//                      Owner creates the value; acks when it exists (or failed).
//   RREF_FETCH         rrefId. Owner answers with the value (see encodeValue
//                      in rref_context.h) or the creation error.
//   RREF_USER_DELETE   rrefId, forkId. Owner drops the fork. Ack.
//   RREF_FORK_REQUEST  rrefId, forkId. Owner adds the fork. Ack.
//   RREF_CHILD_ACCEPT  forkId. The parent drops the reference that kept its
//                      RRef alive while the child's fork was unconfirmed. Ack.
//   RREF_METHOD_CALL   (rrefId worker, rrefId counter, method name, args
//                      tuple, kwargs dict) pickled as IValues; tensors =
//                      theirs. The owner calls
//                      the method of the value (under the GIL) and answers
//                      with the result, as for RREF_FETCH. Sent by proxies
//                      (rref.rpc_sync().m(...)) when every argument is an
//                      IValue; the caller's RRef is alive until the answer,
//                      so the message needs no fork.
//
// An ack is a SCRIPT_RET carrying None.

#include <ATen/core/ivalue.h>

#include <string>

#include "message/message.h"
#include "rref/rref.h"

namespace torchrpc::rref {

message::Message remoteCallMessage(const RRefId& rrefId, const ForkId& forkId, message::Message&& call);
// Splits a REMOTE_CALL back into ids and the inner call (which keeps the id).
message::Message parseRemoteCall(message::Message&& m, RRefId* rrefId, ForkId* forkId);
// The type of a REMOTE_CALL's inner call (SCRIPT, BUILTIN or PYTHON_CALL);
// throws on a malformed one.
message::MessageType remoteCallType(const message::Message& m);

struct MethodCall {
  RRefId rrefId;
  std::string name;
  c10::IValue args;    // a tuple
  c10::IValue kwargs;  // a dict str -> Any
};
message::Message methodCallMessage(const RRefId& rrefId, const std::string& name, c10::IValue args,
                          c10::IValue kwargs);
// Throws on a malformed payload.
MethodCall parseMethodCall(const message::Message& m);

message::Message idsMessage(message::MessageType type, const GlobalId& a);
message::Message idsMessage(message::MessageType type, const GlobalId& a, const GlobalId& b);
// Reads `count` ids (1 or 2) from a protocol message; throws on a bad size.
void parseIds(const message::Message& m, GlobalId* a, GlobalId* b = nullptr);

message::Message ackMessage(uint64_t id);

}  // namespace torchrpc::rref
