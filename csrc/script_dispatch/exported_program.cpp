#include "script_dispatch/exported_program.h"

#include <ATen/core/grad_mode.h>
#include <ATen/cpu/Utils.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include <unistd.h>

#include "autograd/context.h"
#include "script_dispatch/exported_signature.h"

namespace torchrpc::script_dispatch {

namespace {

std::optional<c10::DeviceType> packageDevice(const std::unordered_map<std::string, std::string>& metadata) {
  auto it = metadata.find("AOTI_DEVICE_KEY");
  if (it == metadata.end()) return std::nullopt;
  if (it->second == "cpu") return c10::DeviceType::CPU;
  if (it->second == "cuda") return c10::DeviceType::CUDA;
  return std::nullopt;
}

// Rethrows the exception being handled as a ValueError naming the package.
[[noreturn]] void cannotLoad(const std::string& path, const std::string& name) {
  std::string why;
  try {
    throw;
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  } catch (const std::exception& e) {
    why = e.what();
  }
  C10_THROW_ERROR(ValueError, "cannot load the AOTInductor package '" + path + "' as '" + name + "': " + why);
}

// AOTInductor compiles CPU code for the compiling machine's vector ISA
// (AOTI_CPU_ISA, e.g. "AVX512 AVX512_VNNI"); on a CPU without it the code
// dies of an illegal instruction, so such a package is refused before it is
// loaded. Unknown ISA names are let through.
void refuseForeignIsa(const std::unordered_map<std::string, std::string>& metadata, const std::string& path,
                      const std::string& name) {
  auto it = metadata.find("AOTI_CPU_ISA");
  if (it == metadata.end()) return;
  static const std::map<std::string, std::vector<std::string>> needs = {
      {"AVX2", {"avx2", "fma3"}},
      {"AVX512", {"avx512_f", "avx512_dq", "avx512_vl", "avx512_bw"}},
      {"AVX512_VNNI", {"avx512_vnni"}},
      {"AMX_TILE", {"amx_tile"}},
  };
  const auto have = at::cpu::get_cpu_capabilities();
  std::istringstream isa(it->second);
  for (std::string token; isa >> token;) {
    auto need = needs.find(token);
    if (need == needs.end()) continue;
    for (const auto& feature : need->second) {
      auto found = have.find(feature);
      if (found != have.end() && found->second.isBool() && !found->second.toBool()) {
        C10_THROW_ERROR(ValueError, "the AOTInductor package '" + path + "' ('" + name + "') was compiled for CPU ISA '" +
                                        it->second + "', but this CPU lacks " + feature +
                                        ": compile the program on a machine of this kind");
      }
    }
  }
}

class ExportedProgramCallee final : public Callee {
 public:
  ExportedProgramCallee(const std::string& path, const std::string& name, size_t concurrency,
                        const std::string& signature)
      : name_(name) {
    std::unordered_map<std::string, std::string> packaged;
    try {
      packaged = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
    } catch (const std::exception&) {
      cannotLoad(path, name);
    }
    refuseForeignIsa(packaged, path, name);
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          path, "model", /*run_single_threaded=*/false, std::max<size_t>(concurrency, 1));
    } catch (const std::exception&) {
      cannotLoad(path, name);
    }
    auto metadata = loader_->get_metadata();
    std::string text = signature;
    if (text.empty()) {
      auto it = metadata.find(kSignatureKey);
      if (it == metadata.end()) {
        C10_THROW_ERROR(ValueError, "the AOTInductor package '" + path +
                                        "' has no torchrpc signature in its metadata: register it with "
                                        "torchrpc.register(name, path) from Python, which reads its call spec");
      }
      text = it->second;
    }
    signature_ = ExportedSignature::parse(text);
    schema_ = std::make_unique<c10::FunctionSchema>(signature_.schema(name));
    device_ = packageDevice(metadata);
  }

  const c10::FunctionSchema& schema() const override { return *schema_; }

  void checkInputs(const torch::jit::Stack& stack) const override { signature_.check(stack, device_); }

  c10::intrusive_ptr<c10::ivalue::Future> runAsync(torch::jit::Stack& stack, TaskLauncher /*launcher*/) override {
    refuseGradInContext(stack);
    auto inputs = signature_.packageInputs(stack);
    std::vector<at::Tensor> outputs;
    {
      at::NoGradGuard noGrad;  // out= kernels refuse inputs that require grad
      outputs = loader_->run(inputs);
    }
    auto done = c10::make_intrusive<c10::ivalue::Future>(schema_->returns().at(0).type());
    done->markCompleted(signature_.result(std::move(outputs)));
    return done;
  }

 private:
  // A package has no backward: recording it in a distributed autograd
  // context would silently cut the graph there.
  void refuseGradInContext(const torch::jit::Stack& stack) const {
    const int64_t context = autograd::Container::currentId();
    if (context < 0) return;
    for (size_t i = 0; i < stack.size(); ++i) {
      if (stack[i].isTensor() && stack[i].toTensor().requires_grad()) {
        TORCH_CHECK(false, "'", name_, "' is an exported program (AOTInductor package), which is inference-only: "
                    "argument '", signature_.inputs().at(i).name, "' requires grad inside distributed autograd "
                    "context ", context, ", but the package has no backward. Pass it detached (x.detach()) "
                    "or call outside dist_autograd.context()");
      }
    }
  }

  std::string name_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  ExportedSignature signature_;
  std::unique_ptr<c10::FunctionSchema> schema_;
  std::optional<c10::DeviceType> device_;
};

// Removes a file when it goes out of scope.
struct RemovedFile {
  std::string path;
  ~RemovedFile() {
    if (!path.empty()) std::remove(path.c_str());
  }
};

}  // namespace

std::shared_ptr<Callee> shippedExportedProgram(const std::string& bytes, const std::string& name,
                                               size_t concurrency) {
  const char* dir = std::getenv("TMPDIR");
  std::string pattern = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/torchrpc-package-XXXXXX.pt2";
  std::vector<char> path(pattern.begin(), pattern.end());
  path.push_back('\0');
  int fd = ::mkstemps(path.data(), 4);  // mode 0600, a fresh name
  if (fd < 0) C10_THROW_ERROR(ValueError, "cannot write the shipped package of '" + name + "': " + std::strerror(errno));
  RemovedFile removed{path.data()};
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      C10_THROW_ERROR(ValueError, "cannot write the shipped package of '" + name + "': " + std::strerror(errno));
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  return exportedProgramCallee(path.data(), name, concurrency);
}

std::shared_ptr<Callee> exportedProgramCallee(const std::string& packagePath, const std::string& name,
                                              size_t concurrency, const std::string& signature) {
  return std::make_shared<ExportedProgramCallee>(packagePath, name, concurrency, signature);
}

}  // namespace torchrpc::script_dispatch
