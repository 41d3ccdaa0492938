#include "message/pickle_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace torchrpc::message {

namespace {

// Little-endian unsigned of n bytes at p (n <= 8).
uint64_t readLength(const char* p, size_t n) {
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}

}  // namespace

std::string checkPickle(const char* data, size_t size) {
  size_t pos = 0;
  uint64_t memoized = 0;  // memo entries so far (puts)
  auto at = [&](size_t opcodeAt) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), " (opcode 0x%02x at byte %zu)", static_cast<unsigned char>(data[opcodeAt]), opcodeAt);
    return std::string(buf);
  };
  while (pos < size) {
    const size_t start = pos;
    const auto op = static_cast<unsigned char>(data[pos++]);
    const size_t left = size - pos;
    // Fixed-size argument, length-prefixed argument (prefix bytes), or a
    // newline-terminated one; memo puts carry the index.
    size_t fixed = 0, prefix = 0;
    bool line = false, lines2 = false, memoPut = false;
    uint64_t putIndex = 0;  // a memo put's index
    switch (op) {
      case '.':  // STOP
        return pos == size ? "" : "pickle has " + std::to_string(size - pos) + " bytes after its STOP";
      case '(': case '0': case '1': case '2': case 'N': case 'Q': case 'R': case 'a': case 'b': case 'd':
      case '}': case 'e': case 'l': case ']': case 'o': case 's': case 't': case ')': case 'u':
      case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90: case 0x91:
      case 0x92: case 0x93: case 0x97: case 0x98:
        break;
      case 0x94:  // MEMOIZE
        ++memoized;
        break;
      case 'K': case 'h': case 0x80: case 0x82: fixed = 1; break;
      case 'M': case 0x83: fixed = 2; break;
      case 'J': case 'j': case 0x84: fixed = 4; break;
      case 'G': case 0x95: fixed = 8; break;
      case 'q': fixed = 1; memoPut = true; break;
      case 'r': fixed = 4; memoPut = true; break;
      case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': line = true; break;
      case 'p': line = true; memoPut = true; break;  // PUT
      case 'c': case 'i': lines2 = true; break;
      case 'U': case 'C': case 0x8a: case 0x8c: prefix = 1; break;
      case 'T': case 'X': case 'B': case 0x8b: prefix = 4; break;
      case 0x8d: case 0x8e: case 0x96: prefix = 8; break;
      default:
        return "unsupported pickle opcode" + at(start);
    }
    if (fixed > 0) {
      if (left < fixed) return "pickle ends inside an argument" + at(start);
      if (memoPut) putIndex = readLength(data + pos, fixed);
      pos += fixed;
    } else if (prefix > 0) {
      if (left < prefix) return "pickle ends inside a length" + at(start);
      const uint64_t length = readLength(data + pos, prefix);
      if (length > left - prefix) {
        return "pickle declares " + std::to_string(length) + " bytes where " + std::to_string(left - prefix) +
               " remain" + at(start);
      }
      pos += prefix + length;
    } else if (line || lines2) {
      const size_t argument = pos;
      for (int n = lines2 ? 2 : 1; n > 0; --n) {
        const void* nl = std::memchr(data + pos, '\n', size - pos);
        if (nl == nullptr) return "pickle ends inside a line argument" + at(start);
        pos = static_cast<const char*>(nl) - data + 1;
      }
      if (memoPut) {  // PUT's index in decimal
        size_t digits = 0;
        for (size_t i = argument; i + 1 < pos; ++i, ++digits) {
          if (data[i] < '0' || data[i] > '9' || digits >= 19) return "pickle memo index is not a number" + at(start);
          putIndex = putIndex * 10 + static_cast<uint64_t>(data[i] - '0');
        }
        if (digits == 0) return "pickle memo index is not a number" + at(start);
      }
    }
    if (memoPut) {
      if (putIndex > memoized) {
        return "pickle memo index " + std::to_string(putIndex) + " skips ahead of the " + std::to_string(memoized) +
               " entries memoized" + at(start);
      }
      ++memoized;
    }
  }
  return "pickle ends without STOP";
}

std::string checkTypeTag(const std::string& tag) {
  size_t depth = 0, deepest = 0;
  for (char c : tag) {
    if (c == '[' || c == '(') deepest = std::max(deepest, ++depth);
    if ((c == ']' || c == ')') && depth > 0) --depth;
  }
  if (deepest <= kMaxTypeTagDepth) return "";
  return "a type tag nested " + std::to_string(deepest) + " levels deep, over the cap of " +
         std::to_string(kMaxTypeTagDepth);
}

}  // namespace torchrpc::message
