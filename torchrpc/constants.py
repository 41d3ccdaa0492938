"""Default values, in one place."""

#: Seconds an RPC may take before it fails with RpcTimeoutError (0: no limit).
DEFAULT_RPC_TIMEOUT_SEC = 60.0
#: Threads that run incoming requests on each worker.
DEFAULT_NUM_WORKER_THREADS = 16
#: How workers find each other when no init_method is given.
DEFAULT_INIT_METHOD = "env://"
#: Seconds init_rpc waits for the whole job to join the rendezvous: torch's
#: rendezvous default (30 minutes), which upstream's init_rpc waits for
#: workers that start late.
DEFAULT_INIT_TIMEOUT_SEC = 1800.0
#: Seconds shutdown(graceful=True) waits for this worker's calls and the other
#: workers; 0, as upstream: no limit (a parameter server waits there while
#: its trainers train; a worker that died is not waited for).
DEFAULT_SHUTDOWN_TIMEOUT_SEC = 0.0
#: Upstream's sentinel: "use the default timeout".
UNSET_RPC_TIMEOUT = -1.0
#: Worker names: letters, digits, '_' and '-', fewer than this many characters.
MAX_NAME_LENGTH = 128
#: The largest message (payload and tensors) a worker accepts, in bytes.
DEFAULT_MAX_MESSAGE_BYTES = 16 << 30
#: Bytes of requests from one peer a worker holds (running and waiting) before
#: it stops reading from that peer.
DEFAULT_MAX_PEER_BYTES = 4 << 30
#: Requests from one peer a worker runs at once; later ones wait their turn.
DEFAULT_MAX_CALLS_IN_FLIGHT = 256
#: Seconds without a sign of life from a peer that owes responses before its
#: calls fail (0: never). TORCHRPC_HEARTBEAT_SECONDS overrides the default.
DEFAULT_HEARTBEAT_TIMEOUT_SEC = 30.0
#: The largest rank of a worker in a job without a world_size (workers join and
#: leave): upstream's worker ids are 16-bit (csrc/agent/members.h kMaxDynamicRank).
MAX_DYNAMIC_RANK = 32767
