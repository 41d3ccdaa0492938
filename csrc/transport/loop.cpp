#include "transport/loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "common/intra_op.h"
#include "common/logging.h"
#include "common/spin.h"
#include "common/thread_name.h"

namespace torchrpc::transport {

namespace {
constexpr uint64_t kWakeToken = 0;
constexpr int kMaxEvents = 64;
thread_local const Loop* onLoop = nullptr;  // the loop whose turn this thread holds
std::atomic<uint64_t> servedElsewhere{0};

// Marks this thread as on `loop` (its turn is held) while it lives.
struct OnLoop {
  explicit OnLoop(const Loop* loop) { onLoop = loop; }
  ~OnLoop() { onLoop = nullptr; }
};
}  // namespace

Loop::Loop(std::string workerName) : workerName_(std::move(workerName)) {
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  TORCH_CHECK(epollFd_ >= 0, common::errnoMessage("epoll_create1", errno));
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TORCH_CHECK(wakeFd_ >= 0, common::errnoMessage("eventfd", errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  TORCH_CHECK(epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) == 0,
              common::errnoMessage("epoll_ctl(eventfd)", errno));
  thread_ = std::thread([this] {
    common::nameThisThread("rpc-io");
    common::initIntraOpThreads();  // it may run short TorchScript calls (script_dispatch/inline_calls.h)
    run();
  });
}

bool Loop::inLoop() const { return onLoop == this; }

Loop::~Loop() {
  stop();
  ::close(wakeFd_);
  ::close(epollFd_);
}

uint64_t Loop::add(int fd, uint32_t events, Handler handler) {
  uint64_t token;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    token = nextToken_++;
    handlers_[token] = std::make_shared<Handler>(std::move(handler));
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int err = errno;
    std::lock_guard<std::mutex> lock(mutex_);
    handlers_.erase(token);
    TORCH_CHECK(false, common::errnoMessage("epoll_ctl(ADD)", err));
  }
  return token;
}

void Loop::modify(int fd, uint64_t token, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  // ENOENT/EBADF: the fd was removed concurrently by a close; nothing to do.
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev);
}

void Loop::remove(int fd, uint64_t token) {
  epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
  std::lock_guard<std::mutex> lock(mutex_);
  handlers_.erase(token);
}

void Loop::defer(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    deferred_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  // A full counter (EAGAIN) still means the loop will wake; ignore the result.
  (void)!::write(wakeFd_, &one, sizeof(one));
}

void Loop::drainDeferred() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work.swap(deferred_);
  }
  for (auto& fn : work) {
    guarded(fn);
  }
}

void Loop::guarded(const std::function<void()>& fn) {
  // Last line of defence: handlers close their own connection on errors, so
  // whatever still escapes is a bug; it must not take the loop down with it.
  try {
    fn();
  } catch (const std::exception& e) {
    TORCHRPC_WARN(workerName_, "an I/O handler failed: " << e.what());
  } catch (...) {
    TORCHRPC_WARN(workerName_, "an I/O handler failed with a non-standard exception");
  }
}

void Loop::pollOnce() {
  if (stopping_.load()) return;
  std::unique_lock<std::mutex> turn(turn_, std::try_to_lock);
  if (!turn.owns_lock()) return;
  epoll_event events[kMaxEvents];
  int n = epoll_wait(epollFd_, events, kMaxEvents, 0);
  if (n <= 0) return;
  OnLoop on(this);
  servedElsewhere.fetch_add(serve(events, n, /*loopThread=*/false), std::memory_order_relaxed);
}

uint64_t Loop::servedByOthers() { return servedElsewhere.load(std::memory_order_relaxed); }

int Loop::serve(const epoll_event* events, int n, bool loopThread) {
  int served = 0;
  for (int i = 0; i < n; ++i) {
    uint64_t token = events[i].data.u64;
    if (token == kWakeToken) {
      if (!loopThread) continue;
      uint64_t count;
      while (::read(wakeFd_, &count, sizeof(count)) > 0) {
      }
      continue;
    }
    std::shared_ptr<Handler> handler;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = handlers_.find(token);
      if (it == handlers_.end()) continue;
      handler = it->second;
    }
    const uint32_t ready = events[i].events;
    guarded([&] { (*handler)(ready); });
    ++served;
  }
  drainDeferred();
  return served;
}

void Loop::run() {
  epoll_event events[kMaxEvents];
  common::AdaptiveSpin spin;
  while (!stopping_.load()) {
    // Right after activity, poll for a little while before sleeping: the next
    // frame of a busy connection usually arrives within microseconds.
    int n = 0;
    spin.until([&] {
      n = epoll_wait(epollFd_, events, kMaxEvents, 0);
      return n != 0;
    });
    if (n == 0) n = epoll_wait(epollFd_, events, kMaxEvents, -1);
    spin.done();
    if (n < 0) {
      if (errno == EINTR) continue;
      TORCHRPC_WARN(workerName_, common::errnoMessage("epoll_wait", errno) << "; event loop stops");
      return;
    }
    std::lock_guard<std::mutex> turn(turn_);
    OnLoop on(this);
    serve(events, n, /*loopThread=*/true);
  }
  std::lock_guard<std::mutex> turn(turn_);
  OnLoop on(this);
  drainDeferred();
}

void Loop::stop() {
  if (!thread_.joinable()) return;
  if (std::this_thread::get_id() == thread_.get_id()) {
    // Called from a handler: let the thread finish on its own; it is joined by
    // the destructor of the owner on another thread.
    stopping_.store(true);
    return;
  }
  defer([this] { stopping_.store(true); });
  thread_.join();
}

}  // namespace torchrpc::transport
