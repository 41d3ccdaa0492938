#pragma once

// Agent: one per initialised worker. It owns the loop, the listener, the
// connections (agent_connections.cpp), the thread pool and the table of
// pending calls, and is the only component that knows request ids and
// deadlines.
//
// Flow. send() assigns an id, records the call in Pending, picks (or lazily
// opens) the connection to the peer and writes the frame; it returns a future.
// On the callee, the loop hands each request to the pool, where one switch on
// the message type picks the handler (script_dispatch for script/builtin
// calls, the Python bridge's handler for Python calls); the handler responds
// exactly once, on the connection the request came from. Responses complete the
// caller's future on its loop thread.
//
// Threads: public methods may be called from any thread, except shutdown(),
// which must not be called from a pool or loop thread. Callers in Python must
// release the GIL around shutdown() and future waits.

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "agent/interceptor.h"
#include "agent/members.h"
#include "agent/pending.h"
#include "agent/thread_pool.h"
#include "auth/handshake.h"
#include "common/error.h"
#include "message/message.h"
#include "message/reply.h"
#include "script_dispatch/callee_policy.h"
#include "script_dispatch/registry.h"
#include "transport/connection.h"
#include "transport/listener.h"
#include "transport/loop.h"

namespace torchrpc::agent {

struct AgentOptions {
  std::string name;
  int rank{0};
  int worldSize{1};                     // <= 0: a dynamic job (members.h)
  size_t numWorkerThreads{16};
  double defaultTimeoutSeconds{60.0};   // calls that pass timeout -1 (TorchScript ops)
  std::string listenHost{"127.0.0.1"};  // TCP interface to listen on
  std::string hostId;                   // peers with the same id use Unix sockets
  std::string secret;                   // the job's; every connection proves it (auth/handshake.h)
  script_dispatch::CalleePolicy policy;  // what peers may run here, what is taken back (callee_policy.h)
  transport::Limits limits;             // per connection: caps and heartbeats (connection.h)
  // Connections still in their handshake; beyond this cap (or beyond
  // Agent::maxConnections() open ones) an accepted connection is closed at once.
  static constexpr size_t kMaxHandshaking = 64;
  double peerGraceSeconds{5.0};         // a peer lost without GOODBYE is gone after this (worker/peer_watch.h)
  // The options class the user set, as errors name it (the timeout's default
  // is its rpc_timeout): the TORCHRPC backend's users set upstream's.
  std::string optionsType{"RpcOptions"};
};

class Agent : public std::enable_shared_from_this<Agent> {
 public:
  using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
  // Runs on a pool thread; answers `reply` once (maybe later, from another
  // thread). An exception it throws before answering becomes the answer.
  using Handler = std::function<void(message::Message&& request, int callerRank, message::Reply reply)>;

  // Runs on the I/O thread, in the order requests arrive, before a request
  // is queued for the pool: takes it and returns true (it answered it, or
  // moved it on to the pool itself), or returns false, leaving `request` as
  // it was, for the pool's handler. It must not block, run user code or need
  // the GIL: for answers that are ready (a fetch of a value that exists), and
  // for state that later requests must find (a remote()'s RRef).
  using FastPath = std::function<bool(message::Message& request, int callerRank, const message::Reply& reply)>;

  explicit Agent(AgentOptions options);
  ~Agent();

