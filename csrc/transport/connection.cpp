#include "transport/connection.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "message/receive_buffers.h"
#include "transport/same_host.h"

namespace torchrpc::transport {

namespace {
constexpr size_t kReadBufferBytes = 256 * 1024;
constexpr size_t kDirectReadThreshold = 64 * 1024;
constexpr size_t kMaxReadPerEvent = 64ull << 20;  // fairness between connections
constexpr int kMaxIov = 64;
std::atomic<uint64_t> nextConnectionId{1};

bool unixSocket(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && addr.ss_family == AF_UNIX;
}

bool lendFrame(message::MessageType t) {
  return t == message::MessageType::kLendOffer || t == message::MessageType::kLendAccept || t == message::MessageType::kLendRelease;
}

}  // namespace

Connection::Connection(Loop& loop, int fd, std::string description, std::string workerName,
                       std::unique_ptr<auth::Handshake> handshake, Limits limits)
    : loop_(loop),
      fd_(fd),
      description_(std::move(description)),
      workerName_(std::move(workerName)),
      id_(nextConnectionId.fetch_add(1)),
      limits_(limits),
      handshake_(std::move(handshake)),
      reader_(limits.maxFrameBytes),
      readBuffer_(new char[kReadBufferBytes]) {}

Connection::~Connection() {
  // closeFromLoop normally releases the fd; one that never ran (never started,
  // or the loop already stopped) releases it here. epoll forgets closed fds.
  if (!closeFired_) {
    ::close(fd_);
    if (timerFd_ >= 0) ::close(timerFd_);
  }
}

void Connection::start(OnAuthenticated onAuthenticated, OnMessage onMessage, OnClose onClose) {
  onAuthenticated_ = std::move(onAuthenticated);
  onMessage_ = std::move(onMessage);
  onClose_ = std::move(onClose);
  std::weak_ptr<Connection> weak = shared_from_this();
  const bool local = unixSocket(fd_);
  offered_ = same_host::enabled() && local;
  std::string refused;
  if (local) {
    // The kernel's word on who is at the other end: another user's process
    // is refused before it sends a byte; the pid is the one lending trusts.
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      refused = common::errnoMessage("SO_PEERCRED", errno);
    } else if (cred.uid != ::geteuid()) {
      refused = "refused a process of user " + std::to_string(cred.uid) + " (only user " +
                std::to_string(::geteuid()) + "'s processes may connect)";
    } else {
      credPid_ = cred.pid;
    }
  }
  timerFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timerFd_ >= 0) armTimer(kHandshakeSeconds, /*periodic=*/false);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    interest_ = EPOLLIN | EPOLLRDHUP;
    token_ = loop_.add(fd_, interest_, [weak](uint32_t events) {
      if (auto self = weak.lock()) {
        self->handleEventsFromLoop(events);
      }
    });
    if (timerFd_ >= 0) {
      timerToken_ = loop_.add(timerFd_, EPOLLIN, [weak](uint32_t) {
        auto self = weak.lock();
        if (!self || self->closeFired_) return;
        uint64_t expirations;
        (void)!::read(self->timerFd_, &expirations, sizeof(expirations));
        if (!self->authenticated_) {
          self->closeFromLoop("the handshake did not finish within " +
                              std::to_string(static_cast<int>(kHandshakeSeconds)) + " s");
        } else {
          self->heartbeatFromLoop();
        }
      });
    }
  }
  if (!refused.empty()) {
    close(refused);
    return;
  }
  if (common::Error err = writeRaw(handshake_->start())) close(err.what());
}

common::Error Connection::writeRaw(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return common::Error(common::Error::Code::kIo, common::errnoMessage("send (handshake)", errno));
    done += static_cast<size_t>(w);
  }
  return common::Error();
}

void Connection::stopTimerFromLoop() {
  if (timerFd_ < 0) return;
  loop_.remove(timerFd_, timerToken_);
  ::close(timerFd_);
  timerFd_ = -1;
}

