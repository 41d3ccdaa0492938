"""Functional optimizers compiled to TorchScript, so an owner steps without the GIL.

A parameter owner keeps one instance per ``DistributedOptimizer`` and calls
``step(gradients)`` on it, where ``gradients[i]`` is the gradient of
``params[i]`` from one distributed autograd context, or ``None`` to leave that
parameter (and its optimizer state) untouched. The math is that of the
single-tensor (``foreach=False``) implementation of the matching
``torch.optim`` class in torch 2.13, op for op, so on CPU the parameters and
the state follow ``torch.optim`` to the last bit for float hyper-parameters.

Each public class (``FunctionalSGD``, ``FunctionalAdam`` (also AdamW, with
``decoupled_weight_decay=True``), ``FunctionalAdagrad``, ``FunctionalRMSprop``) is a handle on a TorchScript
class. The class is compiled on first use, once per process. Calling the
handle builds a ``torch.ScriptObject``; its methods run in the TorchScript
interpreter, from Python as from C++::

    opt = FunctionalSGD([w, b], lr=0.1, momentum=0.9)
    opt.step([w_grad, None])          # updates w in place; b and its state untouched
    opt.lr                            # 0.1; attributes are readable
    opt.setattr("lr", 0.05)           # and writable (an lr schedule)

:func:`functional_optimizer` maps ``torch.optim.SGD``/``Adam``/``AdamW``/
``Adagrad``/``RMSprop`` and their constructor arguments to an instance, or
returns ``None`` when no functional class can reproduce the optimizer.

Calling ``step`` from C++ (no GIL, no Python)
---------------------------------------------
The ``torch.ScriptObject`` crosses pybind11 as a ``torch::jit::Object``
(``py::cast<torch::jit::Object>(obj)``), whose ``_ivalue()`` is the
``c10::intrusive_ptr<c10::ivalue::Object>``; keep that pointer, it owns the
parameters (aliases of the owner's tensors) and the optimizer state. Then::

    c10::List<std::optional<at::Tensor>> grads;   // one entry per parameter
    torch::jit::Function& step = obj->type()->getMethod("step");
    step({c10::IValue(obj), c10::IValue(grads)});  // self first; returns None

(``torch::jit::Object(obj).run_method("step", grads)`` is the same call.)
``step`` runs under ``torch.no_grad()`` and raises ``c10::Error`` (a
``torch.jit.Error`` in Python) when the gradient count does not match the
parameter count, when a gradient has the wrong shape, or when the optimizer
does not take sparse gradients (Adam, AdamW, RMSprop; Adagrad with
weight_decay); it checks all gradients before it updates any parameter.

.. warning::
    An instance is not thread-safe: concurrent ``step`` calls on one instance
    race on its state. Serialize them per instance (one lock per owner-side
    optimizer), as ``torch.distributed.optim`` does. Distinct instances may
    step concurrently, also when they share no parameters.
"""

import inspect
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

__all__ = [
    "FunctionalAdagrad",
    "FunctionalAdam",
    "FunctionalRMSprop",
    "FunctionalSGD",
    "functional_optimizer",
]


# ---------------------------------------------------------------------------
# TorchScript code. Everything in this section is compiled; keep it to the
# subset TorchScript accepts (no `continue` refinement of Optionals, no
# inheritance, no keyword-only arguments).
# ---------------------------------------------------------------------------


def _check_gradients(
    name: str,
    params: List[Tensor],
    gradients: List[Optional[Tensor]],
    sparse_error: str,
) -> None:
    # Runs before any update, so a bad call leaves every parameter unchanged.
    if len(gradients) != len(params):
        raise ValueError(
            f"{name}.step() expects one gradient (or None) per parameter: "
            f"{len(params)} parameters, got {len(gradients)} gradients"
        )
    if sparse_error != "":
        for g in gradients:
            if g is not None:
                if g.is_sparse:
                    raise RuntimeError(sparse_error)


