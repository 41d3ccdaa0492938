#pragma once

// One log line format for the whole core: "[torchrpc worker0] text". Lines that
// concern a call also name the peer and the request id (callers format those).
// Warnings always print; debug lines only with TORCHRPC_DEBUG=1.
//
// Peers choose some of what a line says (an exception's text, a malformed
// frame's fields), so every line is escaped (control and non-ASCII bytes as
// \xNN), cut at kMaxLogLineBytes, and each call site prints at most
// kLogLinesPerWindow lines per kLogWindowSeconds: a peer that makes a worker
// log on every frame cannot fill its disk or drown its real warnings.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>

namespace torchrpc::common {

constexpr size_t kMaxLogLineBytes = 2000;
constexpr int kLogLinesPerWindow = 10;
constexpr double kLogWindowSeconds = 10.0;

inline bool debugLoggingEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TORCHRPC_DEBUG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return enabled;
}

// `text` with control and non-ASCII bytes as \xNN, at most `limit` bytes of it.
std::string printable(const std::string& text, size_t limit = kMaxLogLineBytes);

// One call site's budget of lines: allow() is true for at most
// kLogLinesPerWindow calls per window; the first allowed call after a window
// that suppressed some reports how many (suppressed()).
class LogRateLimit {
 public:
  // True when the line may print; `suppressed` gets the lines dropped since
  // the last printed one.
  bool allow(uint64_t* suppressed);

 private:
  std::mutex mutex_;
  std::chrono::steady_clock::time_point windowStart_{};
  int printed_{0};
  uint64_t suppressed_{0};
};

void logLine(const std::string& worker, const std::string& text, uint64_t suppressed = 0);

}  // namespace torchrpc::common

#define TORCHRPC_WARN(worker, stream_expr)                                  \
  do {                                                                      \
    static ::torchrpc::common::LogRateLimit torchrpc_log_limit_;            \
    uint64_t torchrpc_log_dropped_ = 0;                                     \
    if (torchrpc_log_limit_.allow(&torchrpc_log_dropped_)) {                \
      std::ostringstream torchrpc_log_ss_;                                  \
      torchrpc_log_ss_ << stream_expr;                                      \
      ::torchrpc::common::logLine(worker, torchrpc_log_ss_.str(), torchrpc_log_dropped_); \
    }                                                                       \
  } while (0)

#define TORCHRPC_DEBUG(worker, stream_expr)               \
  do {                                                    \
    if (::torchrpc::common::debugLoggingEnabled()) {      \
      TORCHRPC_WARN(worker, stream_expr);                 \
    }                                                     \
  } while (0)
