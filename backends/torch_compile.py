"""torch_compile: the expression a PyTorch user writes, ``relu(a @ b + c)``, compiled by
``torch.compile(mode="max-autotune-no-cudagraphs")``: Inductor benchmarks its Triton GEMM
templates (with the add and ReLU fused into their epilogue) against cuBLAS and keeps the
fastest, once per problem. gemmlab times kernels itself, under CUDA graphs of its own, so
Inductor's CUDA graphs stay off.

Each Problem (shape, dtype, epilogue, TF32) is compiled once and cached, through a function
of its own (its own code object): Dynamo caches compiled graphs per code object and stops
recompiling one after ``torch._dynamo.config.recompile_limit`` shapes, falling back to eager,
which a sweep over many shapes would hit. The compile time is reported by ``describe()``,
never timed: the first call, which compiles, is ``gemm()``'s checked call.
Source: PyTorch's ``torch.compile`` documentation (modes) and Inductor's ``max_autotune``.
"""

from __future__ import annotations

import functools
import time
import types

import torch

from .problem import Launch, Problem
from .torch_backends import with_precision

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MODE = "max-autotune-no-cudagraphs"
_last = ["not launched yet"]


def describe() -> str:
    """The mode and compile time of the latest call's compiled function."""
    return _last[0]


def _expression(a, b, c, relu: bool):
    d = a @ b
    if c is not None:
        d = d + c
    return torch.relu(d) if relu else d


class _Compiled:
    """One problem's compiled function and how long its first call (the compile) took."""

    def __init__(self, p: Problem, number: int):
        code = _expression.__code__.replace(co_name=f"gemmlab_expression_{number}")
        fresh = types.FunctionType(code, _expression.__globals__, code.co_name)
        self.fn = torch.compile(fresh, mode=MODE, dynamic=False, fullgraph=True)
        self.relu = p.relu
        self.seconds: float | None = None

    def __call__(self, a, b, c):
        if self.seconds is not None:
            return self.fn(a, b, c, self.relu)
        start = time.perf_counter()
        d = self.fn(a, b, c, self.relu)
        self.seconds = time.perf_counter() - start
        return d


@functools.cache
def compiled(p: Problem, strides: tuple) -> _Compiled:
    """The compiled function of ``p`` for operands of ``strides`` ((A's, B's, C's or None));
    compiled at its first call."""
    return _Compiled(p, compiled.cache_info().currsize)


def bind(p: Problem, config=None) -> Launch:
    """Inductor's kernel(s) for ``p``, compiled at the first call of its operand strides; D
    is a new tensor, copied into ``out`` when one is given. A launch is for the strides of
    its first call (``gemm()`` binds once per signature)."""
    bound: list = []  # [the torch.compile'd function, its description] after the first call
    relu = p.relu

    def launch(a, b, c, out):
        if bound:
            d = bound[0](a, b, c, relu)
        else:
            fn = compiled(p, (a.stride(), b.stride(), None if c is None else c.stride()))
            d = fn(a, b, c)
            bound[:] = fn.fn, f"torch.compile(mode={MODE!r}), compiled in {fn.seconds:.1f} s"
        _last[0] = bound[1]
        return d if out is None else out.copy_(d)

    return with_precision(p, launch)
