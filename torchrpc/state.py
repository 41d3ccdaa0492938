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
    ``closing``, which shutdown() sets under :data:`lock`, and a dynamic job's
    table of workers, which follows the agent's as workers join and leave."""

    def __init__(self, agent, rref_ctx, rank, options, dynamic=False):
        self.worker = None  # the lifecycle (csrc/worker); set once it has started
        self.agent = agent
        self.rref_ctx = rref_ctx  # the RRef protocol (csrc/rref)
        self.callbacks = native().CallbackRunner()  # runs rpc_async completions
        self.closing = False  # shutdown() has begun
        self.dynamic = dynamic  # init_rpc without world_size: workers join and leave
        self.options = options
        self._version = None
        self._load()
        self.me = self._by_rank[rank]
        mine = next(p for p in agent.peers() if p[1] == rank)
        self.addresses = (mine[2], mine[3])  # (tcp, unix) this worker listens on

    def _load(self):
        # The version first: a change while peers() is read shows at the next check.
        version = self.agent.membership_version()
        by_rank = {p[1]: WorkerInfo(p[0], p[1]) for p in self.agent.peers()}
        self._by_rank, self._by_name, self._version = by_rank, {w.name: w for w in by_rank.values()}, version

    def _table(self):
        """(by rank, by name) of the workers in the job now."""
        if self.dynamic and self.agent.membership_version() != self._version:
            self._load()
        return self._by_rank, self._by_name

    def worker_infos(self):
        """Every worker of the job now, by rank."""
        return sorted(self._table()[0].values())

    def worker_at(self, rank):
        """The WorkerInfo of `rank`, or None."""
        return self._table()[0].get(rank)

    def resolve(self, to, call):
        """The WorkerInfo of `to` (a name, a rank or a WorkerInfo); `call`
        names the API function in the error."""
        if type(to) is str and not self.dynamic:  # the common case, in one lookup
            info = self._by_name.get(to)
            if info is not None:
                return info
        by_rank, by_name = self._table()
        if isinstance(to, WorkerInfo):
            if by_rank.get(to.id) == to:
                return to
            self._raise_departed(to.name, call)
            raise errors.UnknownWorkerError(f"{call}: {to} is not a worker of this job (could not find destination)")
        if isinstance(to, str):
            info = by_name.get(to)
            if info is None:
                self._raise_departed(to, call)
                known = ", ".join(sorted(by_name))
                raise errors.UnknownWorkerError(
                    f"{call}: unknown worker {to!r}; known workers: {known} (could not find destination)")
            return info
        if isinstance(to, numbers.Integral) and not isinstance(to, bool):
            info = by_rank.get(to)
            if info is not None:
                return info
            self._raise_departed(int(to), call)
            raise errors.UnknownWorkerError(
                f"{call}: no worker has rank {to}; ranks are {_ranges(sorted(by_rank))} (could not find destination)")
        if isinstance(to, numbers.Real) and not isinstance(to, bool):  # a ValueError, as upstream
            raise errors.UnknownWorkerError(
                f"{call}: no worker has rank {to}; ranks are integers {_ranges(sorted(by_rank))} "
                "(could not find destination)")
        raise TypeError(
            f"{call}(to=...) expects a worker name (str), a rank (int) or a WorkerInfo; "
            f"got {type(to).__name__}"
        )

    def _raise_departed(self, who, call):
        """Raises PeerUnreachableError if `who` (a name or rank) left this dynamic job."""
        why = self.agent.departed(who) if self.dynamic else None
        if why is not None:
            raise errors.PeerUnreachableError(
                f"{call}: {why}, so it cannot be called; the job's workers now: "
                f"{', '.join(w.name for w in self.worker_infos())}"
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


def _ranges(ranks):
    """'0..3, 5' for [0, 1, 2, 3, 5]."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(r) if start == r else f"{start}..{r}")
            start = None
    return ", ".join(out)


_session = None
# Held by init_rpc and shutdown while they install, close or clear the session.
lock = threading.Lock()
_script_names = {}  # ScriptFunction or ScriptModule -> the name callers send for it (the last registered)
_registered_scripts = {}  # name given to torchrpc.register -> what it runs (the last given)
# Changes whenever register() or async_execution() changes what a caller
# derives from a function (torchrpc.dispatch caches that by function).
callees_generation = 0


def callees_changed():
    global callees_generation
    callees_generation += 1
_exported = {}  # name given to torchrpc.register -> (package path, signature override)


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
    """Records the name callers use for `fn` and what `name` runs, and tells
    the running agent. Every name given stays served; a name given to
    another function no longer stands for the one it named before."""
    before = _registered_scripts.get(name)
    if before is not None and before is not fn and _script_names.get(before) == name:
        del _script_names[before]  # sent by its own name again, not one that runs another function
    _script_names[fn] = name
    _registered_scripts[name] = fn
    callees_changed()
    session = _session
    if session is not None:
        session.agent.register_script(name, fn)


def register_exported(name, path, signature):
    """Records an exported program's package under `name`, and tells the
    running agent (which loads it now, so a bad package fails here)."""
    session = _session
    if session is not None:
        session.agent.register_exported(name, path, signature)
    _exported[name] = (path, signature)


def exported_programs():
    """(name, path, signature) of every registered package, for a new session's agent."""
    return [(name, path, sig) for name, (path, sig) in _exported.items()]


def script_name(fn):
    """The name given to torchrpc.register for `fn`, or None."""
    return _script_names.get(fn)


def script_names():
    """(fn, name) of every registered name, for a new session's agent."""
    return [(fn, name) for name, fn in _registered_scripts.items()]