def _check_params(params: List[Tensor]) -> None:
    if len(params) == 0:
        raise ValueError("optimizer got an empty parameter list")


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
        _check_params(params)
        self.params = params
        self.lr = lr
        self.momentum = momentum
        self.dampening = dampening
        self.weight_decay = weight_decay
        self.nesterov = nesterov
        self.maximize = maximize
        self.momentum_buffers: List[Optional[Tensor]] = [None for _ in params]

    def step(self, gradients: List[Optional[Tensor]]) -> None:
        _check_gradients("FunctionalSGD", self.params, gradients, "")
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
        _check_params(params)
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
        _check_gradients(
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
        _check_params(params)
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
        _check_gradients("FunctionalAdagrad", self.params, gradients, sparse_error)
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
        _check_params(params)
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
        _check_gradients(
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


# ---------------------------------------------------------------------------
# Python side: lazy compilation, construction, the torch.optim mapping.
# ---------------------------------------------------------------------------

_compile_lock = threading.Lock()

# TorchScript re-raises ValueError from __init__ as torch.jit.Error whose text
# ends in "builtins.ValueError: <message>".
_SCRIPT_VALUE_ERROR = "builtins.ValueError: "


class _ScriptClass:
    """A TorchScript class, compiled on first use; calling it builds a ScriptObject.

    Calling the Python class itself would run its methods as eager Python, and
    returning an instance from a scripted function converts it back to such a
    Python copy; neither gives C++ an object to run. This handle creates the
    object in C++ (``torch._C._create_object_with_type``, what
    ``torch.jit._recursive.create_script_class`` uses) and runs the compiled
    ``__init__`` on it.
    """

    def __init__(self, python_class: type) -> None:
        self._python_class = python_class
        self._type: Optional[torch.ClassType] = None
        self.__name__ = python_class.__name__
        self.__qualname__ = python_class.__qualname__
        self.__module__ = python_class.__module__
        self.__doc__ = python_class.__doc__
        self.__signature__ = inspect.signature(python_class)

    @property
    def script_type(self) -> torch.ClassType:
        """The compiled ``torch.ClassType`` (compiles the class on first access)."""
        if self._type is None:
            with _compile_lock:
                if self._type is None:
                    with warnings.catch_warnings():
                        # torch 2.13 deprecates torch.jit.script; it still
                        # compiles, and compiling is the point of this module.
                        warnings.filterwarnings(
                            "ignore", message=".*torch.jit.script.*", category=DeprecationWarning
                        )
                        torch.jit.script(self._python_class)
                    self._type = torch.jit._state._get_script_class(self._python_class)
        return self._type

    def __call__(self, *args: Any, **kwargs: Any) -> torch.ScriptObject:
        obj = torch._C._create_object_with_type(self.script_type)
        try:
            obj._get_method("__init__")(*args, **kwargs)
        except torch.jit.Error as err:
            text = str(err)
            at = text.rfind(_SCRIPT_VALUE_ERROR)
            if at < 0:
                raise
            message = text[at + len(_SCRIPT_VALUE_ERROR) :].strip()
            raise ValueError(f"{self.__name__}: {message}") from err
        return obj

    def is_instance(self, obj: Any) -> bool:
        """Whether ``obj`` is a ScriptObject of this class."""
        return isinstance(obj, torch.ScriptObject) and obj._type() == self.script_type

    def __repr__(self) -> str:
        return f"<TorchScript class {self.__module__}.{self.__qualname__}>"


FunctionalSGD = _ScriptClass(FunctionalSGD)
FunctionalAdam = _ScriptClass(FunctionalAdam)
FunctionalAdagrad = _ScriptClass(FunctionalAdagrad)
FunctionalRMSprop = _ScriptClass(FunctionalRMSprop)


class _Unsupported(Exception):
    """An argument no functional class reproduces; the factory returns None."""


def _to_float(name: str, value: Any) -> float:
    # torch.optim accepts 1-element tensors for lr (and betas, weight_decay
    # in some classes); its CPU math reads them as Python numbers.
    if isinstance(value, Tensor):
        if value.requires_grad or value.is_complex():
            raise _Unsupported(f"{name} is a tensor that requires grad or is complex")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Unsupported(f"{name} is {type(value).__name__}")
    return float(value)


def _to_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Unsupported(f"{name} is {type(value).__name__}")
    return value


def _check_impl_flags(arguments: Dict[str, Any]) -> None:
    # foreach only picks another kernel for the same math; the rest change the
    # behaviour (fused/capturable: device kernels and grad scaling,
    # differentiable: autograd through the step).
    if arguments.get("fused") not in (None, False):
        raise _Unsupported("fused=True")
    if arguments.get("capturable", False) is not False:
        raise _Unsupported("capturable=True")
    if arguments.get("differentiable", False) is not False:
        raise _Unsupported("differentiable=True")


def _sgd_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "lr": _to_float("lr", a["lr"]),
        "momentum": _to_float("momentum", a["momentum"]),
        "dampening": _to_float("dampening", a["dampening"]),
        "weight_decay": _to_float("weight_decay", a["weight_decay"]),
        "nesterov": _to_bool("nesterov", a["nesterov"]),
        "maximize": _to_bool("maximize", a["maximize"]),
    }


def _adam_common_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    betas = tuple(a["betas"])
    return {
        "lr": _to_float("lr", a["lr"]),
        "betas": (_to_float("betas[0]", betas[0]), _to_float("betas[1]", betas[1])),
        "eps": _to_float("eps", a["eps"]),
        "weight_decay": _to_float("weight_decay", a["weight_decay"]),
        "amsgrad": _to_bool("amsgrad", a["amsgrad"]),
        "maximize": _to_bool("maximize", a["maximize"]),
    }


def _adam_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    kwargs = _adam_common_kwargs(a)
    kwargs["decoupled_weight_decay"] = _to_bool(
        "decoupled_weight_decay", a["decoupled_weight_decay"]
    )
    return kwargs


def _adamw_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    # torch.optim.AdamW is Adam with decoupled weight decay (and its own defaults).
    return dict(_adam_common_kwargs(a), decoupled_weight_decay=True)


def _adagrad_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "lr": _to_float("lr", a["lr"]),
        "lr_decay": _to_float("lr_decay", a["lr_decay"]),
        "weight_decay": _to_float("weight_decay", a["weight_decay"]),
        "initial_accumulator_value": _to_float(
            "initial_accumulator_value", a["initial_accumulator_value"]
        ),
        "eps": _to_float("eps", a["eps"]),
        "maximize": _to_bool("maximize", a["maximize"]),
    }


