#include "message/pickle_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchrpc::message {

namespace {

// Little-endian unsigned of n bytes at p (n <= 8).
uint64_t readLength(const char* p, size_t n) {
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}

// The values a pickle for torch's unpickler builds, as a graph: each
// container, object or call result is a node, with an edge to every value
// put in it; numbers, strings, globals and tensors are leaves (-1). The
// stack and the memo hold nodes, so an alias (memo get, DUP) is the same
// node. Thread-local buffers: a tiny payload allocates nothing, and a large
// one's buffers are freed by the next check.
class ValueGraph {
 public:
  void reset() {
    constexpr size_t kKept = 1 << 12;  // entries a buffer keeps between checks
    auto clear = [](auto& v) {
      if (v.capacity() > kKept) {
        std::decay_t<decltype(v)>().swap(v);
      } else {
        v.clear();
      }
    };
    clear(stack_), clear(marks_), clear(memo_), clear(scratch_), clear(children_), clear(firstChild_);
    clear(called_), clear(depth_), clear(walk_);
  }

  // False if the pickle pops past its stack or a mark, or adds to a call's result.
  bool step(unsigned char op, uint64_t index, uint64_t memoized) {
    switch (op) {
      case '(': marks_.push_back(stack_.size()); return true;
      case '0':  // POP: an item, or the mark on top
        if (stack_.size() > floor()) {
          stack_.pop_back();
          return true;
        }
        if (marks_.empty()) return false;
        marks_.pop_back();
        return true;
      case '1': return popToMark(nullptr);  // POP_MARK
      case '2':  // DUP
        if (stack_.size() <= floor()) return false;
        stack_.push_back(stack_.back());
        return true;
      case ']': case '}': case ')': case 0x8f: stack_.push_back(node(false)); return true;  // empty containers
      case 'l': case 't': case 'd': case 0x91: case 'o': case 'i': {  // built from what follows the mark
        std::vector<int32_t>& items = scratch_;
        if (!popToMark(&items)) return false;
        const int32_t made = node(false);
        for (int32_t item : items) edge(made, item);
        stack_.push_back(made);
        return true;
      }
      case 0x85: case 0x86: case 0x87: return combine(op - 0x84, false);  // TUPLE1-3
      case 'R': return combine(2, true);                                 // REDUCE: callable, arguments
      case 0x81: return combine(2, false);                               // NEWOBJ: class, arguments
      case 0x92: return combine(3, false);                               // NEWOBJ_EX
      case 'a': case 's': case 'b': {  // APPEND, SETITEM, BUILD: into the item below
        const size_t n = op == 's' ? 2 : 1;
        if (stack_.size() < floor() + n + 1) return false;
        const int32_t into = stack_[stack_.size() - n - 1];
        if (into >= 0 && called_[into]) return false;
        for (size_t i = 0; i < n; ++i) edge(into, pop());
        return true;
      }
      case 'e': case 'u': case 0x90: {  // APPENDS, SETITEMS, ADDITEMS: what follows the mark
        std::vector<int32_t>& items = scratch_;
        if (!popToMark(&items) || stack_.empty()) return false;
        const int32_t into = stack_.back();
        if (into >= 0 && called_[into]) return false;
        for (int32_t item : items) edge(into, item);
        return true;
      }
      case 'p': case 'q': case 'r': case 0x94: {  // PUT, BINPUT, LONG_BINPUT, MEMOIZE
        if (stack_.size() <= floor()) return false;
        const uint64_t at = op == 0x94 ? memoized : index;
        if (memo_.size() <= at) memo_.resize(at + 1, -1);
        memo_[at] = stack_.back();
        return true;
      }
      case 'g': case 'h': case 'j':  // GET, BINGET, LONG_BINGET
        stack_.push_back(index < memo_.size() ? memo_[index] : -1);
        return true;
      case 0x93: case 'Q': case 0x98:  // STACK_GLOBAL (2 -> 1), BINPERSID, READONLY_BUFFER (1 -> 1)
        if (stack_.size() < floor() + (op == 0x93 ? 2 : 1)) return false;
        stack_.resize(stack_.size() - (op == 0x93 ? 2 : 1));
        stack_.push_back(-1);
        return true;
      case 0x80: case 0x95: case '.': return true;  // PROTO, FRAME, STOP
      default: stack_.push_back(-1); return true;  // the rest push one leaf
    }
  }

