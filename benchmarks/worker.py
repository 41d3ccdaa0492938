"""One benchmark process: ``python -m benchmarks.worker --spec SPEC --rank R``.

SPEC is a JSON file written by :mod:`benchmarks.launch`: the backend, the job
(a key of :data:`JOBS`), world size, ports, the control store and
the run's sizes. The worker plays the role its rank has in that job and writes
``<out_dir>/rank<R>.json``. Rank 0 is the callee in ``main`` and ``scaling``.
"""

import argparse
import faulthandler
import json
import os
import sys
import traceback

from benchmarks import backends, compute, exported_fns, remote_fns, scenarios
from benchmarks.control import Control

CALLEE = "callee"


def _init(backend, control, name, rank, spec, world_size=None):
    """init_rpc, then wait until every process of the job has returned from it.

    The barrier starts every measurement from the same state on both backends:
    no call overlaps another worker's init_rpc. `world_size`: of the RPC job,
    when not every process of the benchmark job joins it.
    """
    cfg = spec["cfg"]
    backend.rpc.init_rpc(name, rank=rank, world_size=world_size or spec["world_size"],
                         **backend.init_kwargs(spec["ports"][0], cfg["threads"], cfg["rpc_timeout"]))
    control.barrier("ready")


def _serve(backend, control, rank, spec):
    """The callee of ``main`` and ``scaling``: publish the pid, serve, leave."""
    control.set("pid/callee", str(os.getpid()))
    _init(backend, control, CALLEE, rank, spec)
    backend.rpc.shutdown()
    return {}


def job_main(backend, control, rank, spec):
    """Two workers: idle CPU, latency, throughput and tensor send."""
    if rank == 0:
        return _serve(backend, control, rank, spec)
    rpc, cfg = backend.rpc, spec["cfg"]
    _init(backend, control, "caller", rank, spec)
    fn, args = scenarios.LATENCY_CALLS["script"]
    rpc.rpc_sync(CALLEE, fn, args=args)  # opens the connection
    result = {"idle": scenarios.idle_cpu(int(control.get("pid/callee")), cfg)}
    result["latency_us"] = scenarios.latency(rpc, CALLEE, cfg)
    result["throughput"] = scenarios.throughput(rpc, CALLEE, cfg)
    result["send"] = scenarios.tensor_send(rpc, CALLEE, cfg)
    result["script_caller"] = scenarios.script_caller(backend, CALLEE, cfg)
    result["rref"] = scenarios.rrefs(rpc, CALLEE, cfg)
    if backend.name == "torchrpc":  # torch.distributed.rpc cannot run code the callee lacks
        result["unseen"] = scenarios.unseen_script_function(rpc, CALLEE, cfg)
    rpc.shutdown()
    return result


def job_scaling(backend, control, rank, spec):
    """One callee, world_size - 1 callers: CPU-bound callee scaling."""
    if rank == 0:
        return _serve(backend, control, rank, spec)
    _init(backend, control, f"caller{rank - 1}", rank, spec)
    result = {"cpu_bound": scenarios.cpu_bound(backend.rpc, CALLEE, control, rank - 1,
                                               spec["world_size"] - 1, spec["cfg"])}
    backend.rpc.shutdown()
    return result


def job_training(backend, control, rank, spec):
    """Two workers: the parameter server (rank 0) and the trainer.

    One intra-op thread per process, as torchrun sets by default
    (OMP_NUM_THREADS=1): two processes with two OpenMP threads each on two
    cores stall each other's parallel regions (the LSTM's forward took 2-5x
    its time alone). The local baseline runs with one thread as well.
    """
    import torch

    torch.set_num_threads(1)
    if rank == 0:
        scenarios.serve_split_rnn(backend)
        return _serve(backend, control, rank, spec)
    _init(backend, control, "trainer", rank, spec)
    result = {"training": scenarios.training(backend, CALLEE, spec["cfg"])}
    backend.rpc.shutdown()
    return result


def job_compute(backend, control, rank, spec):
    """Two workers: a callee that runs a CNN inside its calls, and its caller.
    Both keep torch's intra-op thread setting."""
    if rank == 0:
        return _serve(backend, control, rank, spec)
    _init(backend, control, "caller", rank, spec)
    result = {"compute": compute.callee(backend.rpc, CALLEE, spec["cfg"])}
    backend.rpc.shutdown()
    return result


def job_exported(backend, control, rank, spec):
    """torchrpc only: exported programs (benchmarks.exported_fns). The callee
    (rank 0) registers the packages compiled before the job by name; caller
    0 measures a fresh process's first call and the tiny call's latency
    next to script and Python, then both callers the CPU-bound program's
    scaling, beside busy_script's."""
    prepared = spec["cfg"]["exported"]
    folder = prepared["dir"]
    os.environ["TORCHRPC_AOTI_CACHE"] = exported_fns.cache_dir(folder)
    rpc = backend.rpc
    if rank == 0:
        for kind, name in exported_fns.NAMES.items():
            rpc.register(name, prepared["packages"][kind])
        return _serve(backend, control, rank, spec)
    _init(backend, control, f"caller{rank - 1}", rank, spec)
    result = {}
    if rank == 1:
        result["first_call"] = scenarios.exported_first_call(rpc, CALLEE, folder)
        result["latency_us"] = scenarios.exported_latency(rpc, CALLEE, folder, spec["cfg"])
    calls = {"script": (remote_fns.busy_script, (remote_fns.BUSY_ITERS,)),
             "exported": (exported_fns.NAMES["busy"], exported_fns.inputs("busy"))}
    result["cpu_bound"] = scenarios.cpu_bound(rpc, CALLEE, control, rank - 1, spec["world_size"] - 1,
                                              spec["cfg"], calls)
    rpc.shutdown()
    return result


#: The roles of the ``beside`` job, by rank.
BESIDE_ROLES = ("callee", "caller", "loop")


def job_beside(backend, control, rank, spec):
    """A callee, a caller and, in a third process that never joins the RPC
    job, a compute loop (see benchmarks.compute.beside)."""
    return {"beside": compute.beside(BESIDE_ROLES[rank], backend, control,
                                     lambda name: _init(backend, control, name, rank, spec, world_size=2),
                                     spec["cfg"])}


def job_init(backend, control, rank, spec):
    """Every worker: init_rpc and shutdown times, once per port."""
    return scenarios.init_shutdown(backend, f"worker{rank}", rank, spec["world_size"],
                                   spec["ports"], control, spec["cfg"])


JOBS = {"main": job_main, "scaling": job_scaling, "training": job_training, "compute": job_compute,
        "beside": job_beside, "init": job_init, "exported": job_exported}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="job spec JSON written by benchmarks.launch")
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    # A hung worker prints every thread's stack to its log before launch kills it.
    faulthandler.dump_traceback_later(max(1.0, spec["timeout"] - 3), exit=False)
    backend = backends.load(spec["backend"], spec.get("torch_transports"))
    control = Control(spec["control_port"], spec["prefix"], spec["world_size"], spec["timeout"])
    try:
        result = JOBS[spec["job"]](backend, control, args.rank, spec)
    except BaseException:
        # No graceful shutdown: it would wait for workers that wait for us.
        # launch.run_job sees the exit code and kills the rest of the job.
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    with open(os.path.join(spec["out_dir"], f"rank{args.rank}.json"), "w") as f:
        json.dump(result, f)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