  // Starts listening; returns {tcpAddress, unixAddress} to publish.
  std::pair<std::string, std::string> listen();
  // The whole job's table, indexed by rank; after the rendezvous. A dynamic
  // job's members as this worker joins (itself included).
  void setPeers(std::vector<PeerInfo> peers);
  // A dynamic job: a worker joined (throws c10::Error if its name or rank is
  // taken), or left; `why` says how, for the errors of later calls to it.
  void addPeer(PeerInfo peer) { members_.add(std::move(peer)); }
  void removePeer(int rank, const std::string& why) { members_.remove(rank, why); }
  // `what` names the handler's work in the error of an exception it throws
  // (default: the message type).
  void setHandler(message::MessageType type, Handler handler, std::string what = "");
  void setFastPath(message::MessageType type, FastPath fastPath);
  // Sees every request and response on its way (distributed autograd,
  // profiling). Add them before startServing(); the last added wraps
  // outermost (interceptor.h).
  void addInterceptor(std::shared_ptr<Interceptor> interceptor) { interceptors_.push_back(std::move(interceptor)); }
  // Runs on the loop thread when a connection to a peer of the job closes
  // without the peer's GOODBYE (it crashed, was killed, or the network
  // failed), unless this worker is shutting down. It must not block. Add
  // callbacks before startServing().
  using PeerLost = std::function<void(int rank, const std::string& reason)>;
  void onPeerLost(PeerLost callback) { peerLost_.push_back(std::move(callback)); }
  // Call once peers and handlers are set. Until then, frames that arrive (a
  // fast peer may finish the rendezvous first) are held, then handled in order.
  void startServing();

  // Sends a request to rank dst. The future completes with the response's
  // value: SCRIPT_RET's IValue, or for PYTHON_RET and TORCH_RESPONSE a tuple
  // (payload as a uint8 tensor, list of tensors); or fails with an RpcError. callKind and function
  // name the call in errors: "rpc_sync #7 worker0 -> worker1 (addr) 'f'".
  // timeoutSeconds <= 0 means no deadline. Never throws: a request refused
  // before anything was sent (a bad rank, a tensor the wire refuses) fails
  // the future at once with kInvalidArgument (see refusedBeforeSending).
  FuturePtr send(int dst, message::Message&& request, double timeoutSeconds, const std::string& callKind,
                 const std::string& function);
  // Whether send(dst, ...) of `bytes` would return without waiting: connected
  // (or oneself) and not backlogged. A hint; the answer may change at once.
  bool sendsAtOnce(int dst, uint64_t bytes) const;
  // The calling thread holds the I/O loop's turn (in a fast path or a
  // connection's callback): it must not wait for anything.
  bool onLoop() const;
  // Some interceptor would give a request without an envelope a scope now
  // (Interceptor::scopesPlainRequests): fast paths that would skip it decline.
  bool scopesPlainRequests() const;

  // The one switch on the message type, on the calling (pool) thread: runs
  // `request` with the handler of its type and answers `reply`. RRef owners
  // run the call that creates a value through it, with a reply that keeps the
  // value. `scope` (from the interceptor) covers the handler's continuations.
  void serve(message::Message&& request, int callerRank, message::Reply reply,
             const std::shared_ptr<CallScope>& scope = nullptr);
  // Runs `fn`, a handler's continuation, on the pool under `scope` (a
  // handler's CallScope::current(), maybe null), which is current meanwhile.
  void continueOnPool(std::shared_ptr<CallScope> scope, std::function<void()> fn);

  // Whether a connection to `rank` is open or can be opened within
  // `timeoutSeconds` (a worker that exited listens no more: refused at once).
  // May connect; not on the loop thread.
  bool reachable(int rank, double timeoutSeconds);

  // Waits until no call of this worker is pending; returns how many still are.
  size_t waitPending(double timeoutSeconds);
  // Waits until every connection is quiet (Connection::quiet: what peers
  // asked of this worker is answered and written), up to timeoutSeconds;
  // returns how many requests are still unanswered then (0 once quiet).
  // A graceful shutdown calls it before its GOODBYE.
  size_t quiesce(double timeoutSeconds);
  // Stops serving: GOODBYE to every peer, fails what is pending, joins threads.
  void shutdown();

  // The agent of this process's init_rpc, for code that has no handle on it
  // (the TorchScript ops); null when torchrpc is not initialised.
  static std::shared_ptr<Agent> current();
  static void setCurrent(std::shared_ptr<Agent> agent);

