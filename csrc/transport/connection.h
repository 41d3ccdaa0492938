#pragma once

// Connection: one stream socket carrying frames both ways. Its limits
// (admission, read backpressure, heartbeats) are in connection_limits.cpp.
//
// Ownership: held by shared_ptr (the agent's peer table and the loop handler,
// which holds a weak reference). Threads: reads and close() run on the loop;
// send() may be called from any thread and writes inline when nothing is
// queued, so a small message costs no thread hop. The callbacks run on the loop
// thread; onClose fires exactly once, also for a close() the agent asked for.
//
// Backpressure, outgoing: while more than kMaxQueuedBytes wait to be written
// or to be copied by the peer (lent), a send() that may wait blocks its
// caller until the peer reads, the connection closes, or the deadline passes.
// The loop never waits, and neither does a response: it carries its
// request's ticket, and a peer that does not read its responses runs out of
// tickets (below), so pool threads never block on a slow reader.
//
// Backpressure, incoming (Limits): each request read is admitted with a
// Ticket, which lives until its response is written (or the request is
// dropped). At most maxCallsInFlight tickets are out, and none is given while
// kMaxQueuedBytes of ours wait for the peer to read; requests beyond wait,
// parked in order, while responses and control frames still flow (a
// request waiting for a nested call's response must get it). When the parked
// requests reach kParkedPerCall * maxCallsInFlight, or the requests held (in
// flight and parked) reach maxPeerBytes, the connection stops reading until
// tickets come back; a peer whose calls wait on nested calls back to it can
// then stall until the heartbeat closes the connection, so the parked room is
// wide. A frame over maxFrameBytes closes the connection before anything is
// allocated for it.
//
// Heartbeats: while calls sent on this connection await responses and
// nothing has come from the peer for heartbeatSeconds / 3, it is sent a PING
// (answered by its connection, not its pool); when nothing has come for
// heartbeatSeconds, the connection closes, failing those calls with an error
// that names the peer. A peer draining a backlog of ours counts as heard.
//
// Same host: on a Unix socket the two ends lend each other large tensors
// instead of writing them (transport/same_host.h); the frames that do this
// (LEND_*) stay inside the connection.
//
// Authentication: every connection starts with the handshake of
// auth/handshake.h, within kHandshakeSeconds. Until it succeeds no frame is
// read or written (frames sent meanwhile wait in the queue), and a Unix
// socket whose peer runs as another user is closed at once (SO_PEERCRED).

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "auth/handshake.h"
#include "common/error.h"
#include "message/wire.h"
#include "transport/loop.h"

namespace torchrpc::transport {

class Connection;

// A request read from a connection and not answered yet: it counts against
// the connection's caps while it lives. The response that answers it carries
// it until written; dropping it (a request that needs no response) returns
// it at once.
class RequestTicket {
 public:
  RequestTicket(std::weak_ptr<Connection> conn, uint64_t bytes) : conn_(std::move(conn)), bytes_(bytes) {}
  ~RequestTicket();
  RequestTicket(const RequestTicket&) = delete;
  RequestTicket& operator=(const RequestTicket&) = delete;

 private:
  std::weak_ptr<Connection> conn_;
  uint64_t bytes_;
};
using Ticket = std::shared_ptr<RequestTicket>;

struct Limits {
  uint64_t maxFrameBytes{message::kDefaultMaxFrameBytes};
  uint64_t maxPeerBytes{4ull << 30};
  size_t maxCallsInFlight{256};
  double heartbeatSeconds{30.0};  // <= 0: no heartbeats
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  static constexpr uint64_t kMaxQueuedBytes = 64ull << 20;

  static constexpr double kHandshakeSeconds = 10.0;
  static constexpr size_t kParkedPerCall = 64;

  using OnAuthenticated = std::function<void(const std::shared_ptr<Connection>&, int peerRank)>;
  // A request comes with its ticket; other frames with none.
  using OnMessage = std::function<void(const std::shared_ptr<Connection>&, message::Message&&, Ticket)>;
  using OnClose = std::function<void(const std::shared_ptr<Connection>&, const std::string& reason)>;

  Connection(Loop& loop, int fd, std::string description, std::string workerName,
             std::unique_ptr<auth::Handshake> handshake, Limits limits = Limits());
  ~Connection();

  // Registers with the loop and starts the handshake; callbacks may fire
  // from then on. onAuthenticated runs once, before any onMessage.
  void start(OnAuthenticated onAuthenticated, OnMessage onMessage, OnClose onClose);

  // Queues a message (encoding it here, on the caller's thread). Returns the
  // error if it cannot be encoded (kInvalid), the connection is closed, or
  // the deadline passed while waiting for the peer to drain the queue. A
  // response passes the ticket of its request; it never waits, nor does a
  // send with mayWait false (pool threads) or one from the loop.
  common::Error send(message::Message&& message, std::chrono::steady_clock::time_point deadline,
                     Ticket answers = nullptr, bool mayWait = true);

  // Closes from any thread; onClose runs on the loop with this reason.
  void close(const std::string& reason);
  // Closes at once (the fd too); on the loop thread only.
  void closeOnLoop(const std::string& reason) { closeFromLoop(reason); }

