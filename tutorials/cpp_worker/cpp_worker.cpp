// A worker without Python: joins a torchrpc job, loads a TorchScript model
// that calls other workers (saved from Python with torch.jit.save), runs it,
// and serves it to the other workers under the name "<name>.forward".
//
// Build:  .venv/bin/python tutorials/cpp_worker/build.py   (-> build/cpp_worker)
// Run:    build/cpp_worker NAME RANK WORLD_SIZE MASTER_ADDR MASTER_PORT MODEL.pt [--try]
//                          [--package CALLEE_NAME PACKAGE.pt2]...
//         (--try: also run forward(tensor([0., 1., 2.])) here once and print it;
//          --package: also serve an exported program under CALLEE_NAME, an
//          AOTInductor package compiled by torchrpc (torchrpc.exported.package
//          in Python), whose metadata carries the signature callers are
//          checked against: docs/exported-programs.md)
//
// The job's rendezvous is a TCPStore at MASTER_ADDR:MASTER_PORT, hosted by
// rank 0, as with init_method="tcp://MASTER_ADDR:MASTER_PORT" in Python.

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/script.h>

#include <iostream>

#include "script_dispatch/callee.h"
#include "script_dispatch/exported_program.h"
#include "worker/worker.h"

// "[0, 6, 12]"
std::string show(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.numel(); ++i) {
    out += (i ? ", " : "") + std::to_string(static_cast<int64_t>(t[i].item<float>()));
  }
  return out + "]";
}

int main(int argc, char** argv) {
  bool tryForward = false;
  std::vector<std::pair<std::string, std::string>> packages;  // (callee name, package path)
  bool usage = argc < 7;
  for (int i = 7; i < argc && !usage; ++i) {
    const std::string flag = argv[i];
    if (flag == "--try") {
      tryForward = true;
    } else if (flag == "--package" && i + 2 < argc) {
      packages.emplace_back(argv[i + 1], argv[i + 2]);
      i += 2;
    } else {
      usage = true;
    }
  }
  if (usage) {
    std::cerr << "usage: " << argv[0] << " NAME RANK WORLD_SIZE MASTER_ADDR MASTER_PORT MODEL.pt [--try]"
              << " [--package CALLEE_NAME PACKAGE.pt2]...\n";
    return 2;
  }
  const std::string name = argv[1];
  const int rank = std::stoi(argv[2]);
  const int worldSize = std::stoi(argv[3]);

  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<uint16_t>(std::stoi(argv[5]));
  storeOptions.isServer = false;
  storeOptions.numWorkers = worldSize;
  storeOptions.waitWorkers = true;  // counts this client in, as Python clients do
  storeOptions.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::TCPStore>(argv[4], storeOptions);

  torchrpc::agent::AgentOptions options;
  options.name = name;
  options.rank = rank;
  options.worldSize = worldSize;
  options.numWorkerThreads = 4;
  // The model's forward calls other workers through the torchrpc:: ops.
  torch::jit::Module model = torch::jit::load(argv[6]);
  // Exported programs run on the pool threads: one model instance per thread.
  std::vector<std::pair<std::string, std::shared_ptr<torchrpc::script_dispatch::Callee>>> exported;
  for (const auto& [callee, path] : packages) {
    exported.emplace_back(callee, torchrpc::script_dispatch::exportedProgramCallee(path, callee,
                                                                                 options.numWorkerThreads));
    std::cout << name << ": serving the exported program " << path << " as " << callee << std::endl;
  }
  torchrpc::worker::Worker worker(options, store, [&](torchrpc::agent::Agent& agent, torchrpc::rref::RRefContext&) {
    agent.registry().add(name + ".forward", torchrpc::script_dispatch::moduleMethodCallee(model, "forward"));
    for (const auto& [callee, program] : exported) agent.registry().add(callee, program);
  });
  std::cout << name << ": joined a job of " << worldSize << " workers" << std::endl;

  if (tryForward) {
    torch::Tensor x = torch::arange(3, torch::kFloat);
    try {
      torch::Tensor y = model.forward({x}).toTensor();
      std::cout << name << ": forward(" << show(x) << ") = " << show(y) << std::endl;
    } catch (const std::exception& e) {
      std::cout << name << ": forward(" << show(x) << ") failed: " << e.what() << std::endl;
    }
  }

  worker.shutdown(/*timeoutSeconds=*/120);  // serves "<name>.forward" until all are done
  std::cout << name << ": done" << std::endl;
  return 0;
}
