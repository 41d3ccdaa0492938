#include "agent/members.h"

#include <c10/util/Exception.h>

namespace torchrpc::agent {

Members::Members(int selfRank, int worldSize) : selfRank_(selfRank), worldSize_(worldSize) {}

bool Members::admissible(int rank) const {
  if (rank < 0 || rank == selfRank_) return false;
  return dynamic() ? rank <= kMaxDynamicRank : rank < worldSize_;
}

size_t Members::size() const {
  if (!dynamic()) return static_cast<size_t>(worldSize_);
  std::lock_guard<std::mutex> lock(mutex_);
  return infos_.size();
}

void Members::set(std::vector<PeerInfo> peers) {
  TORCH_CHECK(dynamic() || static_cast<int>(peers.size()) == worldSize_, "expected ", worldSize_, " peers, got ",
              peers.size());
  std::lock_guard<std::mutex> lock(mutex_);
  infos_.clear();
  for (auto& p : peers) {
    int rank = p.rank;
    infos_[rank] = std::make_shared<const PeerInfo>(std::move(p));
    departed_.erase(rank);
  }
  version_.fetch_add(1);
}

void Members::add(PeerInfo info) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [rank, p] : infos_) {
    TORCH_CHECK(rank != info.rank && p->name != info.name, "worker '", info.name, "' (rank ", info.rank,
                ") cannot join the job: its ", rank == info.rank ? "rank" : "name", " is not unique, member '", p->name,
                "' (rank ", rank, ") has it; every worker of a job needs a unique name and rank");
  }
  const int rank = info.rank;
  departed_.erase(rank);
  for (auto it = departed_.begin(); it != departed_.end();) {  // the name is back
    it = it->second.name == info.name ? departed_.erase(it) : std::next(it);
  }
  infos_[rank] = std::make_shared<const PeerInfo>(std::move(info));
  version_.fetch_add(1);
}

bool Members::remove(int rank, const std::string& why) {
  std::shared_ptr<PeerLink> link;  // dropped outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = infos_.find(rank);
  if (it == infos_.end()) return false;
  if (departed_.size() >= kMaxDeparted) departed_.erase(departed_.begin());
  departed_[rank] = Departed{it->second->name, it->second->name + " (rank " + std::to_string(rank) + ") " + why};
  infos_.erase(it);
  auto l = links_.find(rank);
  if (l != links_.end()) {
    link = std::move(l->second);
    links_.erase(l);
  }
  version_.fetch_add(1);
  return true;
}

std::shared_ptr<const PeerInfo> Members::find(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = infos_.find(rank);
  return it == infos_.end() ? nullptr : it->second;
}

int Members::rankOf(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [rank, p] : infos_) {
    if (p->name == name) return rank;
  }
  return -1;
}

std::vector<PeerInfo> Members::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PeerInfo> out;
  for (const auto& kv : infos_) out.push_back(*kv.second);
  return out;
}

std::string Members::departed(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = departed_.find(rank);
  return it == departed_.end() ? "" : it->second.why;
}

std::string Members::departed(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [rank, p] : infos_) {
    if (p->name == name) return "";
  }
  for (const auto& [rank, d] : departed_) {
    if (d.name == name) return d.why;
  }
  return "";
}

std::shared_ptr<PeerLink> Members::link(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(rank);
  if (it != links_.end()) return it->second;
  const bool member = infos_.count(rank) > 0 || (!dynamic() && rank >= 0 && rank < worldSize_);
  if (!member || rank == selfRank_) return nullptr;
  return links_[rank] = std::make_shared<PeerLink>();
}

int Members::unlink(const std::shared_ptr<transport::Connection>& conn) {
  std::vector<std::pair<int, std::shared_ptr<PeerLink>>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.assign(links_.begin(), links_.end());
  }
  for (auto& [rank, link] : all) {
    std::lock_guard<std::mutex> lock(link->mutex);
    if (link->conn == conn) {
      link->conn.reset();
      return rank;
    }
  }
  return -1;
}

std::vector<std::shared_ptr<PeerLink>> Members::links() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<PeerLink>> out;
  for (const auto& kv : links_) out.push_back(kv.second);
  return out;
}

}  // namespace torchrpc::agent