  uint64_t id() const { return id_; }
  const std::string& description() const { return description_; }
  bool closed() const;
  // Closed, or nothing of the peer's waits on this end: every request read
  // was answered and its response written, none is parked, and the peer
  // copied every tensor lent to it. A graceful shutdown waits for this.
  bool quiet() const;
  // Requests read and not answered yet (their tickets).
  size_t unanswered() const { return ticketsOut_.load(); }
  // Open, and a send of `bytes` now would not wait for the peer to read.
  bool acceptsWithoutWaiting(uint64_t bytes) const;

  // The peer rank this connection belongs to, once known (-1 before the
  // handshake proved it).
  int peerRank() const { return peerRank_.load(); }

 private:
  friend class RequestTicket;

  struct Pending {
    message::OutgoingFrame frame;
    uint64_t written{0};
    uint64_t total{0};
    Ticket answers;  // the request this response answers: returned once written
  };
  struct Parked {
    message::Message message;
    uint64_t bytes;
  };

  void handleEventsFromLoop(uint32_t events);
  // A ticket came back (any thread): admit parked requests on the loop.
  void ticketReturned(uint64_t bytes);
  // Hands a frame on (requests with a ticket, or parked). Loop thread.
  void deliverFromLoop(message::ReceivedFrame&& frame);
  // Gives parked requests the tickets that are free, and resumes reading
  // when below the caps. Loop thread.
  void admitFromLoop();
  bool overReadCapsFromLoop() const;
  // More than kMaxQueuedBytes of ours wait for the peer to read them.
  bool outgoingBacklogged() const;
  void heartbeatFromLoop();
  void heard() { lastHeardNs_.store(nowNs(), std::memory_order_relaxed); }
  static int64_t nowNs();
  // Reads and answers handshake bytes; true once authenticated.
  bool handshakeFromLoop();
  // Writes handshake bytes (tiny; the socket's buffer is empty then).
  common::Error writeRaw(const std::string& bytes);
  void stopTimerFromLoop();
  void readFromLoop();
  void closeFromLoop(const std::string& reason);
  // Writes as much of the queue as the socket takes. mutex_ held. Returns the
  // error of a fatal write.
  common::Error flushLocked();
  void updateInterestLocked();
  // Starts (or ends, with seconds <= 0) the periodic heartbeat timer. Loop thread.
  void armTimer(double seconds, bool periodic);
  // A connection control frame, from the loop or at start (never waits).
  void sendControl(message::MessageType type, std::string payload);
  // LEND_OFFER / LEND_ACCEPT / LEND_RELEASE from the peer; the error for
  // which the connection must close, if any. Loop thread.
  common::Error onLendFrame(const message::Message& m);
  // Copies a frame's lent tensors from the peer. Loop thread.
  common::Error copyLent(message::ReceivedFrame& frame);

  Loop& loop_;
  const int fd_;
  const std::string description_;
  const std::string workerName_;
  const uint64_t id_;
  const Limits limits_;
  std::atomic<int> peerRank_{-1};
  uint64_t token_{0};

  OnAuthenticated onAuthenticated_;
  OnMessage onMessage_;
  OnClose onClose_;

  std::unique_ptr<auth::Handshake> handshake_;  // loop thread only
  std::atomic<bool> authenticated_{false};      // set on the loop, under mutex_
  int timerFd_{-1};                             // the handshake's deadline, then the heartbeat
  uint64_t timerToken_{0};
  int credPid_{-1};                             // Unix sockets: the peer's pid, from the kernel

  mutable std::mutex mutex_;
  std::condition_variable drained_;
  std::deque<Pending> queue_;
  uint64_t queuedBytes_{0};
  bool readPaused_{false};  // over the read caps: EPOLLIN off
  uint32_t interest_{0};    // the events registered with the loop
  bool closed_{false};
  std::string closeReason_;
  bool closeFired_{false};  // loop thread only

  // Same-host copy (same_host.h).
  bool offered_{false};                    // set in start(): a Unix socket, lending on: we offered
  std::atomic<uint64_t> lendFrom_{0};      // > 0 once the peer accepted our offer
  std::deque<std::vector<message::layout::Buffer>> lent_;  // per lent frame, oldest first; mutex_
  uint64_t lentBytes_{0};                  // mutex_
  int peerPid_{-1};                        // loop thread only: the peer's verified pid (== credPid_)

  // Incoming admission (see Backpressure, incoming).
  std::atomic<size_t> ticketsOut_{0};
  std::atomic<uint64_t> ticketBytesOut_{0};
  std::atomic<bool> admitQueued_{false};  // an admitFromLoop is deferred
  std::atomic<bool> admissionWaits_{false};  // requests parked or reading paused: a returned ticket admits
  std::deque<Parked> parked_;             // loop thread only
  uint64_t parkedBytes_{0};               // loop thread only

  // Heartbeats: requests sent minus responses received; when the peer was last heard.
  std::atomic<int64_t> awaiting_{0};
  std::atomic<int64_t> lastHeardNs_{0};
  int64_t lastPingNs_{0};  // loop thread only

  message::FrameReader reader_;  // loop thread only
  std::unique_ptr<char[]> readBuffer_;
};

}  // namespace torchrpc::transport
