#pragma once

// Listener: the sockets a worker accepts connections on (one TCP, one Unix),
// registered with the loop. Each accepted socket goes to the callback, on the
// loop thread, already configured (non-blocking, TCP_NODELAY).
//
// When accept fails for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM),
// the pending connection stays in the backlog and epoll would report it again
// at once: the listener stops listening for kBackoffSeconds instead (one
// warning), so the worker neither spins nor floods its log.

#include <functional>
#include <string>
#include <vector>

#include "transport/loop.h"

namespace torchrpc::transport {

class Listener {
 public:
  using OnAccept = std::function<void(int fd, const std::string& description)>;

  Listener(Loop& loop, std::string workerName, OnAccept onAccept);
  ~Listener();

  // Both return the address to publish.
  std::string listenTcp(const std::string& host);
  std::string listenUnix(const std::string& abstractName);
  void close();

 private:
  static constexpr double kBackoffSeconds = 0.1;

  void acceptFromLoop(int fd, const std::string& kind);
  // Stops (or resumes) listening on every socket.
  void setListening(bool on);

  Loop& loop_;
  const std::string workerName_;
  OnAccept onAccept_;
  std::vector<std::pair<int, uint64_t>> fds_;  // fd, loop token
  int backoffFd_{-1};                         // timerfd: the end of a back-off
  uint64_t backoffToken_{0};
};

}  // namespace torchrpc::transport