  const AgentOptions& options() const { return options_; }
  // The rank of the worker named `name`, or -1.
  int rankOf(const std::string& name) const { return members_.rankOf(name); }
  // The worker of `rank`; throws if it is not (or no longer) a member.
  PeerInfo peer(int rank) const;
  const Members& members() const { return members_; }
  // Open connections beyond which an accepted one is refused: two per member
  // of the job now, plus kMaxHandshaking.
  size_t maxConnections() const { return 2 * members_.size() + AgentOptions::kMaxHandshaking; }
  script_dispatch::Registry& registry() { return registry_; }
  ThreadPool& pool() { return *pool_; }
  size_t pendingCount() const { return pending_.size(); }
  size_t connectionCount() const;

 private:
  common::Fallible<std::shared_ptr<transport::Connection>> connectionTo(const PeerInfo& peer, double timeoutSeconds);
  void adopt(const std::shared_ptr<transport::Connection>& conn);
  void onMessageFromLoop(const std::shared_ptr<transport::Connection>& conn, message::Message&& m,
                         transport::Ticket ticket);
  // Accepted fd: a connection. At the caps the oldest connection still in its
  // handshake makes room; with none, the new one is refused.
  void accept(int fd, const std::string& description);
  void onCloseFromLoop(const std::shared_ptr<transport::Connection>& conn, const std::string& reason);
  void onAuthenticatedFromLoop(const std::shared_ptr<transport::Connection>& conn, int rank);
  std::unique_ptr<auth::Handshake> handshake(auth::Handshake::Role role, int dst) const;
  // Completes the call `m` answers. A value's tensors are referenced by the
  // value alone when the future completes: torch increfs or decrefs a
  // tensor's Python object, under the GIL, when its C++ count goes 1->2 or
  // 2->1, so the message's own references, dropped here after the caller had
  // wrapped a tensor, made the I/O thread wait for the GIL. The future
  // itself is let go of as common/python_held.h says.
  void onResponse(message::Message&& m, int src, uint64_t connectionId);
  void complete(Pending::Call& call, message::Message&& m, int src);
  // The response to request `id` whose result cannot travel (a tensor the
  // wire refuses, `why`): the caller gets why.
  message::Message resultCannotTravel(uint64_t id, const std::string& why) const;
  // Applies the interceptors, then serve().
  void dispatch(message::Message&& request, int callerRank, message::Reply reply);
  void respondOn(const std::shared_ptr<transport::Connection>& conn, message::Message&& response,
                 const transport::Ticket& ticket);
  std::string peerLabel(const PeerInfo& peer) const;

  const AgentOptions options_;
  Members members_;
  std::unordered_map<uint16_t, std::pair<Handler, std::string>> handlers_;  // handler, what
  std::unordered_map<uint16_t, FastPath> fastPaths_;
  std::vector<std::shared_ptr<Interceptor>> interceptors_;  // innermost first
  std::vector<PeerLost> peerLost_;
  script_dispatch::Registry registry_;
  const std::chrono::steady_clock::time_point started_;

  Pending pending_;
  std::unique_ptr<transport::Loop> loop_;  // before pool_: pool threads read it until they stop
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<transport::Listener> listener_;

  mutable std::mutex connectionsMutex_;
  std::unordered_map<uint64_t, std::shared_ptr<transport::Connection>> connections_;
  std::unordered_set<uint64_t> saidGoodbye_;  // loop thread only
  bool serving_{false};                       // loop thread only
  struct Held {
    std::shared_ptr<transport::Connection> conn;
    message::Message message;
    transport::Ticket ticket;
  };
  std::vector<Held> held_;  // loop thread only
  std::atomic<bool> shuttingDown_{false};
  std::atomic<bool> stopped_{false};
};

// The error of a future that Agent::send failed before sending anything (a
// caller's mistake, for its caller to raise at once), or null.
std::exception_ptr refusedBeforeSending(const Agent::FuturePtr& future);

}  // namespace torchrpc::agent
