#pragma once

// Plain socket helpers for the transport: address parsing, listening and a
// connect with a deadline. Addresses are strings so they can be published in
// the rendezvous store:
//   "tcp://10.0.0.2:29500"        TCP (between hosts)
//   "unix:@torchrpc-1234-abcd"    Linux abstract Unix socket (within a host)

#include <string>

#include "common/error.h"

namespace torchrpc::transport {

struct SocketAddress {
  bool isUnix{false};
  std::string host;  // tcp: numeric IPv4/IPv6 or name; unix: abstract name
  int port{0};
};

// Throws c10::Error naming the address when it cannot be parsed.
SocketAddress parseAddress(const std::string& address);

// Listening sockets (non-blocking, close-on-exec). Return the fd; the bound
// address is written to *boundAddress. Throw c10::Error on failure.
int listenTcp(const std::string& host, int port, std::string* boundAddress);
int listenUnix(const std::string& abstractName, std::string* boundAddress);

// Connects with a deadline; returns a non-blocking fd, or the error.
common::Fallible<int> connectTo(const std::string& address, double timeoutSeconds);

// Applies the per-connection options: non-blocking, TCP_NODELAY on TCP.
void configureConnectedSocket(int fd);

}  // namespace torchrpc::transport
