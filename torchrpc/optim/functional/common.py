"""What the functional optimizers share: the TorchScript checks their ``step``
and ``__init__`` call (compiled with them), the handle that compiles a class
and builds its objects, and the conversion of ``torch.optim`` arguments."""

import inspect
import threading
import warnings
from typing import Any, List, Optional

import torch
from torch import Tensor


def check_gradients(
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


def check_params(params: List[Tensor]) -> None:
    if len(params) == 0:
        raise ValueError("optimizer got an empty parameter list")


_compile_lock = threading.Lock()

# TorchScript re-raises ValueError from __init__ as torch.jit.Error whose text
# ends in "builtins.ValueError: <message>".
_SCRIPT_VALUE_ERROR = "builtins.ValueError: "


class ScriptClass:
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
                        # Names in the class resolve in its own module's
                        # globals, as for a class TorchScript finds by itself.
                        rcb = torch._jit_internal.createResolutionCallbackForClassMethods(self._python_class)
                        torch.jit.script(self._python_class, _rcb=rcb)
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


class Unsupported(Exception):
    """An argument no functional class reproduces; the factory returns None."""


def to_float(name: str, value: Any) -> float:
    # torch.optim accepts 1-element tensors for lr (and betas, weight_decay
    # in some classes); its CPU math reads them as Python numbers.
    if isinstance(value, Tensor):
        if value.requires_grad or value.is_complex():
            raise Unsupported(f"{name} is a tensor that requires grad or is complex")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(f"{name} is {type(value).__name__}")
    return float(value)


def to_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise Unsupported(f"{name} is {type(value).__name__}")
    return value
