"""Modules and helpers the RemoteModule tests create or run on other workers."""

import torch
from torch import nn


class Affine(nn.Module):
    """y = x @ weight + bias * scale, with forward's keyword argument."""

    def __init__(self, n, bias_value=0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(n, dtype=torch.float64))
        self.bias = nn.Parameter(torch.full((n,), bias_value, dtype=torch.float64))

    def forward(self, x, scale=1.0):
        return x @ self.weight + self.bias * scale


class NotAModule:
    def __init__(self, *args):
        pass


def module_of(remote_module):
    """Runs where the module lives: the module's weight, via the RemoteModule itself."""
    return remote_module.get_module_rref().local_value().weight.detach().clone()


def forward_there(remote_module, x):
    """Runs on another worker: calls a RemoteModule that was sent to it."""
    return remote_module.forward(x)


def attributes_of(remote_module):
    return sorted(remote_module.__dict__)


def training_of(module_rref):
    return module_rref.local_value().training


def weight_of(module_rref):
    return module_rref.local_value().weight.detach().clone()
