"""``_all_gather``, ``_barrier`` and ``_wait_all_workers``: upstream's private
helpers of ``torch.distributed.rpc.api``, which some programs use as barriers.

Each worker sends its object to a leader (the first of the workers' names,
sorted) over RPC; once the leader has every object, it sends the whole dict
back to each. Calls are matched by a sequence number per set of workers, so
every worker of the set must make the same calls in the same order. It runs
over authenticated RPC, never through the rendezvous store: the objects are
pickles. Shutdown does not use it (the native worker meets the others itself).
"""

import threading
import time
import weakref

from torchrpc import constants, dispatch, errors, state

_lock = threading.Lock()
_by_session = weakref.WeakKeyDictionary()  # Session -> _Gathers


class _Gather:
    """One all-gather, on one worker: the leader collects, a follower waits for the result."""

    def __init__(self):
        self.values = {}
        self.result = None
        self.done = threading.Event()


class _Gathers:
    def __init__(self):
        self.next_seq = {}  # names -> the sequence number of this worker's next call
        self.live = {}  # (names, seq) -> _Gather

    def entry(self, names, seq, create=True):
        key = (names, seq)
        g = self.live.get(key)
        if g is None and create:
            g = self.live[key] = _Gather()
        return g


def _gathers(session):
    g = _by_session.get(session)
    if g is None:
        g = _by_session[session] = _Gathers()
    return g


def _arrive(names, seq, name, obj):
    # On the leader: worker `name` reached all-gather `seq`.
    session = state.require("torchrpc.api._all_gather()")
    with _lock:
        gathers = _gathers(session)
        # Not yet called here (followers may come first), or still waiting; else given up.
        g = gathers.entry(names, seq, create=seq >= gathers.next_seq.get(names, 0))
        if g is None:
            return
        g.values[name] = obj
        complete = len(g.values) == len(names) and not g.done.is_set()
        if complete:
            g.result = dict(g.values)
            g.done.set()
    if complete:
        me = session.me.name
        for follower in names:
            if follower != me:
                dispatch.invoke("rpc_async", follower, _deliver, (names, seq, g.result), None,
                                constants.UNSET_RPC_TIMEOUT)


def _deliver(names, seq, result):
    # On a follower: the leader's result of all-gather `seq`.
    session = state.require("torchrpc.api._all_gather()")
    with _lock:
        gathers = _gathers(session)
        if seq >= gathers.next_seq.get(names, 0):
            return  # never called here: nothing waits for it
        g = gathers.entry(names, seq, create=False)
        if g is None:
            return  # the caller gave up (timed out) already
        g.result = result
        g.done.set()


def _all_gather(obj, worker_names=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Gathers `obj` from every worker of `worker_names` (default: the whole
    job); returns ``{worker name: its obj}`` on each of them.

    Raises:
        ValueError: this worker is not among `worker_names`.
        RpcTimeoutError: not every worker arrived within `timeout` seconds
            (default: the RPC timeout); the message names those missing.
        RuntimeError: a worker could not be reached.
    """
    session = state.require("torchrpc.api._all_gather()")
    if timeout == constants.UNSET_RPC_TIMEOUT:
        timeout = session.options.rpc_timeout
    deadline = time.monotonic() + timeout if timeout > 0 else None
    me = session.me.name
    if worker_names is None:
        worker_names = [w.name for w in session.worker_infos()]
    names = tuple(sorted(set(worker_names)))
    if me not in names:
        raise ValueError(f"_all_gather on {me}: this worker is not among worker_names {list(names)}")
    with _lock:
        gathers = _gathers(session)
        seq = gathers.next_seq.get(names, 0)
        gathers.next_seq[names] = seq + 1
        g = gathers.entry(names, seq)
    leader = names[0]
    try:
        if me == leader:
            _arrive(names, seq, me, obj)
        else:
            dispatch.invoke("rpc_sync", leader, _arrive, (names, seq, me, obj), None, timeout or 0).wait()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not g.done.wait(left):
            waiting = f"workers {sorted(set(names) - set(g.values))}" if me == leader else f"the leader {leader}"
            raise errors.RpcTimeoutError(
                f"_all_gather #{seq} of {list(names)} on {me} timed out after {timeout} s waiting for {waiting} "
                "(RPC ran for more than set timeout): every worker must make the same _all_gather calls"
            )
        return g.result
    finally:
        with _lock:
            gathers.live.pop((names, seq), None)


def _wait_all_workers(timeout=constants.DEFAULT_SHUTDOWN_TIMEOUT_SEC):
    """Returns once every worker of the job has called it (a barrier over
    RPC); this worker keeps serving calls meanwhile. See :func:`_all_gather`."""
    _all_gather(None, timeout=timeout)


def _barrier(worker_names):
    """Returns once every worker of `worker_names` has called it with the same names."""
    try:
        _all_gather(None, set(worker_names))
    except errors.RpcError as err:
        raise type(err)(f"Failed to complete barrier, got error {err}") from err