bool Connection::handshakeFromLoop() {
  char buf[auth::Handshake::kProofBytes];
  while (handshake_->state() == auth::Handshake::State::kWaiting) {
    ssize_t r = ::read(fd_, buf, handshake_->wanted());
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      closeFromLoop(common::errnoMessage("read (handshake)", errno));
      return false;
    }
    if (r == 0) {
      closeFromLoop("connection closed by the peer during the handshake");
      return false;
    }
    size_t used = 0;
    std::string reply = handshake_->consume(buf, static_cast<size_t>(r), &used);
    if (!reply.empty()) {
      if (common::Error err = writeRaw(reply)) {
        closeFromLoop(err.what());
        return false;
      }
    }
  }
  if (handshake_->state() == auth::Handshake::State::kFailed) {
    TORCHRPC_WARN(workerName_, "closing " << description_ << ": handshake failed: " << handshake_->error());
    closeFromLoop("handshake failed: " + handshake_->error());
    return false;
  }
  heard();
  if (limits_.heartbeatSeconds > 0) {
    armTimer(limits_.heartbeatSeconds / 6, /*periodic=*/true);
  } else {
    stopTimerFromLoop();
  }
  peerRank_.store(handshake_->peerRank());
  common::Error err;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    authenticated_ = true;
    err = flushLocked();  // the frames sent while the handshake ran
    if (!err) updateInterestLocked();
  }
  if (err) {
    closeFromLoop(err.what());
    return false;
  }
  onAuthenticated_(shared_from_this(), handshake_->peerRank());
  if (offered_) sendControl(message::MessageType::kLendOffer, same_host::offer());
  return true;
}

void Connection::sendControl(message::MessageType type, std::string payload) {
  message::Message m{type, 0, std::move(payload), {}};
  // A closed connection has nothing left to agree on: the error needs no report.
  (void)send(std::move(m), std::chrono::steady_clock::time_point::max());
}

common::Error Connection::onLendFrame(const message::Message& m) {
  // Only a connection that offered (a Unix socket, lending on) takes part:
  // on TCP, whatever the peer sends, nothing is read from any process here.
  if (m.type == message::MessageType::kLendOffer) {
    if (!offered_) return common::Error();
    auto pid = same_host::verify(m.payload);
    if (!pid.error && pid.value != credPid_) {
      pid.error = common::Error(common::Error::Code::kInvalid, "the offer names pid " + std::to_string(pid.value) +
                                                                   ", but the kernel says the peer is pid " +
                                                                   std::to_string(credPid_));
    }
    if (pid.error) {
      TORCHRPC_DEBUG(workerName_, "tensors from " << description_ << " travel through the socket: "
                                                  << pid.error.what());
      return common::Error();
    }
    peerPid_ = pid.value;
    sendControl(message::MessageType::kLendAccept, "");
  } else if (m.type == message::MessageType::kLendAccept) {
    if (offered_) lendFrom_.store(same_host::kMinBytes);
  } else {  // kLendRelease: how many of the oldest lent frames the peer copied
    uint64_t frames = 0;
    if (m.payload.size() != sizeof(frames)) {
      return common::Error(common::Error::Code::kInvalid,
                   "malformed frame: LEND_RELEASE payload of " + std::to_string(m.payload.size()) + " bytes");
    }
    std::memcpy(&frames, m.payload.data(), sizeof(frames));
    std::lock_guard<std::mutex> lock(mutex_);
    if (frames > lent_.size()) {
      return common::Error(common::Error::Code::kInvalid, "malformed frame: LEND_RELEASE of " + std::to_string(frames) +
                                              " frames; " + std::to_string(lent_.size()) + " were lent");
    }
    for (; frames > 0; --frames) {
      for (const auto& b : lent_.front()) lentBytes_ -= b.bytes;
      lent_.pop_front();
    }
    drained_.notify_all();
  }
  return common::Error();
}

common::Error Connection::copyLent(message::ReceivedFrame& frame) {
  if (peerPid_ < 0) return common::Error(common::Error::Code::kInvalid, "the peer lent a tensor without a verified same-host offer");
  for (const message::LentTensor& l : frame.lent) {
    char* data = static_cast<char*>(frame.buffers[l.index].data_ptr());
    const uint64_t bytes = frame.bufferSpecs[l.index].nbytes;
    if (bytes >= message::receive_buffers::kMinBytes) message::receive_buffers::populate(data, bytes);
    if (common::Error err = same_host::copy(peerPid_, l.address, data, bytes)) {
      return common::Error(err.code(), "could not copy lent buffer #" + std::to_string(l.index) + ": " + err.what());
    }
  }
  std::string why = message::assembleTensors(frame);
  if (!why.empty()) return common::Error(common::Error::Code::kInvalid, "malformed frame: " + why);
  return common::Error();
}

