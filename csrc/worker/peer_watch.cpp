#include "worker/peer_watch.h"

namespace torchrpc::worker {

std::shared_ptr<PeerWatch> PeerWatch::create(std::shared_ptr<agent::Agent> agent, OnGone onGone) {
  std::shared_ptr<PeerWatch> watch(new PeerWatch(agent, std::move(onGone)));
  std::weak_ptr<PeerWatch> weak = watch;
  agent->onPeerLost([weak](int rank, const std::string& reason) {
    if (auto self = weak.lock()) self->lostFromLoop(rank, reason);
  });
  return watch;
}

PeerWatch::PeerWatch(std::shared_ptr<agent::Agent> agent, OnGone onGone)
    : agent_(std::move(agent)), onGone_(std::move(onGone)), graces_(agent_->options().name) {}

void PeerWatch::lostFromLoop(int rank, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_[rank] = reason;
  }
  std::weak_ptr<PeerWatch> weak = weak_from_this();
  graces_.after(agent_->options().peerGraceSeconds, [weak, rank] {
    if (auto self = weak.lock()) self->graceEnded(rank);
  });
}

bool PeerWatch::gone(int rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dead_.count(rank)) return true;
  }
  // An open connection answers at once; without one (lost, never opened, or
  // closed after the peer's goodbye) this dials it.
  if (agent_->reachable(rank, kProbeSeconds)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.emplace(rank, "it cannot be reached: it exited, or stopped its worker, without meeting the others");
  dead_.insert(rank);
  return true;
}

std::map<int, std::string> PeerWatch::goneRanks() const {
  std::map<int, std::string> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int rank : dead_) out[rank] = lost_.count(rank) ? lost_.at(rank) : "";
  return out;
}

void PeerWatch::graceEnded(int rank) {
  if (!gone(rank)) {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_.erase(rank);  // reachable: its connection only dropped
    return;
  }
  if (onGone_) onGone_(rank);
}

void PeerWatch::stop() { graces_.stop(); }

}  // namespace torchrpc::worker
