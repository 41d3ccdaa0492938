#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"

namespace torchrpc::transport {

namespace {

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

socklen_t unixSockaddr(const std::string& name, sockaddr_un* sa) {
  std::memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  TORCH_CHECK(name.size() + 1 < sizeof(sa->sun_path),
              "unix socket name too long: ", name);
  // Abstract namespace: a leading NUL byte, no file on disk to clean up.
  std::memcpy(sa->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

std::string formatTcp(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
    return "tcp://" + std::string(buf) + ":" + std::to_string(port);
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
  port = ntohs(a->sin6_port);
  return "tcp://[" + std::string(buf) + "]:" + std::to_string(port);
}

}  // namespace

SocketAddress parseAddress(const std::string& address) {
  SocketAddress out;
  if (address.rfind("unix:@", 0) == 0) {
    out.isUnix = true;
    out.host = address.substr(6);
    TORCH_CHECK(!out.host.empty(), "empty unix socket name in address '", address, "'");
    return out;
  }
  TORCH_CHECK(address.rfind("tcp://", 0) == 0, "unsupported transport address '",
              address, "' (expected tcp://host:port or unix:@name)");
  std::string rest = address.substr(6);
  auto colon = rest.rfind(':');
  TORCH_CHECK(colon != std::string::npos && colon + 1 < rest.size(),
              "address '", address, "' has no port");
  out.host = rest.substr(0, colon);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  try {
    out.port = std::stoi(rest.substr(colon + 1));
  } catch (const std::exception&) {
    TORCH_CHECK(false, "address '", address, "' has an invalid port");
  }
  TORCH_CHECK(out.port >= 0 && out.port < 65536, "address '", address,
              "' has an out-of-range port");
  return out;
}

int listenTcp(const std::string& host, int port, std::string* boundAddress) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string portStr = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), portStr.c_str(), &hints, &res);
  TORCH_CHECK(rc == 0, "cannot resolve listen address '", host, "': ", gai_strerror(rc));
  std::string lastError;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      lastError = common::errnoMessage("socket", errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      lastError = common::errnoMessage("bind/listen", errno);
      ::close(fd);
      continue;
    }
    setNonBlocking(fd);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    *boundAddress = formatTcp(ss);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  TORCH_CHECK(false, "cannot listen on ", host, ":", port, ": ", lastError);
}

int listenUnix(const std::string& abstractName, std::string* boundAddress) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(fd >= 0, common::errnoMessage("socket(AF_UNIX)", errno));
  sockaddr_un sa;
  socklen_t len = unixSockaddr(abstractName, &sa);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(fd, 1024) != 0) {
    int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "cannot listen on unix:@", abstractName, ": ",
                common::errnoMessage("bind/listen", err));
  }
  setNonBlocking(fd);
  *boundAddress = "unix:@" + abstractName;
  return fd;
}

namespace {
constexpr int kSocketBufferBytes = 4 << 20;
}  // namespace

void configureConnectedSocket(int fd) {
  setNonBlocking(fd);
  int one = 1;
  // Fails harmlessly (ENOTSUP/EOPNOTSUPP) on Unix sockets.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Large tensors move in fewer, larger writes and wake-ups. The kernel caps
  // the request at net.core.[wr]mem_max; small messages are unaffected.
  int bytes = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

common::Fallible<int> connectTo(const std::string& address, double timeoutSeconds) {
  auto failed = [](std::string what, int fd = -1) {
    if (fd >= 0) ::close(fd);
    return common::Fallible<int>{-1, common::Error(common::Error::Code::kIo, std::move(what))};
  };
  SocketAddress a;
  try {
    a = parseAddress(address);
  } catch (const c10::Error& e) {
    return failed(e.what_without_backtrace());
  }
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family;
  if (a.isUnix) {
    family = AF_UNIX;
    len = unixSockaddr(a.host, reinterpret_cast<sockaddr_un*>(&ss));
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &res);
    if (rc != 0 || res == nullptr) {
      return failed(std::string("cannot resolve '") + a.host + "': " + gai_strerror(rc));
    }
    family = res->ai_family;
    std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
    len = res->ai_addrlen;
    freeaddrinfo(res);
  }
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return failed(common::errnoMessage("socket", errno));
  }
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len);
  if (rc != 0 && errno != EINPROGRESS && errno != EAGAIN) {
    return failed(common::errnoMessage("connect", errno), fd);
  }
  if (rc != 0) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration<double>(timeoutSeconds > 0 ? timeoutSeconds : 1e9);
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        return failed("connect: timed out", fd);
      }
      pollfd p{fd, POLLOUT, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::min<long>(left, 1 << 30)));
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) break;
    }
    int soErr = 0;
    socklen_t l = sizeof(soErr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soErr, &l);
    if (soErr != 0) {
      return failed(common::errnoMessage("connect", soErr), fd);
    }
  }
  configureConnectedSocket(fd);
  return {fd, common::Error()};
}

}  // namespace torchrpc::transport
