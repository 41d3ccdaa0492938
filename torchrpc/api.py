"""The RPC API: init_rpc, shutdown, rpc_sync, rpc_async, remote, get_worker_info.

Every process of a job calls :func:`init_rpc` with a unique name and rank;
then any worker can call functions on any other::

    import torch
    import torchrpc as rpc

    @torch.jit.script
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    rpc.init_rpc("worker0", rank=0, world_size=2,
                 rpc_backend_options=rpc.RpcOptions(init_method="tcp://127.0.0.1:29500"))
    rpc.rpc_sync("worker1", add, args=(torch.ones(2), torch.ones(2)))  # TorchScript: no GIL
    rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))       # builtin op: no GIL
    rpc.rpc_sync("worker1", sorted, args=([3, 1, 2],))                 # Python: cloudpickle
    rpc.shutdown()

A callee is classified once on the caller: a builtin operator runs through
the dispatcher, a ``torch.jit.ScriptFunction`` runs in the callee's C++ thread
pool without the GIL, and anything else is pickled with cloudpickle and run
under the callee's GIL.
"""

import contextlib
import os
import threading

import torch

from torchrpc import constants, dispatch, exported, jit_ops, state
from torchrpc.lifecycle import init_rpc, shutdown
from torchrpc.all_gather import _all_gather, _barrier, _wait_all_workers  # noqa: F401  upstream's private helpers
from torchrpc.rref import RRef
from torchrpc.state import WorkerInfo, require_initialized

__all__ = [
    "WorkerInfo",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "register",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]


@require_initialized
def get_worker_info(worker_name=None):
    """Returns the WorkerInfo of `worker_name`, or of this worker if None.

    Raises:
        ValueError: no worker has that name.
    """
    session = state.require()
    if worker_name is None:
        return session.me
    return session.resolve(worker_name, "get_worker_info")


class _CurrentAgent:
    """This worker's view of the job, as upstream's ``_get_current_rpc_agent()``
    gives it; a dynamic job's changes as workers join and leave."""

    def __init__(self, session):
        self._session = session

    def get_worker_info(self, worker_name=None):
        """The WorkerInfo of `worker_name`, or of this worker if None."""
        if worker_name is None:
            return self._session.me
        return self._session.resolve(worker_name, "get_worker_info")

    def get_worker_infos(self):
        """Every worker of the job now, by rank."""
        return self._session.worker_infos()

    def get_debug_info(self):
        """Upstream's agent counters, as strings: ``agent.thread_pool_size``,
        ``agent.num_pending_requests``, ``agent.num_connections``,
        ``rref.num_owner_rrefs``, ``rref.num_pending_users``."""
        session = self._session
        rrefs = session.rref_ctx.snapshot()
        return {
            "agent.thread_pool_size": str(session.options.num_worker_threads),
            "agent.num_pending_requests": str(session.agent.pending_count()),
            "agent.num_connections": str(session.agent.connection_count()),
            "rref.num_owner_rrefs": str(len(rrefs["owner_objects"])),
            "rref.num_pending_users": str(len(rrefs["pending_users"])),
        }


@require_initialized
def _get_current_rpc_agent():
    """This worker's agent: ``get_worker_info(name=None)`` and ``get_worker_infos()``."""
    return _CurrentAgent(state.require())


@require_initialized
def get_rpc_timeout():
    """The default timeout of this worker's calls, in seconds
    (``RpcOptions.rpc_timeout``; 0 means no timeout)."""
    return state.require().options.rpc_timeout


def is_available():
    """True: torchrpc always has RPC (``torch.distributed.rpc.is_available()``
    is False in torch builds without it)."""
    return True


def rpc_sync(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Runs ``func(*args, **kwargs)`` on worker `to` and returns its result.

    Thread-safe. Argument tensors must not be modified until the call returns.

    Args:
        to (str or int or WorkerInfo): the callee: name, rank or WorkerInfo.
        func (callable or str): a ``@torch.jit.script`` function (runs without
            the GIL), a builtin operator such as ``torch.add`` (runs without the
            GIL), a ``torch.export.ExportedProgram`` (compiled here once with
            AOTInductor, its package shipped to the callee once; runs without
            the GIL), any picklable Python callable (runs under the callee's
            GIL), or the name of a TorchScript function or exported program
            the callee knows (given to :func:`register` there, or a
            function's qualified name). Calls by name work the same inside
            ``@torch.jit.script`` code.
        args (tuple): positional arguments (default none).
        kwargs (dict): keyword arguments (default none).
        timeout (float): seconds before RpcTimeoutError; ``0`` means no timeout,
            ``-1`` (default) uses ``RpcOptions.rpc_timeout``.

    Returns:
        The value func returned on the callee.

    Raises:
        RpcTimeoutError: no response within `timeout`.
        PeerUnreachableError: the callee exited or its connection closed.
        Exception: what func raised on the callee, re-raised with its type when
            importable (otherwise RemoteError), the callee's traceback attached.
        TypeError, ValueError: bad arguments, unknown worker, unpicklable func.

    Example::

        >>> torchrpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))
        tensor([4., 4.])
    """
    return dispatch.call_sync(to, func, args, kwargs, timeout)


def rpc_async(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Like :func:`rpc_sync`, but returns at once with a ``torch.futures.Future``.

    The future's ``wait()`` returns the result or raises the error that
    rpc_sync would raise; ``then``, ``done``, ``value``,
    ``torch.futures.collect_all`` and ``wait_all`` work as usual. Callbacks
    added before the call completes run in order on one torchrpc thread
    (never on the I/O thread): keep them short, and do not wait in them for
    another call's future. A ``wait()`` on a future without callbacks
    completes it in the waiting thread, as fast as :func:`rpc_sync`.

    Example::

        >>> fut = torchrpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
        >>> fut.wait()
        tensor([4., 4.])
    """
    fut = dispatch.invoke("rpc_async", to, func, args, kwargs, timeout).future()
    # Read from this thread's __dict__: getattr with a default would build
    # an AttributeError on every call outside the block.
    futures = _thread_local_var.__dict__.get("future_list")
    if futures is not None:  # inside `with _wait_all()`
        futures.append(fut)
    return fut


