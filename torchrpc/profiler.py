"""Profiling RPCs (docs/user-guide.md, "Profiling").

Calls made inside ``torch.autograd.profiler_legacy.profile`` are profiled
by the agent (csrc/profiling): each appears as a range named
``rpc_async#f(worker0 -> worker1)``, and the callee's events come back as
remote events named ``<range>#remote_op: <op>`` with the callee's rank as
``node_id``. This module holds the process-global server profiler.
"""

import itertools

import torch
from torch.autograd.profiler_legacy import _parse_legacy_records, profile

from torchrpc._extension import native

__all__ = []


class _server_process_global_profile(profile):
    """Profiles every request this worker serves, on whichever thread runs it,
    while it is entered (upstream's ``torch.distributed.rpc._server_process_global_profile``).

    It takes ``torch.autograd.profiler_legacy.profile``'s arguments (``enabled``,
    ``record_shapes``, ``profile_memory``; torchrpc profiles the CPU only).
    Entered ones nest: each sees the requests served while it was on. On exit,
    ``function_events`` holds all events and ``process_global_function_events``
    one list of events per request served.

    Example::

        >>> prof = torchrpc.remote("worker1", torchrpc._server_process_global_profile)
        >>> prof.rpc_sync().__enter__()
        >>> torchrpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))
        >>> prof.rpc_sync().__exit__(None, None, None)
        >>> table = prof.rpc_sync().key_averages().table()
    """

    def __enter__(self):
        if not self.enabled:
            return None
        if self.entered:
            raise RuntimeError("autograd profiler traces are not reentrant")
        self.entered = True
        native().profiler_global_start(self.record_shapes, self.profile_memory)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.enabled:
            return None
        per_request = native().profiler_global_stop()
        self.process_global_function_events = [_parse_legacy_records([events]) for events in per_request]
        # Sorted by start, as events of one profile are.
        for events in self.process_global_function_events:
            events.sort(key=lambda e: [e.time_range.start, -e.time_range.end])
        self.function_events = torch.autograd.profiler_util.EventList(
            list(itertools.chain.from_iterable(self.process_global_function_events)),
            use_device=None,
            profile_memory=self.profile_memory,
        )
        self.function_events._build_tree()
        return False
