"""cublaslt: cuBLASLt with its own fused epilogues, through nvmath-python's stateful
``nvmath.linalg.advanced.Matmul`` (planned once per problem, then only executed).

- full C: ``Matmul(a, b, c, beta=1)`` with the ``RELU`` epilogue (or none): D = act(A @ B + C)
  in one cuBLASLt call, C read in the epilogue.
- bias: cuBLASLt's bias vector runs along the rows of its column-major result, one value
  per row (nvmath: a bias of length M). Our bias is one value per column of D, so the call
  computes E = B^T A^T (N x M, column-major, the ``BIAS``/``RELU_BIAS`` epilogue adding the
  bias per row of E) and returns D = E^T, which is row-major (M, N): no copy.
- none: ``Matmul(a, b)`` with ``RELU`` (or none).

fp32 computes in IEEE fp32 (``COMPUTE_32F``), tf32 in ``COMPUTE_32F_FAST_TF32``, fp16 and
bf16 with fp32 accumulation (``COMPUTE_32F``). Source: nvmath-python's documentation of
``Matmul``, ``MatmulEpilog`` and ``MatmulOptions``; cuBLASLt's ``cublasLtMatmul``.
"""

from __future__ import annotations

import collections
import functools
import warnings

import torch

from .problem import Launch, Problem

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Planned Matmul objects kept (least recently used dropped and freed). Each holds the
# operands of its latest call, so the count bounds the memory this cache keeps alive.
PLANS_KEPT = 4
_plans: collections.OrderedDict = collections.OrderedDict()  # token -> [Matmul, description,
#                                                                   the operands' addresses]
# A small int per planned layout (problem, strides, alignment): hashing it per call costs
# nothing, where hashing the layout itself (a Problem dataclass) costs a microsecond.
_tokens: dict[tuple, int] = {}
_last = ["not launched yet"]


@functools.cache
def unavailable_reason() -> str | None:
    """Why cublaslt cannot run here, or None when it can (asked once per process)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import nvmath.linalg.advanced  # noqa: F401  (the import is the check)
    except ImportError as exc:
        return (f"nvmath-python is not importable ({exc}); install gemmlab[cuda13] or "
                f"gemmlab[cuda12]")
    return None


def describe() -> str:
    """The latest call's cuBLASLt epilogue and compute type."""
    return _last[0]


def plan(p: Problem, a, b, c, stream: int):
    """A planned nvmath ``Matmul`` for ``p`` on these operands (their layouts and alignment
    fix the plan) and a one-line description of it."""
    from nvmath.linalg import ComputeType
    from nvmath.linalg.advanced import Matmul, MatmulEpilog, MatmulOptions

    compute = ComputeType.COMPUTE_32F_FAST_TF32 if p.allow_tf32 else ComputeType.COMPUTE_32F
    options = MatmulOptions(compute_type=compute)
    if p.c == "bias":
        mm = Matmul(b.T, a.T, options=options, stream=stream)
        epilog = MatmulEpilog.RELU_BIAS if p.relu else MatmulEpilog.BIAS
        mm.plan(epilog=epilog, epilog_inputs={"bias": c}, stream=stream)
    else:
        mm = Matmul(a, b, c, beta=None if c is None else 1.0, options=options, stream=stream)
        epilog = MatmulEpilog.RELU if p.relu else None
        mm.plan(epilog=epilog, stream=stream)
    name = epilog.name if epilog is not None else "no"
    text = (f"cuBLASLt via nvmath Matmul, {name} epilogue"
            f"{', C with beta=1' if p.c == 'full' else ''}, {compute.name}")
    return mm, text


def _free(mm) -> None:
    """Release a dropped plan's cuBLASLt objects and workspace. nvmath first makes the
    workspace's stream wait for the plan's last execution; when that execution was captured
    into a CUDA graph and never run eagerly after, the wait is refused
    (CUDA_ERROR_INVALID_VALUE): the plan is then dropped with a warning, and what it held
    goes back only when Python collects it."""
    try:
        mm.free()
    except Exception as exc:  # nvmath's CUDAError; whatever it is, the GEMM itself is done
        warnings.warn(f"cublaslt: a dropped cuBLASLt plan could not release its resources "
                      f"({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=3)


def bind(p: Problem, config=None) -> Launch:
    """The cuBLASLt launch for ``p``: planned at its first call (per operand layout and
    pointer alignment, which cuBLASLt's algorithm choice depends on), executed after that on
    torch's current stream. D is a new tensor, copied into ``out`` when one is given. A
    launch is for the layouts of its first call (``gemm()`` binds once per signature)."""
    device = p.device.index if p.device.index is not None else torch.cuda.current_device()
    tokens: list = []  # the plan's token, from the first call's operands

    bias = p.c == "bias"

    def launch(a, b, c, out):
        stream = torch._C._cuda_getCurrentRawStream(device)
        if bias:
            c = c.contiguous()  # cuBLASLt reads the bias vector with unit stride
        if not tokens:
            layout = (p, a.stride(), b.stride(), None if c is None else c.stride(),
                      a.data_ptr() % 16, b.data_ptr() % 16,
                      None if c is None else c.data_ptr() % 16)
            tokens.append(_tokens.setdefault(layout, len(_tokens)))
        token = tokens[0]
        pointers = (a.data_ptr(), b.data_ptr(), None if c is None else c.data_ptr())
        entry = _plans.get(token)
        if entry is None:
            entry = _plans[token] = [*plan(p, a, b, c, stream), pointers]
            while len(_plans) > PLANS_KEPT:
                _free(_plans.popitem(last=False)[1][0])
        else:
            _plans.move_to_end(token)
            # New operands for a planned problem. The same addresses need no reset: the plan
            # holds the tensors it last ran on, so that memory is what these views are.
            if entry[2] != pointers:
                if bias:
                    entry[0].reset_operands_unchecked(a=b.T, b=a.T, epilog_inputs={"bias": c})
                else:
                    entry[0].reset_operands_unchecked(a=a, b=b, c=c)
                entry[2] = pointers
        mm, _last[0], _ = entry
        d = mm.execute(stream=stream)
        if bias:
            d = d.T
        return d if out is None else out.copy_(d)

    return launch