bool Connection::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

bool Connection::quiet() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_ || (ticketsOut_.load() == 0 && !admissionWaits_.load() && queue_.empty() && lent_.empty());
}

bool Connection::acceptsWithoutWaiting(uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !closed_ && queuedBytes_ + lentBytes_ + bytes <= kMaxQueuedBytes / 2;
}

void Connection::updateInterestLocked() {
  const bool wantWrite = authenticated_ && !queue_.empty();
  // Paused, it hears of a hang-up through EPOLLHUP / EPOLLERR, which epoll
  // always reports.
  uint32_t events = (readPaused_ ? 0u : (EPOLLIN | EPOLLRDHUP)) | (wantWrite ? EPOLLOUT : 0u);
  if (events != interest_ && token_ != 0 && !closed_) {
    interest_ = events;
    loop_.modify(fd_, token_, events);
  }
}

common::Error Connection::flushLocked() {
  while (!queue_.empty()) {
    Pending& p = queue_.front();
    struct iovec iov[kMaxIov];
    int n = p.frame.fillIov(p.written, iov, kMaxIov);
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return common::Error();
      return common::Error(common::Error::Code::kIo, common::errnoMessage("send", errno));
    }
    p.written += static_cast<uint64_t>(w);
    queuedBytes_ -= static_cast<uint64_t>(w);
    if (p.written == p.total) {
      queue_.pop_front();
    }
  }
  return common::Error();
}

common::Error Connection::send(message::Message&& message, std::chrono::steady_clock::time_point deadline,
                               Ticket answers, bool mayWait) {
  const bool request = message::isRequest(message.type);
  const bool waitsNever = answers != nullptr;
  Pending p;
  p.answers = std::move(answers);
  try {
    p.frame = message::encodeFrame(std::move(message), lendFrom_.load());
  } catch (const c10::Error& e) {
    return common::Error(common::Error::Code::kInvalid, e.what_without_backtrace());
  }
  p.total = p.frame.totalBytes();
  uint64_t declared = p.frame.prefix.size() - sizeof(message::FrameHeader);
  for (const auto& b : p.frame.buffers) declared += b.bytes;
  for (const auto& b : p.frame.lent) declared += b.bytes;
  if (declared > limits_.maxFrameBytes) {
    // The peer would close the connection on it (assuming the job's workers
    // share their options): refuse it here, as the sender's mistake.
    return common::Error(common::Error::Code::kInvalid,
                         "the message is " + std::to_string(declared) + " bytes; workers accept at most " +
                             std::to_string(limits_.maxFrameBytes) + " per message (RpcOptions(max_message_bytes=...))");
  }
  common::Error writeError;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) return common::Error(common::Error::Code::kClosed, "connection " + description_ + " is closed (" + closeReason_ + ")");
    queuedBytes_ += p.total;
    // Silence counts from the first request awaiting a response, not from the last idle exchange.
    if (request && awaiting_.fetch_add(1) <= 0) heard();
    if (!p.frame.lent.empty()) {  // before the frame is written: the peer releases it after
      for (const auto& b : p.frame.lent) lentBytes_ += b.bytes;
      lent_.push_back(std::move(p.frame.lent));
    }
    queue_.push_back(std::move(p));
    if (queue_.size() == 1 && authenticated_) writeError = flushLocked();
    if (!writeError) {
      updateInterestLocked();
      if (mayWait && !waitsNever && !loop_.inLoop()) {
        while (queuedBytes_ + lentBytes_ > kMaxQueuedBytes && !closed_) {
          if (drained_.wait_until(lock, deadline) == std::cv_status::timeout) {
            return common::Error(common::Error::Code::kTimeout, "the peer did not read " + std::to_string(queuedBytes_) +
                                                    " queued and " + std::to_string(lentBytes_) + " lent bytes on " +
                                                    description_ + " before the deadline");
          }
        }
      }
    }
  }
  if (writeError) {
    close(writeError.what());
    return common::Error(writeError.code(), writeError.what() + " on " + description_);
  }
  return common::Error();
}

