"""RemoteModule: an ``nn.Module`` that lives on another worker.

The module is created on its owner (``remote()`` of its class); the local
object keeps an RRef to it. ``forward`` and ``forward_async`` run the
module's ``forward`` there, recorded by distributed autograd like any call,
so gradients reach the owner's parameters; ``remote_parameters()`` hands
those to :class:`torchrpc.optim.DistributedOptimizer`. The layout mirrors
``torch.distributed.nn.api.remote_module``, whose public API this is.
"""

import types
import warnings

import torch
from torch import nn

from torchrpc import api, python_fallback, state
from torchrpc.rref import RRef

__all__ = ["RemoteModule"]

# What travels when a RemoteModule is sent through RPC (upstream's names).
_REMOTE_MODULE_PICKLED_ATTRIBUTES = (
    "on",
    "device",
    "is_device_map_set",
    "is_scriptable",
    "generated_methods",
    "module_rref",
)

# nn.Module's own state and the bound methods: rebuilt on the receiver.
_REMOTE_MODULE_ATTRIBUTES_IGNORE_FOR_PICKLING = (
    "training",
    "_parameters",
    "_buffers",
    "_non_persistent_buffers_set",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_is_full_backward_hook",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_modules",
    "forward_async",
    "forward",
)

# nn.Module methods that would act on the local shell, not on the remote
# module: they raise ValueError, as upstream's.
_UNSUPPORTED_METHODS = (
    "register_buffer", "register_parameter", "add_module", "apply", "cuda", "ipu", "xpu", "cpu", "type",
    "float", "double", "half", "bfloat16", "to", "register_backward_hook", "register_forward_pre_hook",
    "register_forward_hook", "state_dict", "load_state_dict", "named_parameters", "buffers", "named_buffers",
    "children", "named_children", "modules", "named_modules", "requires_grad_", "zero_grad", "share_memory",
    "extra_repr",
)


# ---- run on the owner ---------------------------------------------------------

def _create_module(module_cls, args, kwargs, device, module_interface_cls=None):
    module = module_cls(*args, **kwargs)
    if not isinstance(module, nn.Module):
        raise ValueError(
            "Expect `module_cls(*args, **kwargs)` returns an instance of <class nn.Module>, "
            f"but it returns an instance of {type(module)}."
        )
    module.to(device)
    if module_interface_cls is not None:
        module = torch.jit.script(module)
    return module


def _to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _remote_forward(module_rref, device, is_device_map_set, *args, **kwargs):
    module = module_rref.local_value()
    if torch.device(device).type == "cpu":
        return module.forward(*args, **kwargs)
    # A module on an accelerator: inputs come as CPU tensors, results go back as CPU tensors.
    out = module.forward(*_to_device(args, device), **_to_device(kwargs, device))
    return _to_device(out, "cpu")


def _param_rrefs(module_rref, recurse):
    return [RRef(p) for p in module_rref.local_value().parameters(recurse)]


def _set_training(module_rref, mode):
    module_rref.local_value().train(mode)


# ---- the generated methods (upstream generates them from a template) -----------

def forward_async(self, *args, **kwargs):
    """Runs the remote module's ``forward(*args, **kwargs)`` on its owner;
    returns a ``torch.futures.Future`` of its result."""
    return api.rpc_async(
        self.module_rref.owner(), _remote_forward,
        (self.module_rref, self.device, self.is_device_map_set) + args, kwargs)


def forward(self, *args, **kwargs):
    """Runs the remote module's ``forward(*args, **kwargs)`` on its owner and
    returns its result."""
    return forward_async(self, *args, **kwargs).wait()


_GENERATED_METHODS = (forward_async, forward)


def _raise_not_supported(name):
    raise ValueError(f"Method ``{name}`` not supported for RemoteModule")


def _unsupported(name):
    def method(self, *args, **kwargs):
        _raise_not_supported(name)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = "Not supported for a RemoteModule: raises ValueError."
    return method


