#pragma once

// RRefContext: one per initialised worker; the RRef protocol's state and
// handlers (upstream's "Remote Reference Protocol", implemented once for
// script, builtin and Python calls alike).
//
// State: the owner's side in OwnerTable (owner_table.h), the user's side in
// UserTable (user_table.h), each an explicit state machine; the protocol
// steps in flight in InFlight (in_flight.h).
//
// Protocol steps (upstream's Note [Early Fork Registration] and friends):
//   fork(rref) on the sender P (pickling an RRef into a message):
//     owner sends: the new fork is added to owners_ at once;
//     user sends:  the RRef is kept in pendingChildren_ until CHILD_ACCEPT, or,
//                  for a request to the owner (fork(rref, requestTo)), until
//                  the owner answers that request (releaseWhenAnswered).
//   receive(forkData) on the receiver R:
//     R is the owner: it gets its OwnerRRef; if P == R the fork added while
//       pickling is dropped again, otherwise P gets CHILD_ACCEPT, unless
//       the fork came in P's request to R (ForkData::answered): R decodes a
//       request before it answers it, and P lets go on the answer;
//     P is the owner: a confirmed UserRRef (the owner registered the fork);
//     otherwise: a pending UserRRef; FORK_REQUEST to the owner; on its ack the
//       user is confirmed and P gets CHILD_ACCEPT.
//   remote(): the caller makes a pending UserRRef and sends REMOTE_CALL; the
//     owner registers the fork, creates the value, acks; the ack confirms.
//
// Creating a value runs the creating call through the agent's one switch
// (Agent::serve) with a reply that keeps the value.
//
// Bounds: an id that a peer asks about before its creation arrives (it may
// legitimately still be in flight from a third worker) makes a kAwaited owner
// entry that counts against that peer's cap (OwnerTable::kMaxAwaitedPerPeer)
// and expires, failing its waiters, if the creation has not come within this
// worker's default timeout (kAwaitedFallbackSeconds when that is 0). No pool
// thread waits for such a value: requests of it are answered from the
// callback of its future. releasePeer() drops what a lost peer held.
//
// Threads: every public method may be called from any thread. Handlers run on
// the agent's pool, except three that the I/O thread takes when they need no
// GIL: a plain REMOTE_CALL's registration (remoteAtOnce; its creation runs on
// the pool), fetches (fetchAtOnce) and USER_DELETEs of small TorchScript
// values (deleteAtOnce). Follow-ups of a response that may send (a fork's
// confirm, which sends CHILD_ACCEPT) run on the pool, never on the I/O
// thread; remote()'s confirm, which only sets state, runs where its ack is
// read. No RRef is ever destroyed while a table's lock is held (a UserRRef
// destructor calls back into the context).

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "agent/agent.h"
#include "common/timers.h"
#include "rref/in_flight.h"
#include "rref/owner_table.h"
#include "rref/rref.h"
#include "rref/user_table.h"

namespace torchrpc::rref {

class RRefContext : public std::enable_shared_from_this<RRefContext> {
 public:
  using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
  // Encodes a PyObject IValue as a response: SCRIPT_RET if it is plain, else
  // PYTHON_RET (takes the GIL).
  using PythonEncoder = std::function<message::Message(uint64_t id, const c10::IValue& value)>;
  // Calls method `name` of an owner's value (takes the GIL) and responds,
  // exactly once, with its result or the exception (RREF_METHOD_CALL).
  using PythonMethodRunner =
      std::function<void(uint64_t id, const c10::IValue& object, const std::string& name,
                         const c10::IValue& args, const c10::IValue& kwargs, message::Reply reply)>;

  // Creates the context and installs its handlers on the agent. The newest
  // context becomes current() (one init_rpc or torchrpc::Worker per process).
  static std::shared_ptr<RRefContext> create(std::shared_ptr<agent::Agent> agent);
  ~RRefContext();
  // The context of this process's running session, for code with no handle
  // on it (the TorchScript RRef class and ops, jit_ops/); null when none is
  // running (never initialised, or stop() was called).
  static std::shared_ptr<RRefContext> current();

  void setPythonEncoder(PythonEncoder encoder);
  void setPythonMethodRunner(PythonMethodRunner runner);

  int rank() const { return rank_; }
  agent::Agent& agent() const { return *agent_; }
  const std::string& workerName() const { return agent_->options().name; }
  std::string workerLabel(int rank) const;
  // Calls that pass timeout -1 (the TorchScript RRef class and ops) use this.
  double defaultTimeoutSeconds() const { return agent_->options().defaultTimeoutSeconds; }

