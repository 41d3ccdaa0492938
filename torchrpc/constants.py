"""Default values, in one place."""

#: Seconds an RPC may take before it fails with RpcTimeoutError (0: no limit).
DEFAULT_RPC_TIMEOUT_SEC = 60.0
#: Threads that run incoming requests on each worker.
DEFAULT_NUM_WORKER_THREADS = 16
#: How workers find each other when no init_method is given.
DEFAULT_INIT_METHOD = "env://"
#: Seconds init_rpc waits for the whole job to join the rendezvous.
DEFAULT_INIT_TIMEOUT_SEC = 300.0
#: Seconds shutdown(graceful=True) waits for other workers and pending calls.
DEFAULT_SHUTDOWN_TIMEOUT_SEC = 60.0
#: Upstream's sentinel: "use the default timeout".
UNSET_RPC_TIMEOUT = -1.0
#: Worker names: letters, digits, '_' and '-', fewer than this many characters.
MAX_NAME_LENGTH = 128
