#pragma once

// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for the connection
// handshake (handshake.h): each end proves that it holds the job's secret.
// Self-contained, so that libtorchrpc needs no crypto library. Tested against
// Python's hashlib and hmac (tests/unit/test_auth.py).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace torchrpc::auth {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  Digest finish();

 private:
  void block(const uint8_t* p);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_{0};
  uint64_t length_{0};  // bytes hashed so far
};

Digest sha256(std::string_view bytes);
Digest hmacSha256(std::string_view key, std::string_view message);

// Compares without an early exit, so the time taken says nothing about where
// two MACs differ.
bool equalInConstantTime(const Digest& a, const Digest& b);

}  // namespace torchrpc::auth
