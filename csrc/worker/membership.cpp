#include "worker/membership.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "transport/socket.h"

namespace torchrpc::worker {

namespace {

// How long a member that may have died gets to accept a connection.
constexpr double kProbeSeconds = 1.0;

message::Message recordMessage(message::MessageType type, const agent::PeerInfo& me) {
  message::Message m;
  m.type = type;
  m.payload = rendezvous::encodePeer(me);
  return m;
}

}  // namespace

Membership::Membership(std::shared_ptr<agent::Agent> agent, rendezvous::Rendezvous& rendezvous)
    : agent_(std::move(agent)), rendezvous_(rendezvous) {}

Membership::~Membership() {
  if (!locked_) return;
  try {
    unlock();
  } catch (const std::exception& e) {  // the store is gone: nothing left to give back
    TORCHRPC_WARN(me_.name, "cannot give back the membership token: " << e.what());
  }
}

void Membership::unlock() {
  locked_ = false;
  rendezvous_.unlockMembership();
}

void Membership::lock(const std::string& doing) {
  std::string tookOver =
      rendezvous_.lockMembership(me_, doing, [this](const agent::PeerInfo& holder) { return listens(holder); });
  locked_ = true;
  if (!tookOver.empty()) {
    TORCHRPC_WARN(me_.name, "took over the job's membership token from " << tookOver << ", which no longer accepts "
                                                                         << "connections: it died while joining or leaving");
  }
}

bool Membership::listens(const agent::PeerInfo& holder) const {
  // A holder listens until it gives the token back. Two tries: one refused
  // connection must not end a live holder's turn.
  for (int attempt = 1;; ++attempt) {
    auto fd = transport::connectTo(holder.addressFrom(me_.hostId), kProbeSeconds);
    if (!fd.error) {
      ::close(fd.value);
      return true;
    }
    if (attempt == 2) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::vector<agent::PeerInfo> Membership::enter(const agent::PeerInfo& me) {
  me_ = me;
  lock("joining");
  rendezvous_.claimKind();
  auto peers = rendezvous_.members();
  for (const auto& p : peers) {
    // RuntimeError with "is not unique", as upstream's.
    TORCH_CHECK(p.rank != me.rank && p.name != me.name, "worker '", me.name, "' (rank ", me.rank,
                ") cannot join the job: its ", p.rank == me.rank ? "rank" : "name", " is not unique, member '", p.name,
                "' (rank ", p.rank, ") has it; every worker of a job needs a unique name and rank");
    others_.push_back(p.rank);
  }
  peers.push_back(me);
  return peers;
}

void Membership::install() {
  std::weak_ptr<agent::Agent> weak = agent_;
  agent_->setHandler(
      message::MessageType::kMemberJoin,
      [weak](message::Message&& request, int callerRank, message::Reply reply) {
        auto agent = weak.lock();
        if (!agent) return;
        agent::PeerInfo peer = rendezvous::decodePeer(request.payload, "a MEMBER_JOIN message");
        // The record must be the sender's own: its rank is the one it proved.
        TORCH_CHECK(peer.rank == callerRank, "MEMBER_JOIN from rank ", callerRank, " announces rank ", peer.rank);
        agent->addPeer(std::move(peer));
        reply.value(c10::IValue());
      },
      "joining the job");
  agent_->setHandler(
      message::MessageType::kMemberLeave,
      [weak](message::Message&&, int callerRank, message::Reply reply) {
        if (auto agent = weak.lock()) agent->removePeer(callerRank, "left the job (shutdown)");
        reply.value(c10::IValue());
      },
      "leaving the job");
}

std::vector<int> Membership::tell(message::MessageType type, const std::vector<int>& ranks, double timeoutSeconds,
                                  std::exception_ptr* failure) {
  const char* what = type == message::MessageType::kMemberJoin ? "join" : "leave";
  std::vector<std::pair<int, agent::Agent::FuturePtr>> sent;
  for (int rank : ranks) {
    sent.emplace_back(rank, agent_->send(rank, recordMessage(type, me_), timeoutSeconds, "membership", what));
  }
  std::vector<int> told;
  for (auto& [rank, future] : sent) {
    future->wait();
    if (!future->hasError()) {
      told.push_back(rank);
      continue;
    }
    auto error = future->exception_ptr();
    if (type == message::MessageType::kMemberLeave &&
        common::errorParts(error).kind == common::ErrorKind::kPeerUnreachable) {
      // A member that is gone needs no telling.
      TORCHRPC_DEBUG(me_.name, "leaving: " << common::errorParts(error).message);
      continue;
    }
    if (!*failure) *failure = error;
  }
  return told;
}

void Membership::announce(double timeoutSeconds) {
  // Members that died without leaving refuse connections at once: drop them.
  std::vector<int> live;
  for (int rank : others_) {
    if (agent_->reachable(rank, kProbeSeconds)) {
      live.push_back(rank);
      continue;
    }
    TORCHRPC_WARN(me_.name, "dropping rank " << rank << " from the job's members: it cannot be reached, so it "
                                             << "stopped without leaving the job");
    agent_->removePeer(rank, "stopped without leaving the job (found unreachable when " + me_.name + " joined)");
    rendezvous_.unlist(rank);
  }
  std::exception_ptr failure;
  auto told = tell(message::MessageType::kMemberJoin, live, timeoutSeconds, &failure);
  if (failure) {
    std::exception_ptr ignored;
    tell(message::MessageType::kMemberLeave, told, timeoutSeconds, &ignored);  // undo what was done
    std::rethrow_exception(failure);
  }
  others_ = std::move(live);
  rendezvous_.list(me_);
  unlock();
}

std::exception_ptr Membership::leave(double timeoutSeconds) {
  lock("leaving");
  std::vector<int> members;
  for (const auto& p : agent_->members().list()) {
    if (p.rank != me_.rank) members.push_back(p.rank);
  }
  std::exception_ptr failure;
  tell(message::MessageType::kMemberLeave, members, timeoutSeconds, &failure);
  if (rendezvous_.unlist(me_.rank) == 0) rendezvous_.releaseKind();
  unlock();
  return failure;
}

}  // namespace torchrpc::worker
