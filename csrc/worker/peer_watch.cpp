#include "worker/peer_watch.h"

#include "autograd/context.h"
#include "common/logging.h"

namespace torchrpc::worker {

std::shared_ptr<PeerWatch> PeerWatch::create(std::shared_ptr<agent::Agent> agent,
                                             std::shared_ptr<rref::RRefContext> rrefs) {
  std::shared_ptr<PeerWatch> watch(new PeerWatch(agent, std::move(rrefs)));
  std::weak_ptr<PeerWatch> weak = watch;
  agent->onPeerLost([weak](int rank, const std::string& reason) {
    if (auto self = weak.lock()) self->lostFromLoop(rank, reason);
  });
  return watch;
}

PeerWatch::PeerWatch(std::shared_ptr<agent::Agent> agent, std::shared_ptr<rref::RRefContext> rrefs)
    : agent_(std::move(agent)), rrefs_(std::move(rrefs)), graces_(agent_->options().name) {}

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
    if (!lost_.count(rank)) return false;
  }
  if (agent_->reachable(rank, kProbeSeconds)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
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
  rrefs_->releasePeer(rank);
  if (agent_->members().dynamic()) {
    // A dynamic job's worker that died never leaves: drop it here, so calls to it say so.
    agent_->removePeer(rank, "stopped without leaving the job (its connection was lost and it cannot be reached)");
  }
  if (size_t contexts = autograd::Container::get().releasePeer(rank)) {
    TORCHRPC_WARN(agent_->options().name, rrefs_->workerLabel(rank) << " was lost without shutting down: released "
                                                                    << contexts << " distributed autograd context(s)");
  }
}

void PeerWatch::stop() { graces_.stop(); }

}  // namespace torchrpc::worker
