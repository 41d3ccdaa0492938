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

One module per optimizer (``sgd``, ``adam`` with AdamW, ``adagrad``,
``rmsprop``) holds its class and the mapping of its ``torch.optim``
arguments; ``common`` what they share, ``selection`` the choice. The classes
are compiled, so they keep to the subset TorchScript accepts (no ``continue``
refinement of Optionals, no inheritance, no keyword-only arguments).

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

from torchrpc.optim.functional.adagrad import FunctionalAdagrad
from torchrpc.optim.functional.adam import FunctionalAdam
from torchrpc.optim.functional.rmsprop import FunctionalRMSprop
from torchrpc.optim.functional.selection import functional_optimizer
from torchrpc.optim.functional.sgd import FunctionalSGD

__all__ = [
    "FunctionalAdagrad",
    "FunctionalAdam",
    "FunctionalRMSprop",
    "FunctionalSGD",
    "functional_optimizer",
]