  // "" if the nodes nest at most kMaxValueDepth deep and none contains itself.
  std::string depthError() {
    const size_t n = firstChild_.size();
    // Children of a node, linked from children_ (child, next) pairs; depth
    // by an iterative post-order walk (0: unseen, -1: on the path).
    depth_.assign(n, 0);
    for (size_t root = 0; root < n; ++root) {
      if (depth_[root] != 0) continue;
      walk_.clear();
      walk_.push_back({static_cast<int32_t>(root), firstChild_[root]});
      depth_[root] = -1;
      while (!walk_.empty()) {
        auto& [at, next] = walk_.back();
        if (next >= 0) {
          const int32_t child = children_[next].first;
          next = children_[next].second;
          if (depth_[child] == -1) return "pickle builds a value that contains itself";
          if (depth_[child] == 0) {
            depth_[child] = -1;
            walk_.push_back({child, firstChild_[child]});
          }
          continue;
        }
        int64_t deepest = 0;
        for (int32_t e = firstChild_[at]; e >= 0; e = children_[e].second) {
          deepest = std::max(deepest, depth_[children_[e].first]);
        }
        depth_[at] = deepest + 1;
        if (static_cast<size_t>(depth_[at]) > kMaxValueDepth) {
          return "pickle nests values over " + std::to_string(kMaxValueDepth) + " levels deep (the cap)";
        }
        walk_.pop_back();
      }
    }
    return "";
  }

 private:
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }

  int32_t pop() {
    const int32_t top = stack_.back();
    stack_.pop_back();
    return top;
  }

  bool popToMark(std::vector<int32_t>* items) {
    if (marks_.empty()) return false;
    if (items != nullptr) items->assign(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return true;
  }

  // Pops n items into a new node (a call's result if `called`).
  bool combine(size_t n, bool called) {
    if (stack_.size() < floor() + n) return false;
    const int32_t made = node(called);
    for (size_t i = 0; i < n; ++i) edge(made, pop());
    stack_.push_back(made);
    return true;
  }

  int32_t node(bool called) {
    firstChild_.push_back(-1);
    called_.push_back(called);
    return static_cast<int32_t>(firstChild_.size() - 1);
  }

  void edge(int32_t from, int32_t to) {
    if (from < 0 || to < 0) return;
    children_.push_back({to, firstChild_[from]});
    firstChild_[from] = static_cast<int32_t>(children_.size() - 1);
  }

  std::vector<int32_t> stack_, memo_, scratch_, firstChild_;
  std::vector<size_t> marks_;
  std::vector<std::pair<int32_t, int32_t>> children_;  // (child, next edge of the same node)
  std::vector<bool> called_;
  std::vector<int64_t> depth_;
  std::vector<std::pair<int32_t, int32_t>> walk_;  // (node, next edge to visit)
};

}  // namespace

std::string checkPickle(const char* data, size_t size, bool torchValues) {
  thread_local ValueGraph graph;
  if (torchValues) graph.reset();
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
        if (pos != size) return "pickle has " + std::to_string(size - pos) + " bytes after its STOP";
        return torchValues ? graph.depthError() : "";
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
    }
    if (torchValues) {
      uint64_t index = putIndex;
      if (op == 'h' || op == 'j') index = readLength(data + start + 1, op == 'h' ? 1 : 4);
      if (op == 'g') index = std::strtoull(data + start + 1, nullptr, 10);
      if (!graph.step(op, index, op == 0x94 ? memoized - 1 : memoized)) {
        return "pickle pops past its stack, or adds to what a call returned" + at(start);
      }
    }
    if (memoPut) ++memoized;
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
