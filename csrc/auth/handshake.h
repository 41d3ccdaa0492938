#pragma once

// Handshake: the first bytes of every connection, before any frame is
// parsed. Each end proves that it holds the job's secret (an HMAC over nonces
// from both ends and both ranks), so a peer without the secret can never get
// a frame read, and each end learns the other's rank from the proof, not from
// a claim. Fixed binary messages (little endian), at most 76 bytes: nothing
// is allocated from a size the peer declares.
//
//   1. connector -> acceptor  HELLO  "TRPH" magic u32, version u16, 0 u16,
//                                     connector nonce (32), connector rank i32
//   2. acceptor -> connector  PROOF  magic, version, 0, acceptor nonce (32),
//                                     acceptor rank i32,
//                                     HMAC(secret, "acceptor" | both nonces | both ranks)
//   3. connector -> acceptor  PROOF  HMAC(secret, "connector" | both nonces | both ranks)
//
// The two MACs differ by their label, so neither end can be used to compute
// the other's proof. What it does not protect against: a peer that holds the
// secret, and an attacker on the path who relays the handshake and then
// injects frames (there is no encryption nor per-frame MAC); see
// docs/threat-model.md.
//
// Threads: one Handshake per connection, driven by its loop thread.

#include <cstdint>
#include <functional>
#include <string>

#include "auth/hmac.h"

namespace torchrpc::auth {

class Handshake {
 public:
  static constexpr uint32_t kMagic = 0x48505254;  // "TRPH"
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kHelloBytes = 44;
  static constexpr size_t kProofBytes = 76;   // the acceptor's
  static constexpr size_t kFinishBytes = 32;  // the connector's

  enum class Role { kConnector, kAcceptor };
  enum class State { kWaiting, kDone, kFailed };

  // `expectedPeer`: for a connector, the rank it dialled (-1: any);
  // `validPeer` tells whether a rank may connect at all.
  Handshake(Role role, std::string secret, int32_t myRank, int32_t expectedPeer,
            std::function<bool(int32_t)> validPeer);

  // The bytes to send first (a connector's HELLO; nothing for an acceptor).
  std::string start();
  // Feeds received bytes; returns what to send in reply (maybe nothing).
  // Consumes only the handshake's own bytes: *used tells how many of `data`
  // it took (the rest are frames that follow a finished handshake).
  std::string consume(const char* data, size_t size, size_t* used);

  State state() const { return state_; }
  // Why it failed (kFailed), for the log and the close reason.
  const std::string& error() const { return error_; }
  // The peer's proven rank (kDone).
  int32_t peerRank() const { return peerRank_; }
  // How many more bytes the handshake waits for (0 when not waiting).
  size_t wanted() const;

 private:
  std::string fail(std::string why);
  Digest mac(const char* label) const;
  // Reads magic, version, nonce and rank (false: failed); this end's own.
  bool readGreeting();
  std::string greeting() const;
  std::string onHello();
  std::string onProof();
  std::string onFinish();

  const Role role_;
  const std::string secret_;
  const int32_t myRank_;
  const int32_t expectedPeer_;
  const std::function<bool(int32_t)> validPeer_;
  State state_{State::kWaiting};
  std::string error_;
  int32_t peerRank_{-1};
  std::string myNonce_;
  std::string peerNonce_;
  std::string buffer_;  // the message being received, at most kProofBytes
  int step_{0};         // messages received
};

// 32 bytes from the kernel's random source.
std::string randomBytes(size_t n);

}  // namespace torchrpc::auth
