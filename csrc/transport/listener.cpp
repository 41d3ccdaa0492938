#include "transport/listener.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "common/logging.h"
#include "transport/socket.h"

namespace torchrpc::transport {

Listener::Listener(Loop& loop, std::string workerName, OnAccept onAccept)
    : loop_(loop), workerName_(std::move(workerName)), onAccept_(std::move(onAccept)) {}

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
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        TORCHRPC_WARN(workerName_, common::errnoMessage("accept", errno));
      }
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
}

}  // namespace torchrpc::transport