void Connection::close(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    // Stop further sends at once; the fd itself is released on the loop.
    closed_ = true;
    closeReason_ = reason;
    drained_.notify_all();
  }
  std::shared_ptr<Connection> self = shared_from_this();
  loop_.defer([self, reason] { self->closeFromLoop(reason); });
}

void Connection::closeFromLoop(const std::string& reason) {
  if (closeFired_) return;
  closeFired_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    if (closeReason_.empty()) closeReason_ = reason;
    queue_.clear();
    queuedBytes_ = 0;
    lent_.clear();
    lentBytes_ = 0;
    drained_.notify_all();
  }
  parked_.clear();
  parkedBytes_ = 0;
  if (token_ != 0) {
    loop_.remove(fd_, token_);
  }
  stopTimerFromLoop();
  ::close(fd_);
  if (onClose_) {
    onClose_(shared_from_this(), reason);
  }
}

void Connection::handleEventsFromLoop(uint32_t events) {
  if (closeFired_) return;
  // A bad connection closes alone: nothing it does may throw into the loop.
  try {
    if ((events & EPOLLOUT) && authenticated_) {
      common::Error err;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        const uint64_t before = queuedBytes_;
        err = flushLocked();
        if (queuedBytes_ < before) heard();  // the peer is draining our backlog
        if (queuedBytes_ <= kMaxQueuedBytes) drained_.notify_all();
        updateInterestLocked();
      }
      if (err) {
        closeFromLoop(err.what());
        return;
      }
      if (!parked_.empty()) admitFromLoop();  // the backlog may have drained
    }
    if (readPaused_ && (events & (EPOLLHUP | EPOLLERR))) {
      closeFromLoop("connection reset by the peer");
      return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      readFromLoop();
    }
  } catch (const std::exception& e) {
    TORCHRPC_WARN(workerName_, "closing " << description_ << ": " << e.what());
    closeFromLoop(std::string("internal error: ") + e.what());
  }
}

void Connection::readFromLoop() {
  if (!authenticated_ && !handshakeFromLoop()) return;
  size_t total = 0;
  std::string closeReason;
  uint64_t copiedFrames = 0;
  while (total < kMaxReadPerEvent && !readPaused_) {
    ssize_t r;
    auto direct = reader_.directReadRegion();
    bool useDirect = direct && direct->second >= kDirectReadThreshold;
    if (useDirect) {
      r = ::read(fd_, direct->first, direct->second);
    } else {
      r = ::read(fd_, readBuffer_.get(), kReadBufferBytes);
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      closeReason = common::errnoMessage("read", errno);
      break;
    }
    if (r == 0) {
      if (reader_.midFrame()) {
        closeReason = "truncated frame: connection closed by the peer in the middle of a frame";
        TORCHRPC_WARN(workerName_, "closing " << description_ << ": " << closeReason);
      } else {
        closeReason = "connection closed by the peer";
      }
      break;
    }
    heard();
    total += static_cast<size_t>(r);
    if (useDirect) {
      reader_.commitDirectRead(static_cast<size_t>(r));
    } else {
      reader_.consume(readBuffer_.get(), static_cast<size_t>(r));
    }
    // Deliver what arrived completely before acting on an error; requests
    // count against the caps at once, which may pause this loop.
    for (message::ReceivedFrame& f : reader_.takeFrames()) {
      common::Error err;
      if (lendFrame(f.message.type)) {
        err = onLendFrame(f.message);
        if (!err) continue;
      } else if (!f.lent.empty()) {
        err = copyLent(f);
        if (!err) ++copiedFrames;
      }
      if (err) {
        closeReason = err.what();
        break;
      }
      deliverFromLoop(std::move(f));
      if (closeFired_) return;
    }
    if (closeReason.empty() && !reader_.error().empty()) closeReason = "malformed frame: " + reader_.error();
    if (!closeReason.empty()) {
      TORCHRPC_WARN(workerName_, "closing " << description_ << ": " << closeReason);
      break;
    }
  }
  if (copiedFrames > 0) {
    sendControl(message::MessageType::kLendRelease,
                std::string(reinterpret_cast<const char*>(&copiedFrames), sizeof(copiedFrames)));
  }
  if (!closeReason.empty()) {
    closeFromLoop(closeReason);
  }
}

}  // namespace torchrpc::transport
