#include "common/logging.h"

#include <algorithm>

namespace torchrpc::common {

std::string printable(const std::string& text, size_t limit) {
  std::string out;
  out.reserve(std::min(text.size(), limit) + 16);
  for (unsigned char c : text) {
    if (out.size() >= limit) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (c == '\n' || c == '\t') {
      out += c == '\n' ? "\\n" : "\\t";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

bool LogRateLimit::allow(uint64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = std::chrono::steady_clock::now();
  if (now - windowStart_ >= std::chrono::duration<double>(kLogWindowSeconds)) {
    windowStart_ = now;
    printed_ = 0;
  }
  if (printed_ >= kLogLinesPerWindow) {
    ++suppressed_;
    return false;
  }
  ++printed_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

void logLine(const std::string& worker, const std::string& text, uint64_t suppressed) {
  std::string line = printable(text);
  if (suppressed > 0) line += " (" + std::to_string(suppressed) + " similar lines were suppressed)";
  std::fprintf(stderr, "[torchrpc %s] %s\n", printable(worker, 200).c_str(), line.c_str());
}

}  // namespace torchrpc::common
