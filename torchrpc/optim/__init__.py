"""Optimizers for parameters that live on other workers.

:class:`DistributedOptimizer` steps parameters on every worker that owns some,
with the gradients of a distributed autograd context.
:mod:`torchrpc.optim.functional` holds the TorchScript functional optimizers
(``FunctionalSGD``, ``FunctionalAdam``, ...) that a parameter owner runs
without the GIL, and :func:`~torchrpc.optim.functional.functional_optimizer`,
which maps a ``torch.optim`` class and its arguments to one of them.
"""

from torchrpc.optim.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
