"""torchrpc vs torch.distributed.rpc, side by side in one run.

Entry point: ``python benchmarks/run_all.py`` (``make bench``); see its
docstring. Modules, one concern each:

- ``_measure``: timing helpers (warm-up, medians, percentiles, CPU time).
- ``remote_fns``: the functions the callee runs (TorchScript and Python).
- ``backends``: imports torchrpc or torch.distributed.rpc as ``rpc``, and
  picks the agent (TensorPipe, or torchrpc's TORCHRPC backend).
- ``control``: a side-channel store for barriers between benchmark processes.
- ``scenarios``: the measurements, written once against an ``rpc`` module.
- ``worker``: one benchmark process (``python -m benchmarks.worker``).
- ``launch``: starts a job of worker processes and always cleans them up.
- ``socket_floor``: the raw Unix-socket round trip, the floor for latency.
- ``report``: the side-by-side table, targets, JSON and plot.
"""
