"""Remote functions of the fault tests (test_faults.py): a backward pass
that stays in progress until its worker is killed."""

import threading
import time

import torch

_backward_started = threading.Event()


class _SlowBackward(torch.autograd.Function):
    """Doubles x; its backward waits 60 s, long past when the test kills this worker."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _backward_started.set()
        time.sleep(60)
        return grad * 2


def slow_backward_double(x):
    return _SlowBackward.apply(x)


def backward_started():
    return _backward_started.wait(10)
