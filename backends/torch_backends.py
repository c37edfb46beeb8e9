"""The two baselines: cuBLAS through torch, and the unfused expression a user would write.

``cublas`` is ``torch.mm``/``torch.addmm`` into the output (on CUDA tensors that is cuBLAS;
+C is folded into the GEMM as beta = 1) followed by an in-place ReLU; every "% of cuBLAS"
in gemmlab is measured against it. ``torch_unfused`` is literally
``torch.relu(a @ b + c)``: three kernels and two intermediate tensors in global memory.
On CPU tensors both run torch's CPU BLAS.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@contextlib.contextmanager
def _fp32_precision(allow_tf32: bool):
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    matmul.fp32_precision = "tf32" if allow_tf32 else "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = saved


def matmul_precision(a: torch.Tensor, allow_tf32: bool):
    """A context that sets torch's fp32 CUDA matmul precision to TF32 or IEEE, then restores
    it; a no-op for other tensors (the setting is global state, so it is touched only when
    it matters)."""
    if a.is_cuda and a.dtype == torch.float32:
        return _fp32_precision(allow_tf32)
    return contextlib.nullcontext()


def run_cublas(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, relu: bool,
               allow_tf32: bool, out: torch.Tensor | None) -> torch.Tensor:
    """D = act(A @ B + C) with torch.mm / torch.addmm, written into ``out`` when given."""
    with matmul_precision(a, allow_tf32):
        if c is None:
            out = torch.mm(a, b, out=out)
        else:
            out = torch.addmm(c, a, b, out=out)
    return out.relu_() if relu else out


def run_unfused(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, relu: bool,
                allow_tf32: bool, out: torch.Tensor | None) -> torch.Tensor:
    """``torch.relu(a @ b + c)`` as written; copied into ``out`` when one is given."""
    with matmul_precision(a, allow_tf32):
        d = a @ b
    if c is not None:
        d = d + c
    if relu:
        d = torch.relu(d)
    return d if out is None else out.copy_(d)
