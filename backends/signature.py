"""Signature guards: does a call's tensors have the layout a binding was made for?

``guard(*tensors)`` remembers each tensor's dtype, device, sizes, strides, ``requires_grad``
and dispatch keys (device type, flags such as a negated or conjugated view, and whether
``torch.autocast`` is on for the tensor's device type), and its ``check(*tensors)`` says
whether new tensors match all of them.

It is torch's own C++ tensor guard, the one TorchDynamo used to check a compiled graph's
inputs on every call (``torch._C._dynamo.guards.TensorGuards``): one C call, where
``gemm()``'s hot path used to read the attributes into a Python tuple and look it up in a
dict (on the H200 machine 1.58 µs to build that key for three tensors, 2.24 with the
look-up: ``bench/results/h200-overhead/host-pieces.txt``, commit 0a5732a; the guard's own
check was not timed on its own). It is private to torch, so the first use checks that it
tells apart what ``gemm()`` relies on (a transpose, a slice, another dtype,
``requires_grad``, another device type, autocast turned on: a tensor's dispatch keys are its
own plus the thread's included ones minus its excluded ones, and autocast off excludes the
device's Autocast key); when it is missing or fails that check, ``Described`` (the same
comparison in Python) stands in, and ``implementation()`` says which one runs.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch


class Guard(Protocol):
    def check(self, *tensors: torch.Tensor) -> bool: ...


class Described:
    """The Python guard: each tensor's (dtype, device, shape, strides, requires_grad, the
    negated/conjugated view flags, and whether autocast is on for its device type), compared
    as one tuple."""

    __slots__ = ("signature",)

    def __init__(self, *tensors: torch.Tensor):
        self.signature = _describe(tensors)

    def check(self, *tensors: torch.Tensor) -> bool:
        return _describe(tensors) == self.signature


def _describe(tensors) -> tuple:
    return tuple((t.dtype, t.device, t.shape, t.stride(), t.requires_grad, t.is_neg(),
                  t.is_conj(), _autocast(t.device.type)) for t in tensors)


def _autocast(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` (False for a type it has none)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know, e.g. meta
        return False


def guard(*tensors: torch.Tensor) -> Guard:
    """A guard of ``tensors``' signature (see the module doc).

    Raises:
        TypeError: an argument that is not a tensor.
    """
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"a signature guard takes tensors, got {type(t).__name__}")
    native = _native()
    return Described(*tensors) if native is None else native(*tensors)


def implementation() -> str:
    """``"torch TensorGuards"`` or ``"python"``: which guard ``guard`` builds here."""
    return "python" if _native() is None else "torch TensorGuards"


@functools.cache
def _native():
    """torch's guard as a ``guard``-shaped callable, or None when it is missing or does not
    tell apart every change ``_SELF_TEST`` makes."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None

    def build(*tensors):
        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)

    try:
        x = torch.zeros(4, 6)
        g = build(x)
        if not g.check(x) or not g.check(torch.ones(4, 6)):
            return None
        changed = (x.t().contiguous().t(), x[:, :5], x[:3], x.double(),
                   x.clone().requires_grad_(), x.to("meta"), x._neg_view())
        if any(g.check(t) for t in changed):
            return None
        with torch.autocast("cpu"):
            if g.check(x):
                return None
    except Exception:  # any failure of a private API means: do not use it
        return None
    return build