def _rmsprop_kwargs(a: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "lr": _to_float("lr", a["lr"]),
        "alpha": _to_float("alpha", a["alpha"]),
        "eps": _to_float("eps", a["eps"]),
        "weight_decay": _to_float("weight_decay", a["weight_decay"]),
        "momentum": _to_float("momentum", a["momentum"]),
        "centered": _to_bool("centered", a["centered"]),
        "maximize": _to_bool("maximize", a["maximize"]),
    }


# torch.optim class -> (functional class, maps its bound arguments to ours).
_FUNCTIONAL: Dict[type, Tuple[_ScriptClass, Callable[[Dict[str, Any]], Dict[str, Any]]]] = {
    torch.optim.SGD: (FunctionalSGD, _sgd_kwargs),
    torch.optim.Adam: (FunctionalAdam, _adam_kwargs),
    torch.optim.AdamW: (FunctionalAdam, _adamw_kwargs),
    torch.optim.Adagrad: (FunctionalAdagrad, _adagrad_kwargs),
    torch.optim.RMSprop: (FunctionalRMSprop, _rmsprop_kwargs),
}


def functional_optimizer(
    optimizer_class: type, params: Any, *args: Any, **kwargs: Any
) -> Optional[torch.ScriptObject]:
    """Build the TorchScript functional optimizer equivalent to ``optimizer_class(params, *args, **kwargs)``.

    The arguments are those of the ``torch.optim`` constructor, in its order,
    with its defaults. They are validated by constructing the real optimizer
    once on ``params`` (and discarding it), so invalid hyper-parameters raise
    exactly what ``torch.optim`` raises. That construction does not modify
    the parameters; ``Adagrad`` allocates its sums twice for the moment.

    Args:
        optimizer_class (type): ``torch.optim.SGD``, ``Adam``, ``AdamW``,
            ``Adagrad`` or ``RMSprop`` (exactly; subclasses may change ``step``).
        params (Iterable[Tensor]): the parameters, all tensors (no parameter
            groups, no named parameters).
        *args, **kwargs: the constructor's other arguments. A 1-element tensor
            lr (or betas, weight_decay) is read as a float. ``foreach`` is
            accepted and ignored (the single-tensor math is always used).

    Returns:
        torch.ScriptObject or None: the functional optimizer, or None when
        ``optimizer_class`` is not one of the five, ``params`` is not a flat
        list of real tensors, or an option changes what ``torch.optim`` does
        in a way the functional classes do not reproduce (``fused=True``,
        ``capturable=True``, ``differentiable=True``, hyper-parameter tensors
        that require grad). The caller then runs ``optimizer_class`` itself.

    Raises:
        ValueError, TypeError, RuntimeError: whatever ``optimizer_class``
            raises for these arguments.

    Example::

        >>> w = torch.zeros(3, requires_grad=True)
        >>> opt = functional_optimizer(torch.optim.SGD, [w], 0.5, momentum=0.9)
        >>> opt.step([torch.ones(3)])
        >>> w
        tensor([-0.5000, -0.5000, -0.5000], requires_grad=True)
        >>> functional_optimizer(torch.optim.LBFGS, [w]) is None
        True
    """
    entry = _FUNCTIONAL.get(optimizer_class)
    if entry is None:
        return None
    functional_class, to_kwargs = entry
    params = list(params)
    # Validate exactly as torch does, including its TypeError for unknown
    # arguments and its checks on the parameter list.
    optimizer_class(params, *args, **kwargs)
    if not all(isinstance(p, Tensor) for p in params) or any(p.is_complex() for p in params):
        return None
    bound = inspect.signature(optimizer_class).bind(params, *args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    try:
        _check_impl_flags(arguments)
        functional_kwargs = to_kwargs(arguments)
    except _Unsupported:
        return None
    return functional_class(params, **functional_kwargs)
