#pragma once

// One log line format for the whole core: "[torchrpc worker0] text". Lines that
// concern a call also name the peer and the request id (callers format those).
// Warnings always print; debug lines only with TORCHRPC_DEBUG=1.

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace torchrpc::common {

inline bool debugLoggingEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TORCHRPC_DEBUG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return enabled;
}

inline void logLine(const std::string& worker, const std::string& text) {
  std::fprintf(stderr, "[torchrpc %s] %s\n", worker.c_str(), text.c_str());
}

}  // namespace torchrpc::common

#define TORCHRPC_WARN(worker, stream_expr)        \
  do {                                            \
    std::ostringstream torchrpc_log_ss_;          \
    torchrpc_log_ss_ << stream_expr;              \
    ::torchrpc::common::logLine(worker, torchrpc_log_ss_.str()); \
  } while (0)

#define TORCHRPC_DEBUG(worker, stream_expr)               \
  do {                                                    \
    if (::torchrpc::common::debugLoggingEnabled()) {              \
      TORCHRPC_WARN(worker, stream_expr);                 \
    }                                                     \
  } while (0)
