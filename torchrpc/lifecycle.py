"""init_rpc and shutdown: this worker's session starts and stops.

The steps themselves are the C++ Worker's (``csrc/worker/worker.h``), the
same for C++ programs: here the arguments are checked, the store is opened,
the Python handlers are installed through the Worker's hook, and the
Python-side caches are reset at the end.
"""

import atexit
import numbers
import warnings

from torchrpc import constants, errors, python_fallback, rendezvous, shipped_code, state
from torchrpc._extension import native
from torchrpc.options import RpcOptions, check_backend


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Joins this process to an RPC job as worker `name`.

    With a `world_size`, blocks until every worker of the job has joined (up
    to ``RpcOptions.init_timeout``). Without one (and no ``WORLD_SIZE`` with
    ``env://``) the job is dynamic: this worker joins the workers that are
    there now, which learn of it before init_rpc returns, and leaves alone at
    :func:`shutdown`; every worker of such a job must omit world_size.

    Args:
        name (str): unique name of this worker: letters, digits, ``_``, ``-``, ``.`` and ``:``,
            fewer than 128 characters.
        backend (BackendType): ``None`` (default) or
            ``BackendType.TENSORPIPE`` (torchrpc's or ``torch.distributed.rpc``'s):
            torchrpc has one backend.
        rank (int): unique rank in ``[0, world_size)`` (in ``[0, 32767]``
            without a world_size); ``-1`` (default) reads ``RANK`` from the
            environment with ``env://``.
        world_size (int): number of workers; ``None`` reads ``WORLD_SIZE``
            with ``env://``, else makes the job dynamic.
        rpc_backend_options (RpcOptions): see :class:`RpcOptions`.

    Raises:
        TypeError, ValueError: on invalid arguments, a name used twice in the
            job, or an already initialized process.
        RuntimeError: the rendezvous store holds a job of the other kind
            (static and dynamic workers cannot mix), or, joining a dynamic
            job, the name or rank is not unique.
    """
    rendezvous.validate_name(name)
    check_backend(backend)
    options = RpcOptions.coerce(rpc_backend_options, backend)
    if rank is not None and not isinstance(rank, numbers.Integral):
        raise TypeError(f"init_rpc(rank=...) expects an int; got {type(rank).__name__}")
    if world_size is not None and not isinstance(world_size, numbers.Integral):
        raise TypeError(f"init_rpc(world_size=...) expects an int; got {type(world_size).__name__}")
    with state.lock:
        running = state.current()
        if running is not None:
            raise RuntimeError(
                f"torchrpc is already initialized in this process as {running.me.name!r}; "
                "call torchrpc.shutdown() before init_rpc() again."
            )
        store, rank, world_size = rendezvous.open_store(options, rank, world_size)

        def before_serving(agent, rref_ctx):
            # The Worker's hook: the Python handlers and the session, in place
            # before the first call is served (a call may come at once).
            agent.set_python_handler(python_fallback.handle_call, python_fallback.handle_remote,
                                     python_fallback.encode_value)
            agent.set_script_resolver(python_fallback.resolve_script)
            rref_ctx.install_python(python_fallback.encode_value, python_fallback.handle_method)
            for fn, explicit in state.script_names():
                agent.register_script(explicit, fn)
            for exported_name, path, signature in state.exported_programs():
                agent.register_exported(exported_name, path, signature)
            state.install(state.Session(agent, rref_ctx, rank, options, dynamic=world_size is None))

        try:
            worker = native().Worker(_agent_options(name, rank, world_size, options), store, before_serving)
        except BaseException:
            state.clear()  # the Worker stopped what it had started
            raise
        state.current().worker = worker


def _agent_options(name, rank, world_size, options):
    """The native AgentOptions of this worker."""
    o = native().AgentOptions()
    o.name, o.rank, o.world_size = name, rank, world_size or 0  # 0: a dynamic job
    o.listen_host = rendezvous.listen_host(options.init_method)
    o.host_id = rendezvous.host_id()
    o.secret = options.secret or b""
    o.callee_policy = options.callee_policy()
    o.num_worker_threads, o.rpc_timeout = options.num_worker_threads, options.rpc_timeout
    for field in ("max_message_bytes", "max_peer_bytes", "max_calls_in_flight", "heartbeat_timeout"):
        setattr(o.limits, field, getattr(options, field))
    return o


def shutdown(graceful=True, timeout=constants.DEFAULT_SHUTDOWN_TIMEOUT_SEC):
    """Leaves the job and stops this worker's agent.

    Args:
        graceful (bool): if True (default), first wait until this worker's own
            calls have completed and every worker of the job has reached
            shutdown, serving their calls meanwhile (a worker of a dynamic job
            waits for its own calls only, then leaves the job: the others
            drop it). If False, stop at once; pending calls fail with
            ShutdownError.
        timeout (float): seconds the graceful wait may take; the agent then
            stops regardless and the error names what was missing. ``0``
            (default, as torch.distributed.rpc): no limit on the wait for this
            worker's calls and for the others to reach shutdown, however long
            they work (a worker that died is not waited for); the steps
            after they met take at most the RPC timeout.

    Raises:
        RpcTimeoutError: the graceful wait took longer than `timeout`.
        PeerUnreachableError: the rendezvous store went away before every
            worker met.
    """
    with state.lock:
        session = state.current()
        if session is None or session.closing:
            return
        # The worker keeps serving until every worker got here, and what it
        # serves may use torchrpc (nested calls, RRefs): the session stays installed.
        session.closing = True
    try:
        failure, leaked = session.worker.stop(graceful, timeout)
    finally:
        # Runs the completions of the calls shutdown failed; bounded as the
        # native steps after the meeting when shutdown has no limit.
        session.callbacks.stop(timeout if timeout > 0 else session.options.rpc_timeout or 60.0)
        native().reap_thread_states()  # the Python thread states of the threads that stopped
        python_fallback.forget_sent()
        shipped_code.forget()
        with state.lock:
            state.clear()
    if failure is not None:
        raise errors.from_native(failure)
    if leaked:
        warnings.warn(
            f"shutdown on {session.me.name}: {len(leaked)} owner RRef(s) still had users after every "
            f"worker released its RRefs (leaked): "
            + ", ".join(f"{rid} forks={forks}" for rid, forks, *_ in leaked[:10]),
            ResourceWarning,
            stacklevel=2,
        )


@atexit.register
def _shutdown_at_exit():
    # A process that forgot shutdown() still stops its threads before exiting.
    if state.current() is not None:
        shutdown(graceful=False)
    # What torchrpc still has to drop is kept from here on: a thread that
    # asks for the GIL while Python finalizes aborts the process.
    native().stop_dropping(1.0)
