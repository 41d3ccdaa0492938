#include "rendezvous/rendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdlib>
#include <sstream>

#include "auth/handshake.h"
#include <unordered_map>

namespace torchrpc::rendezvous {

namespace {

std::vector<uint8_t> bytesOf(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string encode(const agent::PeerInfo& p) {
  return p.name + "\n" + std::to_string(p.rank) + "\n" + p.tcpAddress + "\n" + p.unixAddress + "\n" + p.hostId;
}

agent::PeerInfo decode(const std::vector<uint8_t>& bytes, int expectedRank) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  agent::PeerInfo p;
  std::string rank;
  if (!std::getline(in, p.name) || !std::getline(in, rank) || !std::getline(in, p.tcpAddress) ||
      !std::getline(in, p.unixAddress)) {
    TORCH_CHECK(false, "malformed rendezvous record for rank ", expectedRank,
                ": is another program (or another torchrpc version) using this store?");
  }
  std::getline(in, p.hostId);
  p.rank = std::stoi(rank);
  return p;
}

std::vector<std::string> keysFor(const std::string& prefix, int worldSize) {
  std::vector<std::string> keys;
  for (int r = 0; r < worldSize; ++r) keys.push_back(prefix + std::to_string(r));
  return keys;
}

}  // namespace

Rendezvous::Rendezvous(c10::intrusive_ptr<c10d::Store> store, int rank, int worldSize)
    : rank_(rank), worldSize_(worldSize) {
  int64_t joins = store->add("torchrpc/joins", 1);
  int64_t generation = (joins - 1) / worldSize;
  store_ = c10::make_intrusive<c10d::PrefixStore>("torchrpc/" + std::to_string(generation), store);
}

std::vector<agent::PeerInfo> Rendezvous::exchange(const agent::PeerInfo& me) {
  store_->set("worker/" + std::to_string(rank_), bytesOf(encode(me)));
  auto keys = keysFor("worker/", worldSize_);
  store_->wait(keys);
  auto values = store_->multiGet(keys);
  std::vector<agent::PeerInfo> peers;
  std::unordered_map<std::string, int> byName;
  for (int r = 0; r < worldSize_; ++r) {
    peers.push_back(decode(values[r], r));
    auto [it, fresh] = byName.emplace(peers.back().name, r);
    if (!fresh) {
      C10_THROW_ERROR(ValueError, "worker name '" + peers.back().name + "' is used by ranks " +
                                      std::to_string(it->second) + " and " + std::to_string(r) +
                                      "; every worker of a job needs a unique name");
    }
  }
  return peers;
}

std::string Rendezvous::sharedSecret(std::string given) {
  if (given.empty()) {
    const char* env = std::getenv("TORCHRPC_SECRET");
    if (env != nullptr) given = env;
  }
  if (!given.empty()) {
    TORCH_CHECK(given.size() >= kMinSecretBytes, "the job's secret (RpcOptions(secret=...) or TORCHRPC_SECRET) needs at least ",
                kMinSecretBytes, " bytes; got ", given.size());
    return given;
  }
  // Rank 0 makes the job's secret; the others wait for it (up to the store's timeout).
  if (rank_ == 0) {
    std::string secret = auth::randomBytes(kSecretBytes);
    store_->set("secret", bytesOf(secret));
    return secret;
  }
  auto value = store_->get("secret");
  TORCH_CHECK(value.size() == kSecretBytes, "malformed job secret in the rendezvous store (", value.size(),
              " bytes): is another program (or another torchrpc version) using this store?");
  return std::string(value.begin(), value.end());
}

void Rendezvous::barrier(const std::string& tag, double timeoutSeconds) {
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000));
  if (store_->add(tag + "/arrived", 1) == worldSize_) store_->set(tag + "/go", bytesOf("1"));
  store_->wait({tag + "/go"}, timeout);
  store_->set(tag + "/left/" + std::to_string(rank_), bytesOf("1"));
  if (rank_ == 0) store_->wait(keysFor(tag + "/left/", worldSize_), timeout);
}

}  // namespace torchrpc::rendezvous
