"""``torch.optim.Adam`` and ``AdamW`` as one TorchScript class (AdamW is Adam
with decoupled weight decay), and their arguments."""

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from torchrpc.optim.functional.common import ScriptClass, check_gradients, check_params, to_bool, to_float


def _adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    max_exp_avg_sq: Optional[Tensor],
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled_weight_decay: bool,
) -> None:
    # torch/optim/adam.py _single_tensor_adam, capturable=False branch.
    if weight_decay != 0.0:
        if decoupled_weight_decay:
            param.mul_(1.0 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    bias_correction1 = 1.0 - beta1**step
    bias_correction2 = 1.0 - beta2**step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2**0.5
    if max_exp_avg_sq is not None:
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    else:
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


def _check_adam_hyper_parameters(
    lr: float, betas: Tuple[float, float], eps: float, weight_decay: float
) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class FunctionalAdam:
    """``torch.optim.Adam`` as a TorchScript class.

    Args:
        params (List[Tensor]): parameters, updated in place by ``step``.
        lr (float): learning rate (default 1e-3).
        betas (Tuple[float, float]): running-average coefficients (default (0.9, 0.999)).
        eps (float): added to the denominator (default 1e-8).
        weight_decay (float): weight decay (default 0).
        amsgrad (bool): the AMSGrad variant (default False).
        maximize (bool): maximize the objective (default False).
        decoupled_weight_decay (bool): decay the weights directly, as AdamW
            (default False).

    Attributes:
        steps (List[float]): per parameter, how many gradients it has received.
        exp_avgs, exp_avg_sqs, max_exp_avg_sqs (List[Optional[Tensor]]): per
            parameter, None until its first gradient (max_exp_avg_sqs stays None
            without amsgrad).

    Concurrent ``step`` calls on one instance must be serialized.
    """

    def __init__(
        self,
        params: List[Tensor],
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
        decoupled_weight_decay: bool = False,
    ):
        _check_adam_hyper_parameters(lr, betas, eps, weight_decay)
        check_params(params)
        self.params = params
        self.lr = lr
        self.beta1 = betas[0]
        self.beta2 = betas[1]
        self.eps = eps
        self.weight_decay = weight_decay
        self.amsgrad = amsgrad
        self.maximize = maximize
        self.decoupled_weight_decay = decoupled_weight_decay
        self.steps: List[float] = [0.0 for _ in params]
        self.exp_avgs: List[Optional[Tensor]] = [None for _ in params]
        self.exp_avg_sqs: List[Optional[Tensor]] = [None for _ in params]
        self.max_exp_avg_sqs: List[Optional[Tensor]] = [None for _ in params]

    def step(self, gradients: List[Optional[Tensor]]) -> None:
        check_gradients(
            "FunctionalAdam",
            self.params,
            gradients,
            "Adam does not support sparse gradients, please consider SparseAdam instead",
        )
        with torch.no_grad():
            for i in range(len(self.params)):
                g = gradients[i]
                if g is not None:
                    param = self.params[i]
                    exp_avg = self.exp_avgs[i]
                    exp_avg_sq = self.exp_avg_sqs[i]
                    if exp_avg is None or exp_avg_sq is None:
                        exp_avg = torch.zeros_like(param, memory_format=torch.preserve_format)
                        exp_avg_sq = torch.zeros_like(param, memory_format=torch.preserve_format)
                        self.exp_avgs[i] = exp_avg
                        self.exp_avg_sqs[i] = exp_avg_sq
                        if self.amsgrad:
                            self.max_exp_avg_sqs[i] = torch.zeros_like(
                                param, memory_format=torch.preserve_format
                            )
                    self.steps[i] += 1.0
                    _adam_update(
                        param,
                        -g if self.maximize else g,
                        exp_avg,
                        exp_avg_sq,
                        self.max_exp_avg_sqs[i],
                        self.steps[i],
                        self.lr,
                        self.beta1,
                        self.beta2,
                        self.eps,
                        self.weight_decay,
                        self.decoupled_weight_decay,
                    )


FunctionalAdam = ScriptClass(FunctionalAdam)


def _adam_common_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    betas = tuple(a["betas"])
    return {
        "lr": to_float("lr", a["lr"]),
        "betas": (to_float("betas[0]", betas[0]), to_float("betas[1]", betas[1])),
        "eps": to_float("eps", a["eps"]),
        "weight_decay": to_float("weight_decay", a["weight_decay"]),
        "amsgrad": to_bool("amsgrad", a["amsgrad"]),
        "maximize": to_bool("maximize", a["maximize"]),
    }


def adam_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    kwargs = _adam_common_kwargs(a)
    kwargs["decoupled_weight_decay"] = to_bool(
        "decoupled_weight_decay", a["decoupled_weight_decay"]
    )
    return kwargs


def adamw_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    # torch.optim.AdamW is Adam with decoupled weight decay (and its own defaults).
    return dict(_adam_common_kwargs(a), decoupled_weight_decay=True)
