"""A side channel between the benchmark processes of one job.

run_all.py hosts a TCPStore; workers reach it through :class:`Control` to
publish their pids and to meet at barriers, so that what is timed (init_rpc,
two callers at once) starts together and excludes process start-up.
"""

import datetime

import torch.distributed as dist


class Control:
    """A job's view of the run's control store (keys are prefixed per job).

    Args:
        port (int): the TCPStore's port on 127.0.0.1.
        prefix (str): unique per job and backend.
        world_size (int): processes in the job (barrier participants).
        timeout (float): seconds any wait may take before it raises.
    """

    def __init__(self, port, prefix, world_size, timeout):
        base = dist.TCPStore("127.0.0.1", port, is_master=False,
                             timeout=datetime.timedelta(seconds=timeout))
        self._store = dist.PrefixStore(prefix + "/", base)
        self._world_size = world_size

    def barrier(self, tag, parties=None):
        """Waits until `parties` (default: the whole job) processes reached `tag`."""
        parties = parties or self._world_size
        if self._store.add(f"barrier/{tag}", 1) == parties:
            self._store.set(f"barrier/{tag}/go", b"1")
        self._store.wait([f"barrier/{tag}/go"])

    def set(self, key, value):
        """Publishes a str value."""
        self._store.set(key, value)

    def is_set(self, key):
        """Whether `key` has been published (does not wait)."""
        return self._store.check([key])

    def get(self, key):
        """Waits for `key` (up to the timeout) and returns its value as str."""
        self._store.wait([key])
        return self._store.get(key).decode()
