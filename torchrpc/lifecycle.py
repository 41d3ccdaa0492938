"""init_rpc and shutdown: the steps that start and stop this worker's session.

They touch the session (:mod:`torchrpc.state`), the native objects (agent,
RRef context, rendezvous), the Python handlers they install and the caches
they reset; nothing calls back into them. The C++ Worker
(``csrc/worker/worker.cpp``) runs the same steps for C++ programs.
"""

import atexit
import numbers
import time
import warnings

from torchrpc import constants, errors, python_fallback, rendezvous, shipped_code, state
from torchrpc._extension import native
from torchrpc.options import RpcOptions, check_backend


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Joins this process to an RPC job as worker `name`.

    Blocks until every worker of the job has joined (up to
    ``RpcOptions.init_timeout``).

    Args:
        name (str): unique name of this worker: letters, digits, ``_`` and ``-``,
            fewer than 128 characters.
        backend (BackendType): ``None`` (default) or
            ``BackendType.TENSORPIPE`` (torchrpc's or ``torch.distributed.rpc``'s):
            torchrpc has one backend.
        rank (int): unique rank in ``[0, world_size)``; ``-1`` (default) reads
            ``RANK`` from the environment with ``env://``.
        world_size (int): number of workers; ``None`` reads ``WORLD_SIZE``.
        rpc_backend_options (RpcOptions): see :class:`RpcOptions`.

    Raises:
        TypeError, ValueError: on invalid arguments, a name used twice in the job,
            or an already initialized process.
    """
    rendezvous.validate_name(name)
    check_backend(backend)
    options = RpcOptions.coerce(rpc_backend_options)
    if rank is not None and not isinstance(rank, numbers.Integral):
        raise TypeError(f"init_rpc(rank=...) expects an int; got {type(rank).__name__}")
    if world_size is not None and not isinstance(world_size, numbers.Integral):
        raise TypeError(f"init_rpc(world_size=...) expects an int; got {type(world_size).__name__}")
    C = native()
    with state.lock:
        running = state.current()
        if running is not None:
            raise RuntimeError(
                f"torchrpc is already initialized in this process as {running.me.name!r}; "
                "call torchrpc.shutdown() before init_rpc() again."
            )
        store, rank, world_size = rendezvous.open_store(options, rank, world_size)
        rdv = rendezvous.Rendezvous(store, rank, world_size)
        agent = C.Agent(name, rank, world_size, options.num_worker_threads, options.rpc_timeout,
                        rendezvous.listen_host(options.init_method), rendezvous.host_id())
        try:
            tcp, unix = agent.listen()
            records = rdv.exchange((name, rank, tcp, unix, rendezvous.host_id()))
            agent.set_peers(records)
            agent.set_python_handler(python_fallback.handle_call)
            agent.set_script_resolver(python_fallback.resolve_script)
            rref_ctx = C.RRefContext(agent, python_fallback.handle_remote, python_fallback.encode_value,
                                     python_fallback.handle_method)
            C.autograd_install(agent)
            for fn, explicit in state.script_names():
                agent.register_script(explicit, fn)
            agent.start_serving()
            agent.make_current()  # for the TorchScript ops (jit_ops/)
        except BaseException:
            agent.shutdown()
            raise
        workers = [state.WorkerInfo(r[0], r[1]) for r in records]
        state.install(state.Session(agent, rref_ctx, workers[rank], workers, options, rdv, (tcp, unix)))


def shutdown(graceful=True, timeout=constants.DEFAULT_SHUTDOWN_TIMEOUT_SEC):
    """Leaves the job and stops this worker's agent.

    Args:
        graceful (bool): if True (default), first wait until this worker's own
            calls have completed and every worker of the job has reached
            shutdown, serving their calls meanwhile. If False, stop at once;
            pending calls fail with ShutdownError.
        timeout (float): seconds the graceful wait may take (default 60); the
            agent then stops regardless and the error names what was missing.

    Raises:
        RpcTimeoutError: the graceful wait took longer than `timeout`.
    """
    with state.lock:
        session = state.current()
        if session is None or session.closing:
            return
        # The worker keeps serving until every worker got here, and what it
        # serves may use torchrpc (nested calls, RRefs): the session stays installed.
        session.closing = True
    failure = None
    leaked = []
    try:
        if graceful:
            left = session.agent.wait_pending(timeout)
            if left:
                failure = errors.RpcTimeoutError(
                    f"shutdown on {session.me.name}: {left} call(s) still pending after {timeout} s"
                )
            else:
                started = time.monotonic()
                try:
                    session.rendezvous.barrier("shutdown", timeout)
                    failure = _release_rrefs(session, timeout)
                    session.rendezvous.barrier("rref-shutdown", timeout)
                    leaked = [o for o in session.rref_ctx.snapshot()["owners"] if o[1]]
                except Exception as err:
                    failure = _barrier_failure(session, timeout, time.monotonic() - started, err)
    finally:
        session.agent.shutdown()
        session.rref_ctx.stop()
        session.callbacks.stop(timeout)  # runs the completions of the calls shutdown failed
        native().reap_thread_states()  # the Python thread states of the threads that stopped
        python_fallback.forget_sent()
        shipped_code.forget()
        with state.lock:
            state.clear()
    if failure is not None:
        raise failure
    if leaked:
        warnings.warn(
            f"shutdown on {session.me.name}: {len(leaked)} owner RRef(s) still had users after every "
            f"worker released its RRefs (leaked): "
            + ", ".join(f"{rid} forks={forks}" for rid, forks, *_ in leaked[:10]),
            ResourceWarning,
            stacklevel=2,
        )


def _barrier_failure(session, timeout, waited, err):
    """The error of a graceful shutdown whose meeting of all workers failed:
    a timeout, or the store gone (its host exited) well before it."""
    if waited < 0.9 * timeout:
        host = f"rank 0 ({session.workers[0].name})"
        return errors.PeerUnreachableError(
            f"shutdown on {session.me.name}: the rendezvous store stopped answering after "
            f"{waited:.2f} s ({err}). With tcp:// and env:// {host} hosts it, and it has "
            f"probably exited without shutdown(); the other workers cannot meet. Shut them "
            f"down with shutdown(graceful=False).")
    return errors.RpcTimeoutError(
        f"shutdown on {session.me.name}: not every worker reached shutdown within {timeout} s ({err})")


def _release_rrefs(session, timeout):
    """Graceful shutdown, after every worker finished its calls: releases this
    worker's user RRefs (USER_DELETE to their owners) and waits until the
    owners acknowledged. Returns an error, or None."""
    deadline = time.monotonic() + timeout
    for _ in range(2):  # a second pass for users confirmed during the first
        session.rref_ctx.release_all_users()
        left = session.rref_ctx.wait_idle(max(0.0, deadline - time.monotonic()))
        pending = session.agent.wait_pending(max(0.0, deadline - time.monotonic()))
        if left or pending:
            return errors.RpcTimeoutError(
                f"shutdown on {session.me.name}: {left} RRef protocol message(s) and {pending} "
                f"call(s) still unanswered after {timeout} s"
            )
    return None


@atexit.register
def _shutdown_at_exit():
    # A process that forgot shutdown() still stops its threads before exiting.
    if state.current() is not None:
        shutdown(graceful=False)
