#include "transport/listener.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "common/logging.h"
#include "transport/socket.h"

namespace torchrpc::transport {

Listener::Listener(Loop& loop, std::string workerName, OnAccept onAccept)
    : loop_(loop), workerName_(std::move(workerName)), onAccept_(std::move(onAccept)) {
  backoffFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (backoffFd_ >= 0) {
    backoffToken_ = loop_.add(backoffFd_, EPOLLIN, [this](uint32_t) {
      uint64_t expirations;
      (void)!::read(backoffFd_, &expirations, sizeof(expirations));
      setListening(true);
    });
  }
}

void Listener::setListening(bool on) {
  for (auto& [fd, token] : fds_) loop_.modify(fd, token, on ? EPOLLIN : 0u);
}

Listener::~Listener() { close(); }

std::string Listener::listenTcp(const std::string& host) {
  std::string bound;
  int fd = torchrpc::transport::listenTcp(host, 0, &bound);
  fds_.emplace_back(fd, loop_.add(fd, EPOLLIN, [this, fd](uint32_t) { acceptFromLoop(fd, "tcp"); }));
  return bound;
}

std::string Listener::listenUnix(const std::string& abstractName) {
  std::string bound;
  int fd = torchrpc::transport::listenUnix(abstractName, &bound);
  fds_.emplace_back(fd, loop_.add(fd, EPOLLIN, [this, fd](uint32_t) { acceptFromLoop(fd, "unix"); }));
  return bound;
}

void Listener::acceptFromLoop(int listenFd, const std::string& kind) {
  while (true) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        TORCHRPC_WARN(workerName_, common::errnoMessage("accept", err)
                                       << "; not accepting connections for " << kBackoffSeconds * 1000
                                       << " ms (raise the open-file limit, ulimit -n, if this repeats)");
        if (backoffFd_ >= 0) {
          setListening(false);
          itimerspec spec{};
          spec.it_value.tv_nsec = static_cast<long>(kBackoffSeconds * 1e9);
          ::timerfd_settime(backoffFd_, 0, &spec, nullptr);
        }
        return;
      }
      // A connection that failed before we took it: on to the next one.
      if (err == ECONNABORTED || err == EPROTO || err == EPERM) continue;
      TORCHRPC_WARN(workerName_, common::errnoMessage("accept", err));
      return;
    }
    configureConnectedSocket(fd);
    onAccept_(fd, "incoming " + kind + " connection");
  }
}

void Listener::close() {
  for (auto& [fd, token] : fds_) {
    loop_.remove(fd, token);
    ::close(fd);
  }
  fds_.clear();
  if (backoffFd_ >= 0) {
    loop_.remove(backoffFd_, backoffToken_);
    ::close(backoffFd_);
    backoffFd_ = -1;
  }
}

}  // namespace torchrpc::transport
