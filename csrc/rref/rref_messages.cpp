#include "rref/rref_messages.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "message/payload.h"

namespace torchrpc::rref {

namespace {

constexpr size_t kIdBytes = 12;

void putId(std::string& out, const GlobalId& id) {
  char buf[kIdBytes];
  std::memcpy(buf, &id.worker, 4);
  std::memcpy(buf + 4, &id.local, 8);
  out.append(buf, kIdBytes);
}

GlobalId getId(const std::string& in, size_t offset) {
  GlobalId id;
  std::memcpy(&id.worker, in.data() + offset, 4);
  std::memcpy(&id.local, in.data() + offset + 4, 8);
  return id;
}

}  // namespace

message::Message remoteCallMessage(const RRefId& rrefId, const ForkId& forkId, message::Message&& call) {
  message::Message m;
  m.type = message::MessageType::kRemoteCall;
  m.payload.reserve(2 * kIdBytes + 2 + call.payload.size());
  putId(m.payload, rrefId);
  putId(m.payload, forkId);
  uint16_t inner = static_cast<uint16_t>(call.type);
  m.payload.append(reinterpret_cast<const char*>(&inner), 2);
  m.payload.append(call.payload);
  m.tensors = std::move(call.tensors);
  return m;
}

namespace {
constexpr size_t kRemoteHeader = 2 * kIdBytes + 2;
}  // namespace

message::MessageType remoteCallType(const message::Message& m) {
  TORCH_CHECK(m.payload.size() >= kRemoteHeader, "malformed REMOTE_CALL: ", m.payload.size(), " bytes");
  uint16_t inner;
  std::memcpy(&inner, m.payload.data() + 2 * kIdBytes, 2);
  auto type = static_cast<message::MessageType>(inner);
  TORCH_CHECK(type == message::MessageType::kScriptCall || type == message::MessageType::kBuiltinCall ||
                  type == message::MessageType::kPythonCall,
              "malformed REMOTE_CALL: inner type ", inner, " is not a call");
  return type;
}

message::Message parseRemoteCall(message::Message&& m, RRefId* rrefId, ForkId* forkId) {
  const message::MessageType type = remoteCallType(m);
  *rrefId = getId(m.payload, 0);
  *forkId = getId(m.payload, kIdBytes);
  message::Message call;
  call.type = type;
  call.id = m.id;
  call.payload = m.payload.substr(kRemoteHeader);
  call.tensors = std::move(m.tensors);
  return call;
}

message::Message methodCallMessage(const RRefId& rrefId, const std::string& name, c10::IValue args,
                          c10::IValue kwargs) {
  return message::ivalueMessage(message::MessageType::kRRefMethodCall, 0,
                       c10::ivalue::Tuple::create({static_cast<int64_t>(rrefId.worker), rrefId.local, name,
                                                   std::move(args), std::move(kwargs)}));
}

MethodCall parseMethodCall(const message::Message& m) {
  c10::IValue value = message::messageIValue(m);
  TORCH_CHECK(value.isTuple() && value.toTupleRef().elements().size() == 5,
              "malformed RREF_METHOD_CALL: expected (rref worker, rref id, name, args, kwargs)");
  const auto& el = value.toTupleRef().elements();
  TORCH_CHECK(el[0].isInt() && el[1].isInt() && el[2].isString() && el[3].isTuple() && el[4].isGenericDict(),
              "malformed RREF_METHOD_CALL: expected (int, int, str, tuple, dict)");
  return MethodCall{{static_cast<int32_t>(el[0].toInt()), el[1].toInt()}, el[2].toStringRef(), el[3], el[4]};
}

message::Message idsMessage(message::MessageType type, const GlobalId& a) {
  message::Message m;
  m.type = type;
  putId(m.payload, a);
  return m;
}

message::Message idsMessage(message::MessageType type, const GlobalId& a, const GlobalId& b) {
  message::Message m;
  m.type = type;
  putId(m.payload, a);
  putId(m.payload, b);
  return m;
}

void parseIds(const message::Message& m, GlobalId* a, GlobalId* b) {
  size_t expected = b ? 2 * kIdBytes : kIdBytes;
  TORCH_CHECK(m.payload.size() == expected, "malformed ", message::messageTypeName(m.type), ": expected ",
              expected, " bytes, got ", m.payload.size());
  *a = getId(m.payload, 0);
  if (b) *b = getId(m.payload, kIdBytes);
}

message::Message ackMessage(uint64_t id) { return message::ivalueMessage(message::MessageType::kScriptRet, id, c10::IValue()); }

}  // namespace torchrpc::rref
