"""``torch.optim.RMSprop`` as a TorchScript class, and its arguments."""

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from torchrpc.optim.functional.common import ScriptClass, check_gradients, check_params, to_bool, to_float


class FunctionalRMSprop:
    """``torch.optim.RMSprop`` as a TorchScript class.

    Args:
        params (List[Tensor]): parameters, updated in place by ``step``.
        lr (float): learning rate (default 1e-2).
        alpha (float): smoothing constant (default 0.99).
        eps (float): added to the denominator (default 1e-8).
        weight_decay (float): L2 penalty (default 0).
        momentum (float): momentum factor (default 0).
        centered (bool): normalize by the estimated variance (default False).
        maximize (bool): maximize the objective (default False).

    Attributes:
        steps (List[float]): per parameter, how many gradients it has received.
        square_avgs, momentum_buffers, grad_avgs (List[Optional[Tensor]]): per
            parameter, None until its first gradient (momentum_buffers stays
            None without momentum, grad_avgs without centered).

    Concurrent ``step`` calls on one instance must be serialized.
    """

    def __init__(
        self,
        params: List[Tensor],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        maximize: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        check_params(params)
        self.params = params
        self.lr = lr
        self.alpha = alpha
        self.eps = eps
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.centered = centered
        self.maximize = maximize
        self.steps: List[float] = [0.0 for _ in params]
        self.square_avgs: List[Optional[Tensor]] = [None for _ in params]
        self.momentum_buffers: List[Optional[Tensor]] = [None for _ in params]
        self.grad_avgs: List[Optional[Tensor]] = [None for _ in params]

    def step(self, gradients: List[Optional[Tensor]]) -> None:
        check_gradients(
            "FunctionalRMSprop", self.params, gradients, "RMSprop does not support sparse gradients"
        )
        with torch.no_grad():
            for i in range(len(self.params)):
                g = gradients[i]
                if g is not None:
                    param = self.params[i]
                    square_avg = self.square_avgs[i]
                    if square_avg is None:
                        square_avg = torch.zeros_like(param, memory_format=torch.preserve_format)
                        self.square_avgs[i] = square_avg
                        if self.momentum > 0.0:
                            self.momentum_buffers[i] = torch.zeros_like(
                                param, memory_format=torch.preserve_format
                            )
                        if self.centered:
                            self.grad_avgs[i] = torch.zeros_like(
                                param, memory_format=torch.preserve_format
                            )
                    self.steps[i] += 1.0
                    grad = -g if self.maximize else g
                    if self.weight_decay != 0.0:
                        grad = grad.add(param, alpha=self.weight_decay)
                    square_avg.mul_(self.alpha).addcmul_(grad, grad, value=1.0 - self.alpha)
                    grad_avg = self.grad_avgs[i]
                    if grad_avg is not None:
                        grad_avg.lerp_(grad, 1.0 - self.alpha)
                        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1.0).sqrt_()
                    else:
                        avg = square_avg.sqrt()
                    avg = avg.add_(self.eps)
                    buf = self.momentum_buffers[i]
                    if buf is not None:
                        buf.mul_(self.momentum).addcdiv_(grad, avg)
                        param.add_(buf, alpha=-self.lr)
                    else:
                        param.addcdiv_(grad, avg, value=-self.lr)


FunctionalRMSprop = ScriptClass(FunctionalRMSprop)


def rmsprop_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "lr": to_float("lr", a["lr"]),
        "alpha": to_float("alpha", a["alpha"]),
        "eps": to_float("eps", a["eps"]),
        "weight_decay": to_float("weight_decay", a["weight_decay"]),
        "momentum": to_float("momentum", a["momentum"]),
        "centered": to_bool("centered", a["centered"]),
        "maximize": to_bool("maximize", a["maximize"]),
    }
