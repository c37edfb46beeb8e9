"""torch_compile: the expression a PyTorch user writes, ``relu(a @ b + c)``, compiled by
``torch.compile(mode="max-autotune-no-cudagraphs")``: Inductor benchmarks its Triton GEMM
templates (with the add and ReLU fused into their epilogue) against cuBLAS and keeps the
fastest, once per problem. gemmlab times kernels itself, under CUDA graphs of its own, so
Inductor's CUDA graphs stay off.

Each problem (shape, dtype, epilogue, TF32) is compiled once per operand strides,
``requires_grad`` and grad mode, and cached, through a function of its own (its own code
object): Dynamo caches compiled graphs per code object and stops recompiling one after
``torch._dynamo.config.recompile_limit`` shapes, falling back to eager, which a sweep over
many shapes would hit. The compile time is reported by ``describe()``, never timed: the
first call, which compiles, is ``gemm()``'s checked call.

Dynamo hands its graph to Inductor through a backend of ours that calls the registered
``inductor`` backend with the mode's options (``torch._inductor.list_mode_options``), which
is what ``torch.compile(mode=...)`` does, and keeps the function Inductor returns. After the
first call ``gemm()`` calls that function directly, past Dynamo's frame hook and guards:
``gemm()``'s own signature guard already holds every operand to the shapes, strides, dtype,
device, ``requires_grad`` and view flags the graph was compiled for, and the grad mode, as
``triton_fused`` launches Triton's compiled kernel past its autotuner; where Dynamo compiled
a function twice (another state it guards on changed), the binding calls the function
(``_Compiled.direct``). The kernels are Inductor's, the same either way.
Source: PyTorch's ``torch.compile`` documentation (modes; custom backends, "composable
backends" through ``torch._dynamo.lookup_backend``) and Inductor's ``max_autotune``.
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
    """One problem's compiled function: ``fn`` is what ``torch.compile`` returned, ``graphs``
    the functions Inductor compiled for it (one per Dynamo compile), ``seconds`` how long its
    first call (which compiles) took."""

    def __init__(self, p: Problem, number: int):
        code = _expression.__code__.replace(co_name=f"gemmlab_expression_{number}")
        fresh = types.FunctionType(code, _expression.__globals__, code.co_name)
        self.fn = torch.compile(fresh, backend=self._inductor, dynamic=False, fullgraph=True)
        self.relu = p.relu
        self.graphs: list = []
        self.seconds: float | None = None

    def _inductor(self, gm: torch.fx.GraphModule, example_inputs):
        """The Dynamo backend: Inductor in ``MODE``, its compiled graph kept for direct calls.
        Raises RuntimeError if Dynamo's graph does not take exactly A, B (and C), in order."""
        sources = [_source_name(node) for node in gm.graph.nodes if node.op == "placeholder"]
        if sources not in (["L['a']", "L['b']"], ["L['a']", "L['b']", "L['c']"]):
            raise RuntimeError(f"Dynamo's graph takes {sources}; gemmlab calls it with A, B "
                               f"and C, in that order")
        inductor = torch._dynamo.lookup_backend("inductor")
        graph = inductor(gm, example_inputs,
                         config_patches=torch._inductor.list_mode_options(MODE, False))
        self.graphs.append(graph)
        return graph

    def __call__(self, a, b, c):
        start = time.perf_counter()
        d = self.fn(a, b, c, self.relu)
        if self.seconds is None:
            self.seconds = time.perf_counter() - start
        return d

    def direct(self):
        """What a binding calls after its first call, as ``call(a, b[, c])[0]``: Inductor's
        graph when Dynamo compiled this function once (every call so far ran it); else, when
        a state Dynamo guards on beyond ``gemm()``'s signature changed between calls (say
        ``torch.use_deterministic_algorithms``) and Dynamo holds several graphs, the guarded
        function itself, which picks the right one."""
        if len(self.graphs) == 1:
            return self.graphs[0]
        fn, relu = self.fn, self.relu
        return lambda a, b, c=None: [fn(a, b, c, relu)]


def _source_name(placeholder: torch.fx.Node) -> str:
    """Where Dynamo took a graph input from, e.g. ``L['a']`` (the local ``a``)."""
    name = placeholder.meta["grapharg"].source.name
    return name() if callable(name) else name  # a method in older torch, now a property


@functools.cache
def _compiled(p: Problem, operands: tuple, grad_enabled: bool) -> _Compiled:
    return _Compiled(p, _compiled.cache_info().currsize)


def compiled(p: Problem, a, b, c) -> _Compiled:
    """The compiled function of ``p`` for these operands, cached per their strides and
    ``requires_grad`` and the grad mode (what Dynamo's guards recompile for); compiled at its
    first call."""
    operands = tuple(None if t is None else (t.stride(), t.requires_grad) for t in (a, b, c))
    return _compiled(p, operands, torch.is_grad_enabled())


def bind(p: Problem, config=None) -> Launch:
    """Inductor's kernel(s) for ``p``, compiled at the first call of its operand strides; D
    is a new tensor, copied into ``out`` when one is given. A launch is for the strides of
    its first call (``gemm()`` binds once per signature); after that call it calls
    Inductor's compiled graph directly."""
    bound: list = []  # [_Compiled.direct(), its description] after the first call

    def launch(a, b, c, out):
        if bound:
            d = (bound[0](a, b) if c is None else bound[0](a, b, c))[0]
        else:
            fn = compiled(p, a, b, c)
            d = fn(a, b, c)
            bound[:] = (fn.direct(),
                        f"torch.compile(mode={MODE!r}), compiled in {fn.seconds:.1f} s")
        _last[0] = bound[1]
        return d if out is None else out.copy_(d)

    return with_precision(p, launch)
