#pragma once

// Shipped code: TorchScript functions a callee has never seen, sent by the
// caller as the bytes of `ScriptFunction.save_to_buffer()` (a TorchScript zip
// holding the function and everything it calls) and compiled here, in C++,
// without Python; or exported programs, sent as their AOTInductor package
// (exported_program.h). Cached in the registry by content hash
// ("sha1:<hex>"), so the code travels once per worker and a call by hash can
// never reach a different function.
//
//   shipped = (format: str, sha1: str, code: uint8 Tensor or None)
//
// The caller first calls by name; on UnknownFunctionError it resends with the
// code, and later calls carry only (format, sha1, None).

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>

#include <memory>
#include <string>

#include "script_dispatch/registry.h"

namespace torchrpc::script_dispatch {

// The formats this build reads; a caller with another gets a clear error.
inline constexpr const char* kShippedFormat = "torchscript-zip/1";
inline constexpr const char* kShippedPackageFormat = "aoti-package/1";

// What a shipped zip's records may declare in all: torch allocates a
// record's declared size before it reads it (or writes it to disk, for a
// package), so a lying or deflated entry could make a small message hold
// gigabytes. torch deflates code and debug info about 4-6x.
inline constexpr uint64_t kMaxShippedInflation = 64;
inline constexpr uint64_t kMaxShippedRecordBytes = uint64_t{1} << 30;

// How deep a shipped TorchScript source may nest: torch's parser and
// compiler recurse once per level (an operator chain's length counts, as
// its tree is that deep), and overflowed an 8 MB stack between 5,000 and
// 20,000 levels. torch prints code with one operation per statement.
inline constexpr size_t kMaxShippedSourceDepth = 1000;

// The deepest nesting in a TorchScript source, as an upper bound (each
// column of indentation, operator, call, subscript and bracket a level;
// strings and comments none), and the line where it is.
struct ShippedDepth {
  size_t depth = 0;
  size_t line = 0;
};
ShippedDepth shippedSourceDepth(const char* source, size_t size);

// Refuses (c10::ValueError) a shipped zip that torch would trust too far: one
// that is no torch archive, whose records declare more than the caps above,
// or, with `pickles` (a TorchScript zip), whose pickles message::checkPickle
// refuses or whose code nests deeper than kMaxShippedSourceDepth.
void checkShippedArchive(const std::string& bytes, bool pickles, const std::string& function,
                         const std::string& worker);

// The callee for a shipped function: from the registry by hash, else compiled
// from `code` (checked against the hash), else nullptr (the caller must send
// the code). Throws c10::ValueError on a format or hash mismatch, or an
// archive that checkShippedArchive refuses.
std::shared_ptr<Callee> shippedCallee(Registry& registry, const c10::IValue& shipped,
                                      const std::string& function, const std::string& worker);

}  // namespace torchrpc::script_dispatch
