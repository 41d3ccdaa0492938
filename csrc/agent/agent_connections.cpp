// The Agent's connections (agent.h): accepting them within the caps, dialing
// a peer, learning who proved which rank, and losing them. The rest of Agent
// is in agent.cpp.

#include <unistd.h>

#include <cstdio>

#include "agent/agent.h"
#include "common/logging.h"
#include "transport/socket.h"

namespace torchrpc::agent {

std::unique_ptr<auth::Handshake> Agent::handshake(auth::Handshake::Role role, int dst) const {
  // Any rank of the job but this one's (a peer may connect before setPeers,
  // and a worker joining a dynamic job before the members know it).
  return std::make_unique<auth::Handshake>(role, options_.secret, options_.rank, dst,
                                           [this](int32_t rank) { return members_.admissible(rank); });
}

void Agent::accept(int fd, const std::string& description) {
  size_t open = 0, handshaking = 0;
  std::shared_ptr<transport::Connection> oldest;  // of those still in their handshake
  {
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    for (const auto& [id, conn] : connections_) {
      if (conn->closed()) continue;
      ++open;
      if (conn->peerRank() >= 0) continue;
      ++handshaking;
      if (!oldest || id < oldest->id()) oldest = conn;
    }
  }
  if (open >= maxConnections() && handshaking == 0) {
    ::close(fd);
    TORCHRPC_WARN(options_.name, "refused an " << description << ": " << open << " connections are open (the cap is "
                                              << maxConnections() << ")");
    return;
  }
  if (open >= maxConnections() || handshaking >= AgentOptions::kMaxHandshaking) {
    // A member proves itself in milliseconds: the oldest unproven connection
    // is the likeliest to be an outsider's (or dead), and makes room.
    TORCHRPC_WARN(options_.name, "closing the oldest of " << handshaking << " connections still in their handshake ("
                                                         << oldest->description() << ") to take a new one");
    oldest->closeOnLoop("too many connections in their handshake; this one was the oldest");
  }
  adopt(std::make_shared<transport::Connection>(*loop_, fd, description, options_.name,
                                                handshake(auth::Handshake::Role::kAcceptor, -1), options_.limits));
}

void Agent::adopt(const std::shared_ptr<transport::Connection>& conn) {
  {
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    connections_[conn->id()] = conn;
  }
  conn->start(
      [this](const std::shared_ptr<transport::Connection>& c, int rank) { onAuthenticatedFromLoop(c, rank); },
      [this](const std::shared_ptr<transport::Connection>& c, message::Message&& m, transport::Ticket t) {
        onMessageFromLoop(c, std::move(m), std::move(t));
      },
      [this](const std::shared_ptr<transport::Connection>& c, const std::string& reason) {
        onCloseFromLoop(c, reason);
      });
}

common::Fallible<std::shared_ptr<transport::Connection>> Agent::connectionTo(const PeerInfo& p, double timeoutSeconds) {
  auto link = members_.link(p.rank);
  if (!link) return {nullptr, common::Error(common::Error::Code::kClosed, p.name + " is not a worker of the job")};
  PeerLink& state = *link;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.conn && !state.conn->closed()) return {state.conn, common::Error()};
  }
  std::lock_guard<std::mutex> connecting(state.connectMutex);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.conn && !state.conn->closed()) return {state.conn, common::Error()};
  }
  const std::string& address = p.addressFrom(options_.hostId);
  double connectTimeout = timeoutSeconds > 0 ? std::min(timeoutSeconds, 30.0) : 30.0;
  auto fd = transport::connectTo(address, connectTimeout);
  if (fd.error) return {nullptr, fd.error};
  // Requests sent now wait in the connection until the handshake proved who
  // answered; a failed handshake closes it and fails them, saying why.
  auto conn = std::make_shared<transport::Connection>(*loop_, fd.value, "connection to " + p.name + " (" + address + ")",
                                                      options_.name, handshake(auth::Handshake::Role::kConnector, p.rank),
                                                      options_.limits);
  adopt(conn);
  std::lock_guard<std::mutex> lock(state.mutex);
  state.conn = conn;
  return {conn, common::Error()};
}

void Agent::onAuthenticatedFromLoop(const std::shared_ptr<transport::Connection>& conn, int rank) {
  // Reuse the peer's connection for our own requests, unless we opened one
  // too (or it is not a member yet: a worker joining a dynamic job).
  auto link = members_.link(rank);
  if (!link) return;
  std::lock_guard<std::mutex> lock(link->mutex);
  if (!link->conn || link->conn->closed()) link->conn = conn;
}

void Agent::onCloseFromLoop(const std::shared_ptr<transport::Connection>& conn, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    connections_.erase(conn->id());
  }
  // The proven rank; else, for a connection this worker dialed, the rank it
  // dialed (a peer that dies before its handshake is lost all the same).
  int rank = members_.unlink(conn);
  if (rank < 0) rank = conn->peerRank();
  bool goodbye = saidGoodbye_.erase(conn->id()) > 0;
  auto member = rank >= 0 ? members_.find(rank) : nullptr;
  std::string peerName = member ? member->name : "the peer";
  if (shuttingDown_.load()) {
    pending_.failConnection(conn->id(), common::ErrorKind::kShutdown, [&](const Pending::Call& c) {
      return c.description + ": torchrpc shut down on " + options_.name + " before a response arrived";
    });
    return;
  }
  if (!goodbye && rank >= 0) {
    TORCHRPC_DEBUG(options_.name, "lost " << conn->description() << ": " << reason);
    for (const auto& lost : peerLost_) {
      try {
        lost(rank, reason);
      } catch (const std::exception& e) {  // nothing escapes the loop thread
        TORCHRPC_WARN(options_.name, "a peer-lost callback failed: " << e.what());
      }
    }
  }
  pending_.failConnection(conn->id(), common::ErrorKind::kPeerUnreachable, [&](const Pending::Call& c) {
    std::string elapsed =
        common::secondsText(std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count());
    if (goodbye) {
      return c.description + ": " + peerName + " shut down after " + elapsed +
             " s, before a response arrived";
    }
    return c.description + ": " + reason + " after " + elapsed + " s, before a response arrived; " +
           peerName + " may have exited, check its log";
  });
}

bool Agent::reachable(int rank, double timeoutSeconds) {
  if (rank == options_.rank) return true;
  auto peer = members_.find(rank);
  if (!peer || shuttingDown_.load()) return false;
  return !connectionTo(*peer, timeoutSeconds).error;
}

}  // namespace torchrpc::agent