def _parse_remote_device(remote_device):
    """"worker1/cpu", "rank:1/cpu", "worker1" -> (worker name or rank, device str)."""
    if not isinstance(remote_device, str):
        raise TypeError(f"RemoteModule(remote_device=...) expects a str like 'worker1/cpu'; "
                        f"got {type(remote_device).__name__}")
    parsed = torch.distributed._remote_device(remote_device)
    on = parsed.worker_name() if parsed.worker_name() is not None else parsed.rank()
    if on is None:
        raise ValueError(f"RemoteModule(remote_device={remote_device!r}): name the worker, as "
                         "'<worker name>/<device>' or 'rank:<rank>/<device>' (e.g. 'worker1/cpu')")
    return on, str(parsed.device())


class _RemoteModule(nn.Module):
    """See :class:`RemoteModule`; also takes ``_module_interface_cls`` (the
    module is then scripted on its owner; calls still go through Python)."""

    def __init__(self, remote_device, module_cls, args=None, kwargs=None, _module_interface_cls=None):
        super().__init__()
        self._prepare_init(remote_device, module_cls)
        args = tuple(args) if args is not None else ()
        kwargs = kwargs if kwargs is not None else {}
        self.is_scriptable = _module_interface_cls is not None
        self.generated_methods = _GENERATED_METHODS
        self.module_rref = api.remote(
            self.on, _create_module, (module_cls, args, kwargs, self.device, _module_interface_cls))
        self._install_generated_methods()
        self._check_attribute_picklability()

    def _prepare_init(self, remote_device, module_cls=None):
        state.require("RemoteModule")
        if module_cls is not None and _is_torch_remote_module(module_cls):
            raise TypeError(_TORCH_REMOTE_MODULE_HINT)
        self.on, self.device = _parse_remote_device(remote_device)
        if isinstance(self.on, str):
            api.get_worker_info(self.on)  # an unknown worker: ValueError here, not on first use
        self.is_device_map_set = False  # torchrpc sends CPU tensors only

    def _install_generated_methods(self):
        for method in self.generated_methods:
            setattr(self, method.__name__, types.MethodType(method, self))

    def _check_attribute_picklability(self):
        for k in self.__dict__:
            if k not in _REMOTE_MODULE_PICKLED_ATTRIBUTES and k not in _REMOTE_MODULE_ATTRIBUTES_IGNORE_FOR_PICKLING:
                raise AttributeError(
                    f"Attribute {k} must be either in ``_REMOTE_MODULE_PICKLED_ATTRIBUTES`` or "
                    "``_REMOTE_MODULE_ATTRIBUTES_IGNORE_FOR_PICKLING``."
                )

    def remote_parameters(self, recurse=True):
        """RRefs to the remote module's parameters (``List[RRef[Parameter]]``),
        e.g. for :class:`torchrpc.optim.DistributedOptimizer`.

        Args:
            recurse (bool): include the parameters of submodules (default True).
        """
        return api.rpc_sync(self.on, _param_rrefs, args=(self.module_rref, recurse))

    def get_module_rref(self):
        """The RRef (``RRef[nn.Module]``) of the module on its owner."""
        return self.module_rref

    def train(self, mode=True):
        """Sets the remote module's training mode; returns this RemoteModule."""
        api.rpc_sync(self.module_rref.owner(), _set_training, args=(self.module_rref, mode))
        return self

    def eval(self):
        """Sets the remote module to evaluation mode; returns this RemoteModule."""
        return self.train(False)

    def parameters(self, recurse=True):
        raise ValueError(
            "Method ``parameters`` not supported for RemoteModule. Please use ``remote_parameters`` instead."
        )

    def __getstate__(self):
        raise RuntimeError(
            "Cannot pickle RemoteModule in python pickler. RemoteModule can only be pickled when using RPC "
            "(pass it as an argument or result of a torchrpc call)"
        )

    def __setstate__(self, state):
        raise RuntimeError(
            "Cannot unpickle RemoteModule in python pickler. RemoteModule can only be unpickled when using RPC"
        )

    @staticmethod
    def init_from_module_rref(remote_device, module_rref, _module_interface_cls=None):
        """A RemoteModule for a module that already exists on its owner.

        Several RemoteModules may share one module this way; also how a
        module reaches a worker without sending the RemoteModule.

        Args:
            remote_device (str): "<worker name>/<device>" of `module_rref`'s owner.
            module_rref (RRef[nn.Module]): the module.
        """
        m = object.__new__(RemoteModule)
        nn.Module.__init__(m)
        m._prepare_init(remote_device)
        m.is_scriptable = _module_interface_cls is not None
        m.generated_methods = _GENERATED_METHODS
        m.module_rref = module_rref
        m._install_generated_methods()
        m._check_attribute_picklability()
        return m


