#pragma once

// Loop: one epoll thread per agent. It owns no sockets; connections and the
// listener register their fd with a handler that runs on the loop thread.
// An eventfd wakes it for deferred work. When nothing happens it sleeps in
// epoll_wait with no timeout: an idle worker uses no CPU.
//
// Thread-safety: add/modify/remove/defer may be called from any thread. A
// handler removed while it runs finishes that run; it is never called again.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace torchrpc {

class Loop {
 public:
  using Handler = std::function<void(uint32_t events)>;

  explicit Loop(std::string workerName);
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Registers fd; returns a token that identifies this registration.
  uint64_t add(int fd, uint32_t events, Handler handler);
  void modify(int fd, uint64_t token, uint32_t events);
  void remove(int fd, uint64_t token);

  // Runs fn on the loop thread, after the current iteration.
  void defer(std::function<void()> fn);
  bool inLoop() const { return std::this_thread::get_id() == threadId_; }

  // Runs the deferred work still queued, then stops and joins the thread.
  void stop();

 private:
  void run();
  void drainDeferred();

  const std::string workerName_;
  int epollFd_{-1};
  int wakeFd_{-1};
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<Handler>> handlers_;
  std::vector<std::function<void()>> deferred_;
  uint64_t nextToken_{1};
  std::thread thread_;
  std::thread::id threadId_;
};

}  // namespace torchrpc
