#include "rendezvous/rendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <thread>

#include <cctype>
#include <unordered_map>

#include "auth/handshake.h"
#include "common/error.h"

namespace torchrpc::rendezvous {

namespace {

std::vector<uint8_t> bytesOf(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

agent::PeerInfo decode(const std::vector<uint8_t>& bytes, int expectedRank) {
  return decodePeer(std::string(bytes.begin(), bytes.end()),
                    "the rendezvous record of rank " + std::to_string(expectedRank) +
                        " (is another program, or another torchrpc version, using this store?)");
}

constexpr char kKindKey[] = "torchrpc/kind";
constexpr auto kTokenPoll = std::chrono::milliseconds(10);
constexpr auto kTokenProbe = std::chrono::seconds(1);  // how often a waiter asks whether the holder still runs

// Calls `done` until it returns true, sleeping between calls from 1 ms up
// to `maxPoll`; false once `deadline` passed. Stores are polled with
// check(), never wait() with a short timeout: a TCPStore client reconnects
// after every timed-out wait (a socket, a connect and a warning on stderr
// each time).
bool pollUntil(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline,
               std::chrono::milliseconds maxPoll) {
  auto poll = std::chrono::milliseconds(1);
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(poll, deadline - now));
    poll = std::min(poll * 2, maxPoll);
  }
  return true;
}

std::chrono::steady_clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout : std::chrono::steady_clock::time_point::max();
}

std::vector<std::string> keysFor(const std::string& prefix, int worldSize) {
  std::vector<std::string> keys;
  for (int r = 0; r < worldSize; ++r) keys.push_back(prefix + std::to_string(r));
  return keys;
}

}  // namespace

std::string encodePeer(const agent::PeerInfo& p) {
  return p.name + "\n" + std::to_string(p.rank) + "\n" + p.tcpAddress + "\n" + p.unixAddress + "\n" + p.hostId;
}

agent::PeerInfo decodePeer(const std::string& record, const std::string& where) {
  TORCH_CHECK(record.size() <= kMaxRecordBytes, "malformed worker record in ", where, ": ", record.size(),
              " bytes, more than ", kMaxRecordBytes);
  std::istringstream in(record);
  agent::PeerInfo p;
  std::string rank;
  bool complete = std::getline(in, p.name) && std::getline(in, rank) && std::getline(in, p.tcpAddress) &&
                  std::getline(in, p.unixAddress);
  std::getline(in, p.hostId);
  bool nameOk = !p.name.empty() && p.name.size() < 128 &&
                std::all_of(p.name.begin(), p.name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
  bool rankOk = !rank.empty() && rank.size() <= 9 && std::all_of(rank.begin(), rank.end(), ::isdigit);
  TORCH_CHECK(complete && nameOk && rankOk, "malformed worker record in ", where);
  p.rank = std::stoi(rank);
  return p;
}

Rendezvous::Rendezvous(c10::intrusive_ptr<c10d::Store> store, int rank, int worldSize)
    : root_(store), rank_(rank), worldSize_(worldSize) {
  if (dynamic()) {
    store_ = c10::make_intrusive<c10d::PrefixStore>("torchrpc/dynamic", std::move(store));
    return;
  }
  int64_t joins = store->add("torchrpc/joins", 1);
  int64_t generation = (joins - 1) / worldSize;
  store_ = c10::make_intrusive<c10d::PrefixStore>("torchrpc/" + std::to_string(generation), store);
}

void Rendezvous::claimKind() {
  const std::string mine = dynamic() ? "dynamic" : "static";
  auto held = root_->compareSet(kKindKey, {}, bytesOf(mine));
  const std::string kind(held.begin(), held.end());
  // Upstream's words ("RPC group mixes ..."), which programs may match on.
  TORCH_CHECK(kind == mine, "RPC group mixes statically and dynamically initialized members which is not supported: "
              "this worker (rank ", rank_, ") calls init_rpc ", dynamic() ? "without" : "with",
              " a world_size, but the job in this rendezvous store is ", kind,
              ". Give every worker of a job a world_size, or none; or use another init_method.");
}

void Rendezvous::releaseKind() {
  (void)root_->compareSet(kKindKey, bytesOf(dynamic() ? "dynamic" : "static"), {});
}

namespace {

// The label part of a membership token ("worker5 (rank 5) joining").
std::string tokenLabel(const std::string& token) { return token.substr(0, token.find('\n')); }

// Whether the holder of `token` runs; a token without a readable record is waited for.
bool tokenHolderRuns(const std::string& token, const std::function<bool(const agent::PeerInfo&)>& runs) {
  const auto newline = token.find('\n');
  if (newline == std::string::npos) return true;
  agent::PeerInfo holder;
  try {
    holder = decodePeer(token.substr(newline + 1), "the job's membership token");
  } catch (const c10::Error&) {
    return true;
  }
  return runs(holder);
}

}  // namespace

std::string Rendezvous::lockMembership(const agent::PeerInfo& me, const std::string& doing,
                                       const std::function<bool(const agent::PeerInfo&)>& runs) {
  const std::string holder = me.name + " (rank " + std::to_string(me.rank) + ") " + doing + "\n" + encodePeer(me);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + store_->getTimeout();
  auto nextProbe = start + kTokenProbe;
  while (true) {
    auto got = store_->compareSet("token", {}, bytesOf(holder));
    const std::string now(got.begin(), got.end());
    if (now == holder) return "";
    if (std::chrono::steady_clock::now() >= nextProbe) {
      // Replaced only if it still holds it: one waiter takes it over.
      if (!tokenHolderRuns(now, runs) && store_->compareSet("token", got, bytesOf(holder)) == bytesOf(holder)) {
        return tokenLabel(now);
      }
      nextProbe = std::chrono::steady_clock::now() + kTokenProbe;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      C10_THROW_ERROR(DistStoreError, "cannot join or leave the job: " + tokenLabel(now) +
                                          " has been joining or leaving it for longer than the rendezvous timeout (" +
                                          common::secondsText(store_->getTimeout().count() / 1000.0) +
                                          " s) and still answers connections");
    }
    std::this_thread::sleep_for(kTokenPoll);
  }
}

void Rendezvous::unlockMembership() { store_->set("token", std::vector<uint8_t>()); }

std::vector<int> Rendezvous::listedRanks() {
  std::vector<int> ranks;
  if (!store_->check({"members"})) return ranks;
  auto bytes = store_->get("members");
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) ranks.push_back(std::stoi(item));
  }
  return ranks;
}

