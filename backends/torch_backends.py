"""The torch baselines: cuBLAS through torch, and the unfused expression a user would write.

``cublas`` is ``torch.mm``/``torch.addmm`` into the output (on CUDA tensors that is cuBLAS;
+C is folded into the GEMM as beta = 1) followed by an in-place ReLU. ``torch_unfused`` is
literally ``torch.relu(a @ b + c)``: three kernels and two intermediate tensors in global
memory. On CPU tensors both run torch's CPU BLAS.
"""

from __future__ import annotations

import contextlib

import torch

from .problem import Launch, Problem

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@contextlib.contextmanager
def fp32_precision(allow_tf32: bool):
    """torch's fp32 matmul precision set to TF32 (``"high"``) or IEEE (``"highest"``) inside,
    then restored. Set through ``torch.set_float32_matmul_precision``, which keeps the
    per-backend setting (``torch.backends.cuda.matmul.fp32_precision``) and the global one
    consistent: Inductor reads the global one and refuses a mix of the two APIs (PyTorch's
    "TensorFloat-32 (TF32) on Ampere (and later) devices" notes)."""
    matmul = torch.backends.cuda.matmul
    saved, legacy = matmul.fp32_precision, torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(legacy)
        matmul.fp32_precision = saved


def with_precision(p: Problem, launch: Launch) -> Launch:
    """``launch`` run under ``p``'s fp32 precision for fp32 CUDA problems (the setting is
    global state, so it is touched only where it matters, and changed only when it differs:
    reading it costs less than setting it); ``launch`` itself otherwise."""
    if p.device.type != "cuda" or p.dtype != torch.float32:
        return launch
    matmul = torch.backends.cuda.matmul
    wanted = "tf32" if p.allow_tf32 else "ieee"

    def precise(a, b, c, out):
        now = matmul.fp32_precision
        if (torch.backends.fp32_precision if now == "none" else now) == wanted:  # inherited
            return launch(a, b, c, out)
        with fp32_precision(p.allow_tf32):
            return launch(a, b, c, out)

    return precise


def bind_cublas(p: Problem, config=None) -> Launch:
    """D = act(A @ B + C) with torch.mm / torch.addmm, written into ``out`` when given."""
    def launch(a, b, c, out):
        out = torch.mm(a, b, out=out) if c is None else torch.addmm(c, a, b, out=out)
        return out.relu_() if p.relu else out

    return with_precision(p, launch)


def bind_unfused(p: Problem, config=None) -> Launch:
    """``torch.relu(a @ b + c)`` as written; copied into ``out`` when one is given."""
    def launch(a, b, c, out):
        d = a @ b
        if c is not None:
            d = d + c
        if p.relu:
            d = torch.relu(d)
        return d if out is None else out.copy_(d)

    return with_precision(p, launch)
