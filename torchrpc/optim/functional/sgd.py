"""``torch.optim.SGD`` as a TorchScript class, and its arguments."""

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from torchrpc.optim.functional.common import ScriptClass, check_gradients, check_params, to_bool, to_float


class FunctionalSGD:
    """``torch.optim.SGD`` as a TorchScript class.

    Args:
        params (List[Tensor]): parameters, updated in place by ``step``.
        lr (float): learning rate (default 1e-3).
        momentum (float): momentum factor (default 0).
        dampening (float): dampening for momentum (default 0).
        weight_decay (float): L2 penalty (default 0).
        nesterov (bool): Nesterov momentum (default False).
        maximize (bool): maximize the objective (default False).

    Attributes:
        momentum_buffers (List[Optional[Tensor]]): per parameter, None until
            its first gradient when momentum != 0 (then a copy of it).

    Sparse gradients are accepted where ``torch.optim.SGD`` accepts them.
    Concurrent ``step`` calls on one instance must be serialized.
    """

    def __init__(
        self,
        params: List[Tensor],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        check_params(params)
        self.params = params
        self.lr = lr
        self.momentum = momentum
        self.dampening = dampening
        self.weight_decay = weight_decay
        self.nesterov = nesterov
        self.maximize = maximize
        self.momentum_buffers: List[Optional[Tensor]] = [None for _ in params]

    def step(self, gradients: List[Optional[Tensor]]) -> None:
        check_gradients("FunctionalSGD", self.params, gradients, "")
        with torch.no_grad():
            for i in range(len(self.params)):
                g = gradients[i]
                if g is not None:
                    param = self.params[i]
                    grad = -g if self.maximize else g
                    if self.weight_decay != 0.0:
                        grad = grad.add(param, alpha=self.weight_decay)
                    if self.momentum != 0.0:
                        buf = self.momentum_buffers[i]
                        if buf is None:
                            buf = grad.detach().clone()
                            self.momentum_buffers[i] = buf
                        else:
                            buf.mul_(self.momentum).add_(grad, alpha=1.0 - self.dampening)
                        if self.nesterov:
                            grad = grad.add(buf, alpha=self.momentum)
                        else:
                            grad = buf
                    param.add_(grad, alpha=-self.lr)


FunctionalSGD = ScriptClass(FunctionalSGD)


def sgd_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "lr": to_float("lr", a["lr"]),
        "momentum": to_float("momentum", a["momentum"]),
        "dampening": to_float("dampening", a["dampening"]),
        "weight_decay": to_float("weight_decay", a["weight_decay"]),
        "nesterov": to_bool("nesterov", a["nesterov"]),
        "maximize": to_bool("maximize", a["maximize"]),
    }
