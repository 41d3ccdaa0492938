"""Entry point of a test worker process: joins the job, then runs tasks that
tests hand to its main thread (see funcs.on_main) until told to stop."""

import argparse
import ctypes
import faulthandler
import gc
import json
import os
import signal
import sys

# What a worker whose callee policy may refuse Python calls waits for instead
# of a stop call (stops_on_signal): SIGTERM stops it gracefully, SIGUSR2 at once.
_STOP_SIGNALS = {signal.SIGTERM: True, signal.SIGUSR2: False}


def stops_on_signal(options):
    """Whether a worker with these RpcOptions keywords waits for a stop
    signal: its callee policy may refuse the Python stop call."""
    return bool(options.get("script_only") or options.get("allowed_callables") is not None)


def _die_with_parent():
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True, help="0: join a dynamic job (no world_size)")
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--store", help="HOST:PORT of a TCPStore to join (instead of --init-method)")
    parser.add_argument("--idle-limit", type=float, default=900.0,
                        help="exit with an error after this many seconds without a stop")
    parser.add_argument("--options", type=json.loads, default={},
                        help="more RpcOptions keywords, as a JSON object")
    args = parser.parse_args()
    signal_stop = stops_on_signal(args.options)
    if signal_stop:
        # Blocked before any thread starts (threads inherit it), so only sigtimedwait takes them.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    _die_with_parent()
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    import torchrpc as rpc
    from tests.multiprocess import funcs, rref_funcs  # noqa: F401  (registers their names)

    if "TEST_TORCH_NUM_THREADS" in os.environ:  # a program that sets torch's thread count before init_rpc
        import torch

        torch.set_num_threads(int(os.environ["TEST_TORCH_NUM_THREADS"]))

    options = dict(num_worker_threads=args.threads, init_timeout=60, **args.options)
    if args.store:
        import torch.distributed as dist

        host, port = args.store.split(":")
        options["store"] = dist.TCPStore(host, int(port), args.world_size, is_master=False)
    else:
        options["init_method"] = args.init_method
    if args.init_method == "env://" and not args.store:
        rank, world_size = -1, None  # from RANK and WORLD_SIZE, as under torchrun
    else:
        rank, world_size = args.rank, args.world_size or None
    try:
        rpc.init_rpc(args.name, rank=rank, world_size=world_size,
                     rpc_backend_options=rpc.RpcOptions(**options))
    except Exception as exc:
        print(f"{args.name}: init_rpc failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
    gc.freeze()  # what tests collect is theirs: no full scan of torch's objects
    if signal_stop:
        got = signal.sigtimedwait(_STOP_SIGNALS, args.idle_limit)
        graceful = None if got is None else _STOP_SIGNALS[got.si_signo]
    else:
        graceful = funcs.serve_main_thread(args.idle_limit)
    if graceful is None:
        print(f"{args.name}: no stop request within {args.idle_limit} s", file=sys.stderr)
        rpc.shutdown(graceful=False)
        sys.exit(3)
    rpc.shutdown(graceful=graceful, timeout=30)


if __name__ == "__main__":
    main()