for _name in _UNSUPPORTED_METHODS:
    setattr(_RemoteModule, _name, _unsupported(_name))
del _name


class RemoteModule(_RemoteModule):
    """An ``nn.Module`` created on another worker; ``forward`` runs there.

    Created after :func:`torchrpc.init_rpc`. It has two methods with the
    arguments of the module's ``forward``: ``forward`` (blocks, returns the
    result) and ``forward_async`` (returns a Future). Calls inside a
    ``torchrpc.autograd.context()`` are recorded, so ``backward`` reaches the
    remote parameters; :meth:`remote_parameters` gives them to
    :class:`torchrpc.optim.DistributedOptimizer`. Other ``nn.Module`` methods
    that would act on the local shell (``to``, ``parameters``,
    ``state_dict``, hooks, ...) raise ValueError; ``train`` and ``eval`` set
    the remote module's mode. It can be sent to other workers as an argument
    or result of a torchrpc call (its module is shared, not copied), but not
    pickled otherwise. Thread-safe as the calls are: concurrent forwards run
    concurrently on the owner.

    ``torch.distributed.nn.RemoteModule`` works only with
    ``torch.distributed.rpc``; with torchrpc use this class.

    Args:
        remote_device (str): where the module lives: "<worker name>/<device>"
            or "rank:<rank>/<device>", e.g. "worker1/cpu"; the device
            defaults to "cpu".
        module_cls (type): the ``nn.Module`` class, created on the owner as
            ``module_cls(*args, **kwargs)`` (must be importable there, or
            picklable by value).
        args (tuple): its positional arguments (default none).
        kwargs (dict): its keyword arguments (default none).

    Attributes:
        on (str or int): the owner, as given in `remote_device`.
        device (str): the module's device on the owner.
        module_rref (RRef): the module.

    Example::

        >>> remote_linear = torchrpc.nn.RemoteModule("worker1/cpu", torch.nn.Linear, args=(4, 2))
        >>> out = remote_linear(torch.ones(3, 4))
        >>> out.shape
        torch.Size([3, 2])
    """

    def __init__(self, remote_device, module_cls, args=None, kwargs=None):
        super().__init__(remote_device, module_cls, args, kwargs)


# ---- sending one through RPC --------------------------------------------------

def _remote_module_receiver(*attrs):
    m = object.__new__(RemoteModule)
    nn.Module.__init__(m)
    m.__dict__.update(zip(_REMOTE_MODULE_PICKLED_ATTRIBUTES, attrs))
    m._install_generated_methods()
    return m


def _remote_module_reducer(remote_module):
    ignored = [k for k in remote_module.__dict__
               if k not in _REMOTE_MODULE_PICKLED_ATTRIBUTES and k not in _REMOTE_MODULE_ATTRIBUTES_IGNORE_FOR_PICKLING]
    if ignored:
        warnings.warn(
            f"RemoteModule attributes {ignored} are not sent with it (only {list(_REMOTE_MODULE_PICKLED_ATTRIBUTES)} "
            "are): the receiver's copy lacks them",
            RuntimeWarning, stacklevel=2,
        )
    return _remote_module_receiver, tuple(remote_module.__dict__[k] for k in _REMOTE_MODULE_PICKLED_ATTRIBUTES)


python_fallback.register_reducer(RemoteModule, _remote_module_reducer)
python_fallback.register_reducer(_RemoteModule, _remote_module_reducer)


# ---- torch's RemoteModule -----------------------------------------------------

_TORCH_REMOTE_MODULE_HINT = (
    "torch.distributed.nn.RemoteModule works only with torch.distributed.rpc; "
    "with torchrpc use torchrpc.nn.RemoteModule (same arguments)"
)


def _is_torch_remote_module(obj):
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__module__ == "torch.distributed.nn.api.remote_module" and c.__name__ in ("RemoteModule", "_RemoteModule")
               for c in getattr(cls, "__mro__", ()))