_thread_local_var = threading.local()


@contextlib.contextmanager
def _wait_all():
    """Upstream's private helper: waits, at the end of the block, for every
    rpc_async this thread made in it (``torch.futures.wait_all``: the first
    error raises)."""
    _thread_local_var.future_list = []
    try:
        yield
    finally:
        try:
            torch.futures.wait_all(_thread_local_var.future_list)
        finally:
            del _thread_local_var.future_list


def remote(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Runs ``func(*args, **kwargs)`` on worker `to`, which keeps the result;
    returns an :class:`RRef` to it at once.

    The owner `to` creates the value asynchronously: a ``@torch.jit.script``
    function or builtin runs in its C++ thread pool without the GIL; any other
    callable (a class too: the RRef then references a remote object) runs
    under its GIL. Use ``rref.to_here()`` to copy the value, or
    ``rref.rpc_sync().method(...)`` to call methods of it on the owner.

    Inside ``@torch.jit.script`` code, the same call (with `func` the name
    of a TorchScript function the owner knows, as for :func:`rpc_sync`)
    returns the TorchScript RRef, ``torch.classes.torchrpc.RRef``: annotate
    it as ``torchrpc.RRef``; its ``to_here()`` / ``local_value()`` return
    ``Any`` (refine with ``isinstance``).

    Args:
        to (str or int or WorkerInfo): the owner of the new value.
        func (callable or str): what creates the value (see :func:`rpc_sync`),
            or the name of a TorchScript function the owner knows.
        args (tuple): positional arguments (default none).
        kwargs (dict): keyword arguments (default none).
        timeout (float): seconds for creating the value; ``0`` means no
            timeout, ``-1`` (default) uses ``RpcOptions.rpc_timeout``. If it
            passes, ``to_here()`` raises RpcTimeoutError.

    Returns:
        RRef: owned by `to` (an owner RRef if `to` is this worker).

    Raises:
        TypeError, ValueError: bad arguments, unknown worker, unpicklable func.
        An error raised while creating the value is raised by ``to_here()``
        and by the proxies, with the owner's name and traceback.

    Example::

        >>> rref = torchrpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
        >>> rref.to_here()
        tensor([4., 4.])
    """
    return RRef._wrap(dispatch.invoke("remote", to, func, args, kwargs, timeout))


jit_ops.bind(rpc_sync, jit_ops.rpc_sync)
jit_ops.bind(rpc_async, jit_ops.rpc_async)
jit_ops.bind(remote, jit_ops.remote)


def register(name, fn):
    """Registers a TorchScript function, a scripted module, or an exported
    program under a name.

    Callers may then call it by that name (``rpc_sync(to, "name", ...)``,
    also from inside TorchScript). Callers that registered the same function
    send the name instead of its qualified name (which TorchScript may mangle
    when a function is redefined). A scripted module is served by its
    ``forward``, without the GIL. Call it on every worker that serves (or
    sends) the name, before or after init_rpc. Each name given is served;
    callers passing the function send the last one.

    An exported program (``torch.export.export(...)``) is compiled with
    AOTInductor once and cached on disk by content hash (see
    ``docs/exported-programs.md``); a path is taken as an AOTInductor package
    (``.pt2``) as it is. Either runs in the callee's C++ pool without the GIL;
    inputs that do not match the exported signature (count, dtype, rank,
    static sizes, dynamic-shape bounds) raise TypeError naming the argument.

    Args:
        name (str): the name callers use.
        fn (torch.jit.ScriptFunction, torch.jit.ScriptModule,
            torch.export.ExportedProgram, str or os.PathLike): what runs.

    Example::

        >>> @torch.jit.script
        ... def double(x: torch.Tensor) -> torch.Tensor:
        ...     return x * 2
        >>> torchrpc.register("double", double)
        >>> torchrpc.register("model", torch.jit.script(MyModel()))
        >>> torchrpc.register("exported", torch.export.export(MyModel(), (torch.ones(2, 4),)))
    """
    if not isinstance(name, str) or not name:
        raise TypeError("torchrpc.register(name, fn) expects a non-empty str name")
    if isinstance(fn, (torch.jit.ScriptFunction, torch.jit.ScriptModule)):
        state.register_script(name, fn)
    elif isinstance(fn, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(fn))
        state.register_exported(name, path, exported.package_signature(path))
    elif exported.is_exported_program(fn):
        state.register_exported(name, exported.package(fn), "")
    else:
        raise TypeError(
            "torchrpc.register(name, fn) expects a @torch.jit.script function, a scripted module "
            "(torch.jit.script(module)), a torch.export.ExportedProgram or the path of an AOTInductor "
            f"package; got {type(fn).__name__}"
        )


def _debug_info():
    """Counters for tests and debugging: pending calls and open connections."""
    session = state.current()
    if session is None:
        return {"initialized": False, "pending_requests": 0, "connections": 0}
    rrefs = session.rref_ctx.snapshot()
    return {
        "initialized": True,
        "worker": session.me.name,
        "pending_requests": session.agent.pending_count(),
        "connections": session.agent.connection_count(),
        "addresses": session.addresses,
        "script_functions": sorted(session.agent.script_names()),
        "owner_rrefs": len(rrefs["owner_objects"]),
        "user_rrefs": len(rrefs["users"]),
        "rref_messages_in_flight": rrefs["in_flight"],
    }
