#pragma once

// A bounds check of a peer's pickle, before torch's unpickler or Python's
// reads it.
//
// torch::jit::Unpickler trusts the lengths a pickle declares: a string
// opcode declaring 4 GB makes it zero-fill 4 GB before it finds the data
// missing, and a memo index of 4e9 makes it grow its memo to match (Python's
// C unpickler grows its memo the same way). A payload
// of a few bytes could so hold a pool thread and gigabytes. This walks the
// opcodes once and refuses a pickle whose declared lengths run past its end,
// whose memo indices jump ahead of the memo, or that uses an opcode outside
// pickle protocols 0-5.

#include <cstddef>
#include <string>

namespace torchrpc::message {

// How deep a value that torch's unpickler builds may nest: torch recurses
// once per level (to destroy it, convert it, print it), and 100,000 nested
// lists, 200 KB of pickle, overflowed an 8 MB stack.
inline constexpr size_t kMaxValueDepth = 1000;

// "" if `data` may be unpickled, else what is wrong with it. With
// `torchValues` (a pickle for torch's unpickler, which builds IValues) it
// also follows the values the pickle builds, in one pass with memory linear
// in its opcodes, and refuses one that nests deeper than kMaxValueDepth,
// contains itself, pops what it never pushed, or adds to what a call
// (REDUCE) returned: torch's pickler writes none of these, and a call's
// result may be any value it was given, so the check could not follow it.
std::string checkPickle(const char* data, size_t size, bool torchValues = false);

// How deep a pickle's type tag ("Dict[str, List[int]]", a container's
// TorchScript type) may nest: torch's type parsers recurse once per level,
// and a tag of 5,000 levels (30 KB) overflowed an 8 MB stack.
inline constexpr size_t kMaxTypeTagDepth = 100;

// "" if torch may parse `tag` as a type, else what is wrong with it.
std::string checkTypeTag(const std::string& tag);

}  // namespace torchrpc::message
