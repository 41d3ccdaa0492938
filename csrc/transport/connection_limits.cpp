// Connection's limits (connection.h): requests admitted with tickets, read
// backpressure, and heartbeats. The rest of Connection is in connection.cpp.

#include <sys/timerfd.h>

#include <chrono>
#include <cstdio>

#include "common/logging.h"
#include "transport/connection.h"

namespace torchrpc::transport {

namespace {

uint64_t messageBytes(const message::Message& m) {
  uint64_t bytes = m.payload.size();
  for (const auto& t : m.tensors) bytes += message::layout::wireBytes(t);
  return bytes;
}

}  // namespace

RequestTicket::~RequestTicket() {
  if (auto conn = conn_.lock()) conn->ticketReturned(bytes_);
}

int64_t Connection::nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Connection::armTimer(double seconds, bool periodic) {
  itimerspec spec{};
  if (seconds > 0) {
    auto ns = static_cast<int64_t>(seconds * 1e9);
    spec.it_value.tv_sec = ns / 1000000000;
    spec.it_value.tv_nsec = ns % 1000000000;
    if (periodic) spec.it_interval = spec.it_value;
  }
  ::timerfd_settime(timerFd_, 0, &spec, nullptr);
}

void Connection::heartbeatFromLoop() {
  if (awaiting_.load() <= 0) return;
  if (readPaused_) {
    heard();  // we are the one not reading: the peer sends plenty
    return;
  }
  // What waits in the socket counts: this loop may have been busy, not the peer.
  if (static_cast<double>(nowNs() - lastHeardNs_.load(std::memory_order_relaxed)) / 1e9 >= limits_.heartbeatSeconds) {
    readFromLoop();
    if (closeFired_) return;
  }
  const int64_t now = nowNs();
  const double silent = static_cast<double>(now - lastHeardNs_.load(std::memory_order_relaxed)) / 1e9;
  if (silent >= limits_.heartbeatSeconds) {
    closeFromLoop("the peer stopped responding: nothing heard for " + common::secondsText(silent, 1) + " s while " +
                  std::to_string(awaiting_.load()) + " request(s) awaited a response (heartbeat_timeout " +
                  common::secondsText(limits_.heartbeatSeconds, 1) + " s); it may be stopped, hung or cut off by the network");
    return;
  }
  const double sincePing = static_cast<double>(now - lastPingNs_) / 1e9;
  if (silent >= limits_.heartbeatSeconds / 3 && sincePing >= limits_.heartbeatSeconds / 3) {
    lastPingNs_ = now;
    sendControl(message::MessageType::kPing, "");
  }
}

void Connection::ticketReturned(uint64_t bytes) {
  ticketsOut_.fetch_sub(1);
  ticketBytesOut_.fetch_sub(bytes);
  // Only parked requests or a paused read wait for it (admitFromLoop
  // publishes that before its last look at ticketsOut_): admit on the loop.
  if (!admissionWaits_.load() || admitQueued_.exchange(true)) return;
  std::weak_ptr<Connection> weak = weak_from_this();
  loop_.defer([weak] {
    if (auto self = weak.lock()) {
      self->admitQueued_.store(false);
      if (!self->closeFired_) self->admitFromLoop();
    }
  });
}

bool Connection::overReadCapsFromLoop() const {
  return parked_.size() >= kParkedPerCall * limits_.maxCallsInFlight ||
         ticketBytesOut_.load() + parkedBytes_ >= limits_.maxPeerBytes;
}

bool Connection::outgoingBacklogged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queuedBytes_ + lentBytes_ > kMaxQueuedBytes;
}

void Connection::admitFromLoop() {
  // While the peer leaves kMaxQueuedBytes of ours unread, none of its
  // requests starts: their responses would only pile up in the queue.
  auto admissible = [this] {
    return !parked_.empty() && ticketsOut_.load() < limits_.maxCallsInFlight && !outgoingBacklogged();
  };
  bool paused;
  do {
    while (admissible()) {
      Parked p = std::move(parked_.front());
      parked_.pop_front();
      parkedBytes_ -= p.bytes;
      ticketsOut_.fetch_add(1);
      ticketBytesOut_.fetch_add(p.bytes);
      onMessage_(shared_from_this(), std::move(p.message),
                 std::make_shared<RequestTicket>(weak_from_this(), p.bytes));
      if (closeFired_) return;
    }
    paused = overReadCapsFromLoop();
    admissionWaits_.store(!parked_.empty() || paused);
  } while (admissible());  // a ticket returned before admissionWaits_ was set
  if (paused == readPaused_) return;  // only the loop writes it
  std::lock_guard<std::mutex> lock(mutex_);
  readPaused_ = paused;
  updateInterestLocked();
}

void Connection::deliverFromLoop(message::ReceivedFrame&& f) {
  const message::MessageType type = f.message.type;
  if (type == message::MessageType::kPing) {
    sendControl(message::MessageType::kPong, "");
    return;
  }
  if (type == message::MessageType::kPong) return;
  if (message::isResponse(type) && awaiting_.fetch_sub(1) <= 0) awaiting_.fetch_add(1);
  if (!message::isRequest(type)) {
    onMessage_(shared_from_this(), std::move(f.message), nullptr);
    return;
  }
  // Requests: in order, as tickets allow.
  const uint64_t bytes = messageBytes(f.message);
  parked_.push_back({std::move(f.message), bytes});
  parkedBytes_ += bytes;
  admitFromLoop();
}

}  // namespace torchrpc::transport
