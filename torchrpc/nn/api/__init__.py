"""Mirrors ``torch.distributed.nn.api``: see :mod:`torchrpc.nn.api.remote_module`."""