  // RRef(value): a new owner RRef of a local value.
  std::shared_ptr<OwnerRRef> createOwner(c10::IValue value);

  // remote(): `call` is a SCRIPT/BUILTIN/PYTHON call message for rank dst.
  // Returns dst's OwnerRRef when dst is this worker, else a pending UserRRef.
  std::shared_ptr<RRef> remote(int dst, message::Message&& call, double timeoutSeconds,
                               const std::string& function);

  // to_here() of a user RRef: RREF_FETCH to the owner. The future completes
  // with the response value: a 1-tuple (value) for an IValue, the usual
  // (payload, tensors) pair for a Python value; or fails with the owner's error.
  FuturePtr fetch(const std::shared_ptr<UserRRef>& rref, double timeoutSeconds);

  // rref.rpc_sync().name(*args, **kwargs) without pickling: sends `call`, an
  // RREF_METHOD_CALL of rref (rref_messages.h; its arguments hold no RRef),
  // to the owner. Completes like fetch(); `rref` is kept alive until then.
  // A user RRef's owner knows it by its fork; an owner RRef that was never
  // forked is not in its owner's table, so the owner's own proxies pickle.
  FuturePtr methodCall(const std::shared_ptr<RRef>& rref, message::Message&& call, const std::string& name,
                       double timeoutSeconds, const std::string& callKind);

  // Pickling an RRef into a message, and unpickling it on the receiver.
  // Neither blocks nor sends on the calling thread (receive() may run on the
  // I/O thread while a response is decoded): receive()'s FORK_REQUEST or
  // CHILD_ACCEPT is sent from the pool, counted in flight at once.
  // `requestTo`: the rank this fork is sent to in a request, if it is one
  // (-1: a response, or not known). A user sending to the owner in a request
  // makes an `answered` fork: pass the request's future to releaseWhenAnswered.
  ForkData fork(const std::shared_ptr<RRef>& rref, int requestTo = -1);
  // Releases the parent's holds on the answered ones of `forks` (the forks
  // of one request) when `call`, the request, is answered: with a value, the callee's error,
  // or a closed connection. A call that timed out may still be decoded later,
  // so its holds stay until shutdown releases every user RRef.
  void releaseWhenAnswered(const FuturePtr& call, const std::vector<ForkData>& forks);
  std::shared_ptr<RRef> receive(const ForkData& fork);
  // The message that carried `fork` was never sent: undo fork().
  void cancelFork(const ForkData& fork);

  // Graceful shutdown: sends USER_DELETE for every live confirmed user (later
  // destructors send nothing), then waitIdle().
  void releaseAllUsers();
  // Waits until no protocol message of this worker is in flight, and what it
  // let go of is dropped (common::waitDropped); returns how many still are.
  size_t waitIdle(double timeoutSeconds);
  // After the agent stopped: drops every table; later releases send nothing.
  void stop();

  // Peer `rank` is gone (lost without GOODBYE and not back after the grace
  // period, worker/peer_watch.h): every owner here releases the forks it held
  // (a value nobody else holds is freed), and the awaited entries it made are
  // failed and dropped. Not on the I/O thread (values may need the GIL).
  void releasePeer(int rank);
  size_t awaitedCount(int requester) const { return owners_->awaitedCount(requester); }

  // Protocol handlers; public so unit tests can feed messages in any order.
  void onForkRequest(const RRefId& rrefId, const ForkId& forkId, int holder = OwnerTable::kUnknownHolder);
  void onUserDelete(const RRefId& rrefId, const ForkId& forkId);
  void onChildAccept(const ForkId& forkId);

  struct Snapshot {
    // (rrefId, forks known to the owner, value ready, creation failed)
    std::vector<std::tuple<std::string, std::vector<std::string>, bool, bool>> owners;
    std::vector<std::string> localOwners;  // every live OwnerRRef object
    // (rrefId, forkId, owner rank, confirmed, deleted)
    std::vector<std::tuple<std::string, std::string, int, bool, bool>> users;
    std::vector<std::string> pendingUsers;     // forkIds
    std::vector<std::string> pendingChildren;  // forkIds
    size_t inFlight{0};
  };
  Snapshot snapshot() const;

  // Called by RRef destructors.
  void userReleased(UserRRef& user);
  void forgetOwner(const RRefId& id, const OwnerRRef* owner);

