"""What torchrpc holds in this process: the session init_rpc starts, the
"is it initialised" guard, and the names given to :func:`torchrpc.register`.

Every other module reads the session through :func:`current` or
:func:`require`; only :mod:`torchrpc.lifecycle` installs and clears it.
"""

import functools
import numbers
import threading

from torchrpc import constants, errors, rendezvous
from torchrpc._extension import native


class WorkerInfo:
    """A worker of the job: its unique ``name`` and its rank ``id``.

    Comparable (by id, then name), hashable and picklable.

    Attributes:
        id (int): the worker's rank.
        name (str): the worker's name.
    """

    __slots__ = ("id", "name")

    def __init__(self, name, id):
        rendezvous.validate_name(name, "WorkerInfo(name=...)")
        self.name = name
        self.id = id

    def _key(self):
        return (self.id, self.name)

    def __eq__(self, other):
        return isinstance(other, WorkerInfo) and self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, WorkerInfo):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def __reduce__(self):
        return (WorkerInfo, (self.name, self.id))

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, name={self.name})"


class Session:
    """What init_rpc set up in this process; read-only once installed, except
    ``closing``, which shutdown() sets under :data:`lock`."""

    def __init__(self, agent, rref_ctx, rank, options):
        self.worker = None  # the lifecycle (csrc/worker); set once it has started
        self.agent = agent
        self.rref_ctx = rref_ctx  # the RRef protocol (csrc/rref)
        self.callbacks = native().CallbackRunner()  # runs rpc_async completions
        peers = agent.peers()  # (name, rank, tcp address, unix address, host id) by rank
        self.addresses = (peers[rank][2], peers[rank][3])  # (tcp, unix) this worker listens on
        self.closing = False  # shutdown() has begun
        self.workers = [WorkerInfo(p[0], p[1]) for p in peers]
        self.me = self.workers[rank]
        self.by_name = {w.name: w for w in self.workers}
        self.options = options

    def resolve(self, to, call):
        """The WorkerInfo of `to` (a name, a rank or a WorkerInfo); `call`
        names the API function in the error."""
        if isinstance(to, WorkerInfo):
            if to.id < len(self.workers) and self.workers[to.id] == to:
                return to
            raise errors.UnknownWorkerError(f"{call}: {to} is not a worker of this job (could not find destination)")
        if isinstance(to, str):
            info = self.by_name.get(to)
            if info is None:
                known = ", ".join(sorted(self.by_name))
                raise errors.UnknownWorkerError(
                    f"{call}: unknown worker {to!r}; known workers: {known} (could not find destination)")
            return info
        if isinstance(to, numbers.Integral) and not isinstance(to, bool):
            if 0 <= to < len(self.workers):
                return self.workers[to]
            raise errors.UnknownWorkerError(
                f"{call}: no worker has rank {to}; ranks are 0..{len(self.workers) - 1} (could not find destination)")
        if isinstance(to, numbers.Real) and not isinstance(to, bool):  # a ValueError, as upstream
            raise errors.UnknownWorkerError(
                f"{call}: no worker has rank {to}; ranks are integers 0..{len(self.workers) - 1} "
                "(could not find destination)")
        raise TypeError(
            f"{call}(to=...) expects a worker name (str), a rank (int) or a WorkerInfo; "
            f"got {type(to).__name__}"
        )

    def timeout(self, timeout, call):
        """`timeout` in seconds as a float; -1 or None is the session's default."""
        if timeout is None or timeout == constants.UNSET_RPC_TIMEOUT:
            return self.options.rpc_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"{call}(timeout=...) expects seconds as a number; got {type(timeout).__name__}")
        if timeout < 0:
            raise ValueError(f"{call}(timeout={timeout}): use seconds >= 0 (0 means no timeout) or -1 for the default")
        return float(timeout)


_session = None
# Held by init_rpc and shutdown while they install, close or clear the session.
lock = threading.Lock()
_script_names = {}  # ScriptFunction or ScriptModule -> name given to torchrpc.register


def current():
    """The running session, or None."""
    return _session


def install(session):
    global _session
    _session = session


def clear():
    global _session
    _session = None


def require(what=None):
    """The running session; raises NotInitializedError when there is none.

    Args:
        what (str): what was called, named in the message; None for the
            public API functions, whose message gives init_rpc's arguments.
    """
    session = _session
    if session is None:
        if what is None:
            raise errors.NotInitializedError(
                "RPC has not been initialized: torchrpc is not initialized in this process; call "
                "torchrpc.init_rpc(name, rank=..., world_size=...) first."
            )
        raise errors.NotInitializedError(
            f"{what}: torchrpc is not initialized in this process (Current RPC agent is not set! Did you "
            "initialize the RPC framework?); call torchrpc.init_rpc() first."
        )
    return session


def require_initialized(fn):
    """Decorates a public API function: raises NotInitializedError before it runs
    outside a session."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _session is None:
            require()
        return fn(*args, **kwargs)

    return wrapper


def callbacks():
    """The session's callback runner (runs rpc_async completions)."""
    session = _session
    if session is None:
        raise errors.NotInitializedError("torchrpc shut down while a call was being set up")
    return session.callbacks


def register_script(name, fn):
    """Records the name callers use for `fn`, and tells the running agent."""
    _script_names[fn] = name
    session = _session
    if session is not None:
        session.agent.register_script(name, fn)


def script_name(fn):
    """The name given to torchrpc.register for `fn`, or None."""
    return _script_names.get(fn)


def script_names():
    """(fn, name) of every registered function, for a new session's agent."""
    return list(_script_names.items())
