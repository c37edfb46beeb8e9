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
    "TensorFloat-32 (TF32) on Ampere (and later) devices" notes). When the caller has already
    mixed them, torch cannot read the global one: both are set inside, and only the
    per-backend one (what cuBLAS honours) is put back."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # the caller mixed the two APIs
        legacy = None
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        matmul.fp32_precision = saved


def with_precision(p: Problem, launch: Launch) -> Launch:
    """``launch`` run under ``p``'s fp32 precision for fp32 CUDA problems (the setting is
    global state, so it is touched only where it matters, and changed only when it differs);
    ``launch`` itself otherwise. The current setting is read as the flag cuBLAS honours
    (``torch._C._get_cublas_allow_tf32``, what ``torch.backends.cuda.matmul.allow_tf32``
    returns, at a tenth of the property's cost); when the legacy and new precision APIs
    were mixed, that read raises and the setting is made explicitly."""
    if p.device.type != "cuda" or p.dtype != torch.float32:
        return launch
    wanted = p.allow_tf32

    def precise(a, b, c, out):
        try:
            inherited = torch._C._get_cublas_allow_tf32() == wanted
        except RuntimeError:  # mixed APIs: torch cannot say, so set it
            inherited = False
        if inherited:
            return launch(a, b, c, out)
        with fp32_precision(wanted):
            return launch(a, b, c, out)

    return precise


def bind_cublas(p: Problem, config=None) -> Launch:
    """D = act(A @ B + C) with torch.mm / torch.addmm, written into ``out`` when given (by
    their ``out=``, or, where autograd records the call, which ``out=`` does not support,
    copied into it as ``torch_unfused`` does)."""
    relu = p.relu

    def launch(a, b, c, out):
        if out is None or (torch.is_grad_enabled() and (
                a.requires_grad or b.requires_grad or out.requires_grad
                or (c is not None and c.requires_grad))):
            # no out= keyword: torch's argument parser takes longer over one
            d = torch.mm(a, b) if c is None else torch.addmm(c, a, b)
            d = d.relu_() if relu else d
            return d if out is None else out.copy_(d)
        d = torch.mm(a, b, out=out) if c is None else torch.addmm(c, a, b, out=out)
        return d.relu_() if relu else d

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
