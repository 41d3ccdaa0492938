#include "auth/handshake.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace torchrpc::auth {

namespace {

constexpr size_t kNonceBytes = 32;

void putU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void putU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

uint32_t getU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint16_t getU16(const char* p) { return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8)); }

}  // namespace

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::getrandom(out.data() + done, n - done, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    }
    done += static_cast<size_t>(r);
  }
  return out;
}

Handshake::Handshake(Role role, std::string secret, int32_t myRank, int32_t expectedPeer,
                     std::function<bool(int32_t)> validPeer)
    : role_(role),
      secret_(std::move(secret)),
      myRank_(myRank),
      expectedPeer_(expectedPeer),
      validPeer_(std::move(validPeer)),
      myNonce_(randomBytes(kNonceBytes)) {}

size_t Handshake::wanted() const {
  if (state_ != State::kWaiting) return 0;
  size_t total = role_ == Role::kAcceptor ? (step_ == 0 ? kHelloBytes : kFinishBytes) : kProofBytes;
  return total - buffer_.size();
}

std::string Handshake::start() { return role_ == Role::kConnector ? greeting() : ""; }

std::string Handshake::fail(std::string why) {
  state_ = State::kFailed;
  error_ = std::move(why);
  buffer_.clear();
  return "";
}

Digest Handshake::mac(const char* label) const {
  // label | connector nonce | acceptor nonce | connector rank | acceptor rank
  const bool connector = role_ == Role::kConnector;
  const std::string& connectorNonce = connector ? myNonce_ : peerNonce_;
  const std::string& acceptorNonce = connector ? peerNonce_ : myNonce_;
  std::string message = label;
  message += connectorNonce;
  message += acceptorNonce;
  putU32(&message, static_cast<uint32_t>(connector ? myRank_ : peerRank_));
  putU32(&message, static_cast<uint32_t>(connector ? peerRank_ : myRank_));
  return hmacSha256(secret_, message);
}

std::string Handshake::consume(const char* data, size_t size, size_t* used) {
  *used = 0;
  while (state_ == State::kWaiting && *used < size) {
    size_t n = std::min(wanted(), size - *used);
    buffer_.append(data + *used, n);
    *used += n;
    if (wanted() > 0) return "";
    ++step_;
    std::string reply;
    if (role_ == Role::kAcceptor) {
      reply = step_ == 1 ? onHello() : onFinish();
    } else {
      reply = onProof();
    }
    buffer_.clear();
    if (!reply.empty() || state_ != State::kWaiting) return reply;
  }
  return "";
}

bool Handshake::readGreeting() {
  // magic u32, version u16, 0 u16, nonce, rank i32: the start of HELLO and of PROOF.
  const char* p = buffer_.data();
  if (getU32(p) != kMagic) {
    fail("not a torchrpc peer (bad magic)");
    return false;
  }
  if (getU16(p + 4) != kVersion) {
    fail("handshake version " + std::to_string(getU16(p + 4)) + ", expected " + std::to_string(kVersion) +
         ": run the same torchrpc version on every worker");
    return false;
  }
  peerNonce_.assign(p + 8, kNonceBytes);
  peerRank_ = static_cast<int32_t>(getU32(p + 8 + kNonceBytes));
  return true;
}

std::string Handshake::greeting() const {
  std::string out;
  putU32(&out, kMagic);
  putU16(&out, kVersion);
  putU16(&out, 0);
  out += myNonce_;
  putU32(&out, static_cast<uint32_t>(myRank_));
  return out;
}

std::string Handshake::onHello() {
  if (!readGreeting()) return "";
  if (!validPeer_(peerRank_)) return fail("the peer claims rank " + std::to_string(peerRank_) + ", not a worker of this job");
  std::string proof = greeting();
  Digest d = mac("acceptor");
  proof.append(reinterpret_cast<const char*>(d.data()), d.size());
  return proof;
}

std::string Handshake::onProof() {
  if (!readGreeting()) return "";
  if (expectedPeer_ >= 0 && peerRank_ != expectedPeer_) {
    return fail("dialled rank " + std::to_string(expectedPeer_) + " but rank " + std::to_string(peerRank_) +
                " answered");
  }
  Digest theirs;
  std::memcpy(theirs.data(), buffer_.data() + 12 + kNonceBytes, theirs.size());
  if (!equalInConstantTime(theirs, mac("acceptor"))) {
    return fail("the peer could not prove it holds the job's secret; every worker of a job needs the same "
                "secret (RpcOptions(secret=...) or TORCHRPC_SECRET on all of them, or on none)");
  }
  Digest d = mac("connector");
  state_ = State::kDone;
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

std::string Handshake::onFinish() {
  Digest theirs;
  std::memcpy(theirs.data(), buffer_.data(), theirs.size());
  if (!equalInConstantTime(theirs, mac("connector"))) {
    return fail("the peer (claiming rank " + std::to_string(peerRank_) +
                ") could not prove it holds the job's secret");
  }
  state_ = State::kDone;
  return "";
}

}  // namespace torchrpc::auth
