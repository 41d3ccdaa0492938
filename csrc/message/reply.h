#pragma once

// Reply: where the outcome of one request goes, exactly once.
//
// Either back to its caller as a response message (over the connection the
// request came on, or into this worker's own pending call), or to a local
// consumer that wants the value itself: the owner creating an RRef's value
// keeps the object, so nothing is encoded. Handlers answer with value(),
// error() or message(); one that can make its result either way (the Python
// bridge: the object itself, or its pickle) asks wantsValue().
//
// Copies share one state: the first answer wins and later ones are dropped,
// so a handler that answered and then threw cannot answer twice. Any thread
// may answer.

#include <ATen/core/ivalue.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "message/message.h"
#include "message/payload.h"

namespace torchrpc::message {

class Reply {
 public:
  using Send = std::function<void(Message&&)>;
  using OnValue = std::function<void(c10::IValue)>;
  using OnError = std::function<void(const RemoteException&)>;

  // To the caller: every answer becomes a response message for `send`.
  // `worker` (this worker's name) labels errors the reply itself reports.
  Reply(uint64_t id, std::string worker, Send send);
  // To a local consumer of the value.
  Reply(uint64_t id, std::string worker, OnValue onValue, OnError onError);

  uint64_t id() const { return state_->id; }
  bool wantsValue() const { return !state_->send; }
  // Whether an answer was given already.
  bool answered() const { return state_->answered.load(); }

  // A result IValue: SCRIPT_RET for the caller; if it cannot be encoded (a
  // tensor the wire refuses), the error, naming `function`.
  void value(c10::IValue value, const std::string& function = "<result>") const;
  void error(const RemoteException& error) const;
  // A response already encoded (SCRIPT_RET, PYTHON_RET or EXCEPTION); a local
  // consumer gets its value or error decoded.
  void message(Message&& response) const;
  void operator()(Message&& response) const { message(std::move(response)); }

  // The same reply, with `before` applied to the response message first
  // (e.g. wrapping it in an envelope). A local consumer is unaffected.
  Reply through(std::function<void(Message&)> before) const;

 private:
  struct State {
    uint64_t id{0};
    std::string worker;
    Send send;
    OnValue onValue;
    OnError onError;
    std::atomic<bool> answered{false};
  };
  explicit Reply(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // True for the first answer only.
  bool claim() const { return !state_->answered.exchange(true); }

  std::shared_ptr<State> state_;
};

}  // namespace torchrpc::message
