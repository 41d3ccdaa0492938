"""``torch.optim.Adagrad`` as a TorchScript class, and its arguments."""

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from torchrpc.optim.functional.common import ScriptClass, check_gradients, check_params, to_bool, to_float


class FunctionalAdagrad:
    """``torch.optim.Adagrad`` as a TorchScript class.

    Args:
        params (List[Tensor]): parameters, updated in place by ``step``.
        lr (float): learning rate (default 1e-2).
        lr_decay (float): learning rate decay (default 0).
        weight_decay (float): L2 penalty (default 0).
        initial_accumulator_value (float): initial value of the sums (default 0).
        eps (float): added to the denominator (default 1e-10).
        maximize (bool): maximize the objective (default False).

    Attributes:
        steps (List[float]): per parameter, how many gradients it has received.
        sums (List[Tensor]): per parameter, the accumulated squared gradients,
            allocated at construction as in ``torch.optim.Adagrad``.

    Sparse gradients are accepted, except with weight_decay (as in torch).
    Concurrent ``step`` calls on one instance must be serialized.
    """

    def __init__(
        self,
        params: List[Tensor],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        maximize: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(
                f"Invalid initial_accumulator_value value: {initial_accumulator_value}"
            )
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        check_params(params)
        self.params = params
        self.lr = lr
        self.lr_decay = lr_decay
        self.weight_decay = weight_decay
        self.eps = eps
        self.maximize = maximize
        self.steps: List[float] = [0.0 for _ in params]
        self.sums: List[Tensor] = [
            torch.full_like(p, initial_accumulator_value, memory_format=torch.preserve_format)
            for p in params
        ]

    def step(self, gradients: List[Optional[Tensor]]) -> None:
        sparse_error = ""
        if self.weight_decay != 0.0:
            sparse_error = "weight_decay option is not compatible with sparse gradients"
        check_gradients("FunctionalAdagrad", self.params, gradients, sparse_error)
        with torch.no_grad():
            for i in range(len(self.params)):
                g = gradients[i]
                if g is not None:
                    param = self.params[i]
                    state_sum = self.sums[i]
                    self.steps[i] += 1.0
                    step = self.steps[i]
                    grad = -g if self.maximize else g
                    if self.weight_decay != 0.0:
                        grad = grad.add(param, alpha=self.weight_decay)
                    clr = self.lr / (1.0 + (step - 1.0) * self.lr_decay)
                    if grad.is_sparse:
                        # The update is non-linear, so indices must be unique.
                        grad = grad.coalesce()
                        indices = grad._indices()
                        values = grad._values()
                        size = grad.size()
                        state_sum.add_(torch.sparse_coo_tensor(indices, values.pow(2), size))
                        std = state_sum.sparse_mask(grad)
                        std_values = std._values().sqrt_().add_(self.eps)
                        param.add_(
                            torch.sparse_coo_tensor(indices, values / std_values, size),
                            alpha=-clr,
                        )
                    else:
                        state_sum.addcmul_(grad, grad, value=1.0)
                        std = state_sum.sqrt().add_(self.eps)
                        param.addcdiv_(grad, std, value=-clr)


FunctionalAdagrad = ScriptClass(FunctionalAdagrad)


def adagrad_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "lr": to_float("lr", a["lr"]),
        "lr_decay": to_float("lr_decay", a["lr_decay"]),
        "weight_decay": to_float("weight_decay", a["weight_decay"]),
        "initial_accumulator_value": to_float(
            "initial_accumulator_value", a["initial_accumulator_value"]
        ),
        "eps": to_float("eps", a["eps"]),
        "maximize": to_bool("maximize", a["maximize"]),
    }
