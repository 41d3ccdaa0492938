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
    rrefs_ = rref::RRefContext::create(agent_);
    autograd::install(*agent_);
    if (beforeServing) beforeServing(*agent_);
    agent_->startServing();
    Agent::setCurrent(agent_);
  } catch (...) {
    agent_->shutdown();
    throw;
  }
}

Worker::~Worker() {
  agent_->shutdown();
  if (rrefs_) rrefs_->stop();
}

void Worker::shutdown(double timeoutSeconds) {
  size_t left = agent_->waitPending(timeoutSeconds);
  std::exception_ptr failure;
  if (left == 0) {
    try {
      // The same steps as Python's shutdown (torchrpc/api.py): everyone is
      // done calling; everyone releases its user RRefs (twice: a user may be
      // confirmed during the first pass) and waits for the owners' acks.
      rendezvous_->barrier("shutdown", timeoutSeconds);
      for (int pass = 0; pass < 2; ++pass) {
        rrefs_->releaseAllUsers();
        TORCH_CHECK(rrefs_->waitIdle(timeoutSeconds) == 0 && agent_->waitPending(timeoutSeconds) == 0,
                    "shutdown on ", agent_->options().name,
                    ": RRef protocol messages still unanswered after ", timeoutSeconds, " s");
      }
      rendezvous_->barrier("rref-shutdown", timeoutSeconds);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agent_->shutdown();
  rrefs_->stop();
  TORCH_CHECK(left == 0, "shutdown on ", agent_->options().name, ": ", left, " call(s) still pending after ",
              timeoutSeconds, " s");
  if (failure) std::rethrow_exception(failure);
}

}  // namespace torchrpc
