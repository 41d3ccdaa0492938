"""Which callees' run time the size of their tensor inputs bounds
(csrc/script_dispatch/bounded.h). Only those may run on the thread that read
the call (test_inline_calls.py), so a number that sizes an output, a loop,
or an op that tensor values size must keep a callee off that list."""

import warnings

import pytest
import torch

from tests.csrc import hooks

warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in 2.13


@pytest.mark.parametrize(
    "name",
    [
        "aten::add.Tensor",
        "aten::add.Scalar",  # torch.add(t, 1): a Scalar sizes nothing
        "aten::relu",
        "aten::mm",
        "aten::cat",  # Tensor[] and a dimension
        "aten::transpose.int",
        "aten::sum.dim_IntList",
        "aten::softmax.int",  # and a dtype
        "aten::div.Tensor_mode",  # and a str
        "aten::sort",
    ],
)
def test_operators_whose_tensors_bound_their_time(name):
    assert hooks().bounded_operator(name), name


@pytest.mark.parametrize(
    "name",
    [
        "aten::ones",  # its size is a number
        "aten::arange",  # no tensor: a Scalar is its length
        "aten::repeat",  # repeats
        "aten::topk",  # k is not a dimension
        "aten::add_.Tensor",  # writes its argument
        "aten::add.out",  # an out= argument, resized by what it computes
        "aten::bincount",  # the values in its tensor size its output
        "aten::repeat_interleave.Tensor",
        "aten::rand_like",  # a device
        "aten::tile",  # its `dims` are repeat counts
        "aten::special_chebyshev_polynomial_t",  # loops n times per element, n a value
        "aten::special_hermite_polynomial_h.n_scalar",  # the same, n a Scalar
        "aten::_softmax",  # a private op
        "prim::NumToTensor.Scalar",  # not aten
    ],
)
def test_operators_that_something_else_may_size(name):
    assert not hooks().bounded_operator(name), name


@torch.jit.script
def _scaled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2 + y).sum(0)


@torch.jit.script
def _counted(x: torch.Tensor) -> torch.Tensor:
    return torch.bincount(x)


@torch.jit.script
def _sized(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(int(x.sum()))


@torch.jit.script
def _looped(x: torch.Tensor) -> torch.Tensor:
    for _ in range(3):
        x = x + 1
    return x


@torch.jit.script
def _with_a_number(x: torch.Tensor, n: int) -> torch.Tensor:
    return x + n


def test_script_functions():
    assert hooks().bounded_function(_scaled)
    assert not hooks().bounded_function(_counted), "bincount: tensor values size it"
    assert not hooks().bounded_function(_sized), "reads a number out of a tensor"
    assert not hooks().bounded_function(_looped), "a loop"
    assert not hooks().bounded_function(_with_a_number), "a number argument"
