"""Modules that live on other workers: :class:`RemoteModule`, as
``torch.distributed.nn.RemoteModule`` for torchrpc."""

from torchrpc.nn.api.remote_module import RemoteModule

__all__ = ["RemoteModule"]