 private:
  explicit RRefContext(std::shared_ptr<agent::Agent> agent);
  void installHandlers();
  GlobalId newId();
  // Runs the call that creates `owner`'s value (on this pool thread), then
  // ends the creation; `token` counts it in flight until then.
  void runCreation(const std::shared_ptr<OwnerRRef>& owner, message::Message&& call, int callerRank,
                   InFlight::Token token, std::function<void()> done = nullptr);
  // A REMOTE_CALL's owner entry, with its caller's fork, moving the creating
  // call out of `request` into *call. Throws if the value exists already.
  std::shared_ptr<OwnerRRef> startRemote(message::Message& request, int callerRank, message::Message* call);
  // Runs the creation (runCreation), then acks the REMOTE_CALL.
  void createAndAck(const std::shared_ptr<OwnerRRef>& owner, message::Message&& call, int callerRank,
                    InFlight::Token token, const message::Reply& reply);
  // The pool's handler, for a REMOTE_CALL in an envelope (a context, a profile).
  void handleRemoteCall(message::Message&& request, int callerRank, const message::Reply& reply);
  // The I/O thread's handling of a plain REMOTE_CALL: registers its RRef in
  // the order requests arrive, so that a fetch or method call read right
  // after it finds the entry there (no pool task of its own), then queues
  // the creation on the pool. False (malformed, or the server's global
  // profiler on) leaves it to the pool.
  bool remoteAtOnce(message::Message& request, int callerRank, const message::Reply& reply);
  void handleFetch(message::Message&& request, int callerRank, const message::Reply& reply);
  void handleMethodCall(message::Message&& request, int callerRank, const message::Reply& reply);
  // The owner entry of `id`, made kAwaited for `requester` (and set to
  // expire) if there was none; null after stop(). Throws at the cap.
  std::shared_ptr<OwnerRRef> awaitedOwner(const RRefId& id, int requester);
  // Fails and drops the kAwaited entry of `owner` if its creation has not
  // started within awaitedLifetimeSeconds().
  void expireLater(const std::shared_ptr<OwnerRRef>& owner);
  double awaitedLifetimeSeconds() const;
  // The I/O thread's handling of a fetch of an entry that exists (false
  // leaves it to handleFetch, on the pool): see answerFetch.
  bool fetchAtOnce(const message::Message& request, const message::Reply& reply);
  // The I/O thread's handling of a USER_DELETE whose value it can free at
  // once (a small TorchScript value; false leaves it to the pool): one pool
  // task less per dropped RRef.
  bool deleteAtOnce(const message::Message& request, const message::Reply& reply);
  // Answers a fetch of `owner`'s value: at once if it is there, else when it
  // is, from the thread that completes it. Python values and errors are
  // answered on the pool unless `onPool` says this thread already is.
  void answerFetch(const RRefId& rrefId, const std::shared_ptr<OwnerRRef>& owner, const message::Reply& reply,
                   bool onPool);
  message::Message encodeValue(uint64_t id, const c10::IValue& value);
  // Sends a protocol request, counted in flight until it is answered and
  // `then` (if any) ran with the outcome: on the pool, or, with
  // `thenWhereAnswered`, on the thread that completes the call (often the
  // I/O thread: for a `then` that only sets state, and sends nothing itself).
  FuturePtr sendTracked(int dst, message::Message&& m, double timeoutSeconds, const std::string& callKind,
                        const std::string& what, std::function<void(std::exception_ptr)> then,
                        bool thenWhereAnswered = false);
  // sendTracked() where it cannot wait, counted in flight from now: at once
  // when the connection takes the message without waiting (never on the I/O
  // thread, which must not connect), else from a pool thread.
  void sendTrackedSoon(int dst, message::Message&& m, const std::string& what,
                       std::function<void(std::exception_ptr)> then);
  // The owner acknowledged (or failed to) fork `forkId`: confirm the pending
  // user; tell the parent (if >= 0) with CHILD_ACCEPT.
  void confirmUser(const ForkId& forkId, std::exception_ptr error, int parent);

  std::shared_ptr<agent::Agent> agent_;
  const int rank_;
  std::atomic<int64_t> nextLocal_{0};  // from 0, as upstream numbers them
  PythonEncoder pythonEncoder_;
  PythonMethodRunner pythonMethodRunner_;

  // Set in create(): they hand out weak references to the context.
  std::unique_ptr<OwnerTable> owners_;
  UserTable users_;
  InFlight inFlight_;
  common::Timers expiries_;  // of kAwaited owner entries
  std::atomic<bool> stopped_{false};
};

}  // namespace torchrpc::rref
