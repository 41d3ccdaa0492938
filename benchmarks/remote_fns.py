"""Functions the benchmark callee runs, imported by every benchmark process.

TorchScript functions are found on the callee by their qualified name
(``__torch__.benchmarks.remote_fns.<name>``), so they must live in an
importable module, not in ``__main__``. Each kind of call has a TorchScript
and a plain Python twin doing the same work.
"""

import warnings

import torch
import torch.distributed.rpc as torch_rpc

import torchrpc
from benchmarks import _measure

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in 2.13

    @torch.jit.script
    def tiny_script(x: torch.Tensor) -> torch.Tensor:
        """A tiny tensor op."""
        return x + 1

    @torch.jit.script
    def int_script(n: int) -> int:
        """No tensors at all."""
        return n + 1

    @torch.jit.script
    def sink_script(x: torch.Tensor) -> torch.Tensor:
        """Receives a (large) tensor, returns a one-element tensor: one-way send."""
        return x.reshape(-1)[:1].clone()

    @torch.jit.script
    def busy_script(iters: int) -> int:
        """CPU-bound: a loop of small tensor ops (a few ms for BUSY_ITERS)."""
        x = torch.ones(8)
        for _ in range(iters):
            x = x * 0.999 + 0.001
        return iters


    # RPC issued from inside TorchScript, one twin per library: the caller
    # runs these locally; each waits for one tiny_script call on `to`.
    @torch.jit.script
    def torch_script_caller(to: str, x: torch.Tensor) -> torch.Tensor:
        """torch.distributed.rpc's spelling (its compiler special-cases it)."""
        return torch_rpc.rpc_async(to, tiny_script, (x,)).wait()

    @torch.jit.script
    def torchrpc_script_caller(to: str, x: torch.Tensor) -> torch.Tensor:
        """torchrpc's spelling: the callee by its registered name."""
        out = torchrpc.rpc_async(to, "bench.tiny_script", args=(x,)).wait()
        assert isinstance(out, torch.Tensor)
        return out

    @torch.jit.script
    def torch_script_sync_caller(to: str, x: torch.Tensor) -> torch.Tensor:
        """The same with rpc_sync: the interpreter does not suspend."""
        return torch_rpc.rpc_sync(to, tiny_script, (x,))

    @torch.jit.script
    def torchrpc_script_sync_caller(to: str, x: torch.Tensor) -> torch.Tensor:
        out = torchrpc.rpc_sync(to, "bench.tiny_script", args=(x,))
        assert isinstance(out, torch.Tensor)
        return out


torchrpc.register("bench.tiny_script", tiny_script)


def tiny_python(x):
    """Python twin of tiny_script."""
    return x + 1


def int_python(n):
    """Python twin of int_script."""
    return n + 1


def busy_python(iters):
    """Python twin of busy_script: the same ops, under the callee's GIL."""
    x = torch.ones(8)
    for _ in range(iters):
        x = x * 0.999 + 0.001
    return iters


def local_scaling(seconds, iters):
    """The machine's own ceiling for the CPU-bound scenario, measured where
    it runs (benchmarks/scaling_probe.py calls it on the callee): the rate of
    busy_script in two threads of this process over its rate in one, with no
    RPC; each for `seconds`."""
    import threading

    def rate(out, i):
        torch.set_num_threads(1)
        out[i] = _measure.rate_for(lambda: busy_script(iters) and 1, seconds)

    one = [0.0]
    rate(one, 0)
    two = [0.0, 0.0]
    threads = [threading.Thread(target=rate, args=(two, i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(two) / one[0]


class Counter:
    """A remote object for the RRef benchmarks."""

    def __init__(self, value):
        self.value = value

    def bump(self, by):
        self.value += by
        return self.value


def owner_rref_count():
    """Live owner RRefs on this worker, for either library."""
    try:
        import torchrpc.rref
        import torchrpc.state

        if torchrpc.state.current() is not None:
            return len(torchrpc.rref._live_rrefs()["owner_objects"])
    except ImportError:
        pass
    return int(torch_rpc._rref_context_get_debug_info()["num_owner_rrefs"])


def rss_bytes():
    """This process's resident memory."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


#: Iterations of busy_script / busy_python: a few milliseconds on a 2-core VM.
BUSY_ITERS = 400


class SmallCNN(torch.nn.Module):
    """The compute-heavy callee's network: two conv + ReLU + max-pool stages
    and a linear layer, on 32x32 RGB images (a few ms per batch of 16 on a
    2-core VM)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


_cnn = []


def cnn():
    """This process's SmallCNN, the same weights in every process."""
    if not _cnn:
        torch.manual_seed(0)
        _cnn.append(SmallCNN().eval())
    return _cnn[0]


def cnn_input(batch=16):
    """A batch of images, the same in every process."""
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def cnn_forward(x):
    """The compute-heavy callee: the CNN's forward pass on `x`, as a
    parameter server running the network would (Python, either library)."""
    with torch.no_grad():
        return cnn()(x)