void Rendezvous::setListedRanks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  store_->set("members", bytesOf(text));
}

std::vector<agent::PeerInfo> Rendezvous::members() {
  std::vector<agent::PeerInfo> out;
  for (int r : listedRanks()) out.push_back(decode(store_->get("worker/" + std::to_string(r)), r));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return out;
}

void Rendezvous::list(const agent::PeerInfo& me) {
  store_->set("worker/" + std::to_string(me.rank), bytesOf(encodePeer(me)));
  auto ranks = listedRanks();
  if (std::find(ranks.begin(), ranks.end(), me.rank) == ranks.end()) ranks.push_back(me.rank);
  setListedRanks(ranks);
}

size_t Rendezvous::unlist(int rank) {
  auto ranks = listedRanks();
  ranks.erase(std::remove(ranks.begin(), ranks.end(), rank), ranks.end());
  setListedRanks(ranks);
  return ranks.size();
}

std::vector<agent::PeerInfo> Rendezvous::exchange(const agent::PeerInfo& me, const std::function<bool()>& interrupted) {
  store_->set("worker/" + std::to_string(rank_), bytesOf(encodePeer(me)));
  const auto timeout = store_->getTimeout();
  const auto deadline = deadlineAfter(timeout);
  std::set<int> goneRanks;  // none: nothing is known of the others yet
  try {
    waitForAll("init", "worker/", deadline, [&](int) {
      TORCH_CHECK(!(interrupted && interrupted()), "init_rpc on ", me.name,
                  ": interrupted while waiting for the other workers to join");
      return false;
    }, &goneRanks, std::chrono::milliseconds(20));  // workers started together join within one poll
  } catch (const c10::DistStoreError& e) {
    C10_THROW_ERROR(DistStoreError, "init_rpc on " + me.name + ": not every worker of the job (world_size=" +
                                        std::to_string(worldSize_) + ") joined within the rendezvous timeout of " +
                                        common::secondsText(timeout.count() / 1000.0) + " s (" +
                                        e.what_without_backtrace() +
                                        "). Start them, with this job's init_method, or raise init_timeout.");
  }
  auto keys = keysFor("worker/", worldSize_);
  auto values = store_->multiGet(keys);
  std::vector<agent::PeerInfo> peers;
  std::unordered_map<std::string, int> byName;
  for (int r = 0; r < worldSize_; ++r) {
    peers.push_back(decode(values[r], r));
    auto [it, fresh] = byName.emplace(peers.back().name, r);
    if (!fresh) {
      TORCH_CHECK(false, "worker name '", peers.back().name, "' is not unique: ranks ", it->second, " and ", r,
                  " both use it; every worker of a job needs a unique name");
    }
  }
  return peers;
}

