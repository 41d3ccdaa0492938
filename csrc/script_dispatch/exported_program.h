#pragma once

// Exported programs as callees: an AOTInductor package
// (torch._inductor.aoti_compile_and_package of a torch.export program),
// loaded with torch's package loader and run on the pool thread without
// Python or the GIL, behind the same Callee interface as TorchScript, so
// calls by name go through the one dispatch path (run_script.h).
//
// Its schema and input checks come from the signature torchrpc writes into
// the package's metadata (exported_signature.h); `signature` overrides it for
// a package compiled elsewhere. The loader keeps `concurrency` model
// instances, one per pool thread, so concurrent calls run in parallel.
// Packages are inference-only: an input that requires grad inside a
// distributed autograd context is refused.

#include <memory>
#include <string>

#include "script_dispatch/callee.h"

namespace torchrpc::script_dispatch {

// Throws c10::ValueError if the package cannot be loaded or has no signature.
std::shared_ptr<Callee> exportedProgramCallee(const std::string& packagePath, const std::string& name,
                                              size_t concurrency, const std::string& signature = "");

// The most bytes a shipped package may have (checked by shipped_code.cpp
// before it copies them).
inline constexpr size_t kMaxShippedPackageBytes = size_t{1} << 30;

// A package a caller shipped, as its bytes: written to a private temporary
// file for the loader (which extracts it), removed once loaded.
std::shared_ptr<Callee> shippedExportedProgram(const std::string& bytes, const std::string& name,
                                               size_t concurrency);

}  // namespace torchrpc::script_dispatch
