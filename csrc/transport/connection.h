#pragma once

// Connection: one stream socket carrying frames both ways.
//
// Ownership: held by shared_ptr (the agent's peer table and the loop handler,
// which holds a weak reference). Threads: reads and close() run on the loop;
// send() may be called from any thread and writes inline when nothing is
// queued, so a small message costs no thread hop. The callbacks run on the loop
// thread; onClose fires exactly once, also for a close() the agent asked for.
//
// Backpressure: while more than kMaxQueuedBytes wait to be written or to be
// copied by the peer (lent), send() blocks its caller (never the loop thread)
// until the peer reads, the connection closes, or the deadline passes.
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

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  static constexpr uint64_t kMaxQueuedBytes = 64ull << 20;

  static constexpr double kHandshakeSeconds = 10.0;

  using OnAuthenticated = std::function<void(const std::shared_ptr<Connection>&, int peerRank)>;
  using OnMessage = std::function<void(const std::shared_ptr<Connection>&, message::Message&&)>;
  using OnClose = std::function<void(const std::shared_ptr<Connection>&, const std::string& reason)>;

  Connection(Loop& loop, int fd, std::string description, std::string workerName,
             std::unique_ptr<auth::Handshake> handshake);
  ~Connection();

  // Registers with the loop and starts the handshake; callbacks may fire
  // from then on. onAuthenticated runs once, before any onMessage.
  void start(OnAuthenticated onAuthenticated, OnMessage onMessage, OnClose onClose);

  // Queues a message (encoding it here, on the caller's thread). Returns the
  // error if it cannot be encoded (kInvalid), the connection is closed, or
  // the deadline passed while waiting for the peer to drain the queue.
  common::Error send(message::Message&& message, std::chrono::steady_clock::time_point deadline);

  // Closes from any thread; onClose runs on the loop with this reason.
  void close(const std::string& reason);

  uint64_t id() const { return id_; }
  const std::string& description() const { return description_; }
  bool closed() const;
  // Open, and a send of `bytes` now would not wait for the peer to read.
  bool acceptsWithoutWaiting(uint64_t bytes) const;

  // The peer rank this connection belongs to, once known (-1 before the
  // handshake proved it).
  int peerRank() const { return peerRank_.load(); }

 private:
  struct Pending {
    message::OutgoingFrame frame;
    uint64_t written{0};
    uint64_t total{0};
  };

  void handleEventsFromLoop(uint32_t events);
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
  std::atomic<int> peerRank_{-1};
  uint64_t token_{0};

  OnAuthenticated onAuthenticated_;
  OnMessage onMessage_;
  OnClose onClose_;

  std::unique_ptr<auth::Handshake> handshake_;  // loop thread only
  std::atomic<bool> authenticated_{false};      // set on the loop, under mutex_
  int timerFd_{-1};                             // the handshake's deadline
  uint64_t timerToken_{0};
  int credPid_{-1};                             // Unix sockets: the peer's pid, from the kernel

  mutable std::mutex mutex_;
  std::condition_variable drained_;
  std::deque<Pending> queue_;
  uint64_t queuedBytes_{0};
  bool wantWrite_{false};
  bool closed_{false};
  std::string closeReason_;
  bool closeFired_{false};  // loop thread only

  // Same-host copy (same_host.h).
  bool offered_{false};                    // set in start(): a Unix socket, lending on: we offered
  std::atomic<uint64_t> lendFrom_{0};      // > 0 once the peer accepted our offer
  std::deque<std::vector<at::Tensor>> lent_;  // per lent frame, oldest first; mutex_
  uint64_t lentBytes_{0};                  // mutex_
  int peerPid_{-1};                        // loop thread only: the peer's verified pid (== credPid_)

  message::FrameReader reader_;  // loop thread only
  std::unique_ptr<char[]> readBuffer_;
};

}  // namespace torchrpc::transport
