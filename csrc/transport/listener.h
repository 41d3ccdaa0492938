#pragma once

// Listener: the sockets a worker accepts connections on (one TCP, one Unix),
// registered with the loop. Each accepted socket goes to the callback, on the
// loop thread, already configured (non-blocking, TCP_NODELAY).

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
  void acceptFromLoop(int fd, const std::string& kind);

  Loop& loop_;
  const std::string workerName_;
  OnAccept onAccept_;
  std::vector<std::pair<int, uint64_t>> fds_;  // fd, loop token
};

}  // namespace torchrpc::transport
