#include "worker/worker.h"

#include <unistd.h>

#include <fstream>

#include "autograd/engine.h"

namespace torchrpc {

std::string localHostId() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (boot && std::getline(boot, bootId)) id += "|" + bootId;
  char ns[256] = {0};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n > 0) id += "|" + std::string(ns, static_cast<size_t>(n));
  return id;
}

Worker::Worker(AgentOptions options, c10::intrusive_ptr<c10d::Store> store,
               const std::function<void(Agent&)>& beforeServing) {
  if (options.hostId.empty()) options.hostId = localHostId();
  const int rank = options.rank;
  const int worldSize = options.worldSize;
  agent_ = std::make_shared<Agent>(options);
  try {
    rendezvous_ = std::make_unique<Rendezvous>(std::move(store), rank, worldSize);
    auto [tcp, unixAddr] = agent_->listen();
    agent_->setPeers(rendezvous_->exchange(PeerInfo{options.name, rank, tcp, unixAddr, options.hostId}));
    autograd::install(*agent_);
    if (beforeServing) beforeServing(*agent_);
    agent_->startServing();
    Agent::setCurrent(agent_);
  } catch (...) {
    agent_->shutdown();
    throw;
  }
}

Worker::~Worker() { agent_->shutdown(); }

void Worker::shutdown(double timeoutSeconds) {
  size_t left = agent_->waitPending(timeoutSeconds);
  std::exception_ptr failure;
  if (left == 0) {
    try {
      // The same barriers as Python's shutdown (torchrpc/api.py): everyone is
      // done calling; then everyone has released its RRefs (this C++ worker
      // holds none).
      rendezvous_->barrier("shutdown", timeoutSeconds);
      rendezvous_->barrier("rref-shutdown", timeoutSeconds);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agent_->shutdown();
  TORCH_CHECK(left == 0, "shutdown on ", agent_->options().name, ": ", left, " call(s) still pending after ",
              timeoutSeconds, " s");
  if (failure) std::rethrow_exception(failure);
}

}  // namespace torchrpc