std::string Rendezvous::sharedSecret(std::string given, const std::function<bool()>& interrupted) {
  if (given.empty()) {
    const char* env = std::getenv("TORCHRPC_SECRET");
    if (env != nullptr) given = env;
  }
  if (!given.empty()) {
    TORCH_CHECK(given.size() >= kMinSecretBytes, "the job's secret (RpcOptions(secret=...) or TORCHRPC_SECRET) needs at least ",
                kMinSecretBytes, " bytes; got ", given.size());
    return given;
  }
  // A dynamic job's first worker makes the job's secret (the others find it).
  if (dynamic()) {
    auto value = store_->compareSet("secret", {}, bytesOf(auth::randomBytes(kSecretBytes)));
    TORCH_CHECK(value.size() == kSecretBytes, "malformed job secret in the rendezvous store (", value.size(),
                " bytes): is another program (or another torchrpc version) using this store?");
    return std::string(value.begin(), value.end());
  }
  // Rank 0 makes the job's secret; the others wait for it (up to the store's timeout).
  if (rank_ == 0) {
    std::string secret = auth::randomBytes(kSecretBytes);
    store_->set("secret", bytesOf(secret));
    return secret;
  }
  const bool made = pollUntil([&] {
    TORCH_CHECK(!(interrupted && interrupted()), "init_rpc on rank ", rank_, ": interrupted while waiting for rank 0");
    return store_->check({"secret"});
  }, deadlineAfter(store_->getTimeout()), std::chrono::milliseconds(20));
  TORCH_CHECK(made, "init_rpc on rank ", rank_, ": rank 0 did not join the job within the rendezvous timeout of ",
              store_->getTimeout().count() / 1000.0, " s. Start it, with this job's init_method, or raise init_timeout.");
  auto value = store_->get("secret");
  TORCH_CHECK(value.size() == kSecretBytes, "malformed job secret in the rendezvous store (", value.size(),
              " bytes): is another program (or another torchrpc version) using this store?");
  return std::string(value.begin(), value.end());
}

void Rendezvous::waitForAll(const std::string& tag, const std::string& prefix,
                            std::chrono::steady_clock::time_point deadline, const std::function<bool(int)>& gone,
                            std::set<int>* goneRanks, std::chrono::milliseconds maxPoll) {
  std::vector<int> missing;
  for (int r = 0; r < worldSize_; ++r) missing.push_back(r);
  // At most every maxPoll, so a rank known dead is noticed between polls
  // (0.1% of a core while waiting at the default 200 ms).
  const bool all = pollUntil([&] {
    std::vector<int> still;
    for (int r : missing) {
      if (store_->check({prefix + std::to_string(r)})) continue;
      if (store_->check({tag + "/gone/" + std::to_string(r)})) {
        goneRanks->insert(r);
        continue;
      }
      if (gone && gone(r)) {
        // A worker that got here and then left the job (rank 0 waits for
        // the others to leave the meeting) set its key before it stopped
        // listening: checked again.
        if (store_->check({prefix + std::to_string(r)})) continue;
        store_->set(tag + "/gone/" + std::to_string(r), bytesOf("1"));  // for the workers that never talked to it
        goneRanks->insert(r);
        continue;
      }
      still.push_back(r);
    }
    missing.swap(still);
    return missing.empty();
  }, deadline, maxPoll);
  if (!all) {
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    C10_THROW_ERROR(DistStoreError, "barrier '" + tag + "': rank(s) " + ranks + " did not arrive in time");
  }
}

std::set<int> Rendezvous::barrier(const std::string& tag, double timeoutSeconds, const std::function<bool(int)>& gone) {
  const auto deadline = timeoutSeconds <= 0 ? std::chrono::steady_clock::time_point::max()
                                             : std::chrono::steady_clock::now() +
                                                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(timeoutSeconds));
  store_->set(tag + "/arrived/" + std::to_string(rank_), bytesOf("1"));
  std::set<int> goneRanks;
  waitForAll(tag, tag + "/arrived/", deadline, gone, &goneRanks);
  store_->set(tag + "/left/" + std::to_string(rank_), bytesOf("1"));
  if (rank_ == 0) waitForAll(tag, tag + "/left/", deadline, gone, &goneRanks);
  return goneRanks;
}

Rendezvous::Tally Rendezvous::tally(const std::string& tag, int64_t value, double timeoutSeconds,
                                    const std::function<bool(int)>& gone) {
  // Added before arriving: once all arrived, the sum is complete.
  store_->add(tag + "/sum", value);
  Tally out;
  out.gone = barrier(tag, timeoutSeconds, gone);
  out.sum = store_->add(tag + "/sum", 0);
  return out;
}

}  // namespace torchrpc::rendezvous
