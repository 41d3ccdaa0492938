#include "message/reply.h"

#include "common/logging.h"

namespace torchrpc::message {

Reply::Reply(uint64_t id, std::string worker, Send send) : state_(std::make_shared<State>()) {
  state_->id = id;
  state_->worker = std::move(worker);
  state_->send = std::move(send);
}

Reply::Reply(uint64_t id, std::string worker, OnValue onValue, OnError onError)
    : state_(std::make_shared<State>()) {
  state_->id = id;
  state_->worker = std::move(worker);
  state_->onValue = std::move(onValue);
  state_->onError = std::move(onError);
}

void Reply::value(c10::IValue value, const std::string& function) const {
  if (!state_->send) {
    if (claim()) state_->onValue(std::move(value));
    return;
  }
  Message response;
  try {
    response = ivalueMessage(MessageType::kScriptRet, state_->id, value);
  } catch (...) {
    response = exceptionMessage(state_->id, describeException(std::current_exception(), function, state_->worker));
  }
  message(std::move(response));
}

void Reply::error(const RemoteException& error) const {
  if (!state_->send) {
    if (claim()) state_->onError(error);
    return;
  }
  message(exceptionMessage(state_->id, error));
}

void Reply::message(Message&& response) const {
  if (!claim()) {
    TORCHRPC_DEBUG(state_->worker, "dropping a second answer to request #" << state_->id << " ("
                                       << messageTypeName(response.type) << ")");
    return;
  }
  if (state_->send) {
    state_->send(std::move(response));
    return;
  }
  // A local consumer: decode what a handler encoded.
  if (response.type == MessageType::kException) {
    state_->onError(messageException(response));
    return;
  }
  c10::IValue value;
  try {
    TORCH_CHECK(response.type == MessageType::kScriptRet, "a ", messageTypeName(response.type),
                " response where a value was expected");
    value = messageIValue(response);
  } catch (...) {
    state_->onError(describeException(std::current_exception(), "<decoding a result>", state_->worker));
    return;
  }
  state_->onValue(std::move(value));
}

Reply Reply::through(std::function<void(Message&)> before) const {
  if (!state_->send) return *this;
  return Reply(state_->id, state_->worker, [before = std::move(before), inner = *this](Message&& m) {
    before(m);
    inner.message(std::move(m));
  });
}

}  // namespace torchrpc::message
