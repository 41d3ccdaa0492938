"""functional_optimizer: the functional optimizer that reproduces a
``torch.optim`` class and its arguments, or None."""

import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from torchrpc.optim.functional import adagrad, adam, rmsprop, sgd
from torchrpc.optim.functional.common import ScriptClass, Unsupported


def _check_impl_flags(arguments: Dict[str, Any]) -> None:
    # foreach only picks another kernel for the same math; the rest change the
    # behaviour (fused/capturable: device kernels and grad scaling,
    # differentiable: autograd through the step).
    if arguments.get("fused") not in (None, False):
        raise Unsupported("fused=True")
    if arguments.get("capturable", False) is not False:
        raise Unsupported("capturable=True")
    if arguments.get("differentiable", False) is not False:
        raise Unsupported("differentiable=True")


# torch.optim class -> (functional class, maps its bound arguments to ours).
_FUNCTIONAL: Dict[type, Tuple[ScriptClass, Callable[[Dict[str, Any]], Dict[str, Any]]]] = {
    torch.optim.SGD: (sgd.FunctionalSGD, sgd.sgd_kwargs),
    torch.optim.Adam: (adam.FunctionalAdam, adam.adam_kwargs),
    torch.optim.AdamW: (adam.FunctionalAdam, adam.adamw_kwargs),
    torch.optim.Adagrad: (adagrad.FunctionalAdagrad, adagrad.adagrad_kwargs),
    torch.optim.RMSprop: (rmsprop.FunctionalRMSprop, rmsprop.rmsprop_kwargs),
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
    except Unsupported:
        return None
    return functional_class(params, **functional_kwargs)
