#pragma once

// Loop: one epoll thread per agent. It owns no sockets; connections and the
// listener register their fd with a handler that runs on the loop. An eventfd
// wakes it for deferred work. When nothing happens it sleeps in epoll_wait
// with no timeout: an idle worker uses no CPU.
//
// "On the loop" means holding its turn: the loop thread takes the turn to
// run handlers and deferred work, and so may another thread that is idle
// anyway (pollOnce(): a pool thread waiting for the next request reads it
// itself, instead of waiting for the loop thread's wake-up). One thread at a
// time is on the loop, so handlers need no locks of their own.
//
// Thread-safety: add/modify/remove/defer may be called from any thread. A
// handler removed while it runs finishes that run; it is never called again.
// Handlers must tolerate being called for an event another thread already
// served (a read that finds nothing).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

struct epoll_event;

namespace torchrpc::transport {

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

  // Runs fn on the loop, after the current iteration.
  void defer(std::function<void()> fn);
  // The calling thread is on the loop (in a handler or deferred work).
  bool inLoop() const;

  // If no other thread is on the loop, serves the events ready now (without
  // waiting) and the deferred work. Any thread may call it; the loop thread
  // goes on serving what comes meanwhile.
  void pollOnce();
  // Events that threads other than the loops' own served, in this process
  // (tests: idle pool threads read requests themselves).
  static uint64_t servedByOthers();

  // Runs the deferred work still queued, then stops and joins the thread.
  void stop();

 private:
  void run();
  // Runs the handlers of n events and the deferred work; the turn is held.
  // Only the loop thread reads the wake eventfd (so that it wakes for stop()).
  // Returns how many handlers ran.
  int serve(const epoll_event* events, int n, bool loopThread);
  void drainDeferred();
  // Runs fn; an exception it throws is logged, never thrown on.
  void guarded(const std::function<void()>& fn);

  const std::string workerName_;
  int epollFd_{-1};
  int wakeFd_{-1};
  std::atomic<bool> stopping_{false};
  std::mutex turn_;  // held by the thread on the loop
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<Handler>> handlers_;
  std::vector<std::function<void()>> deferred_;
  uint64_t nextToken_{1};
  std::thread thread_;
};

}  // namespace torchrpc::transport
