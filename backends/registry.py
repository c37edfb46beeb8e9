"""The ladder: one ordered table of backends, cuBLAS first as the baseline.

Adding a step = one kernel file (a ``.cu`` in ``backends/cuda/`` or a Triton module) with a
header comment saying what technique it adds, one entry in ``LADDER`` below and one line in
the README's table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import torch_backends
from .cuda import CudaKernel, cuda_unavailable_reason

try:
    from . import triton_fused
except ImportError as exc:  # Triton ships wheels for Linux only
    triton_fused = None
    _TRITON_MISSING = f"Triton is not importable ({exc})"

# (a, b, c, relu, allow_tf32, out) -> D; out may be None (the backend then allocates D).
RunFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, bool, bool,
                  torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class Backend:
    """One rung of the ladder and what it supports.

    Attributes:
        name: registry key, e.g. ``"cuda_regblock"``.
        summary: the technique it adds, one line.
        run: the implementation; ``gemm()`` calls it only with checked inputs.
        dtypes: operand dtypes it computes in (A, B, C and D share one).
        devices: torch device types whose tensors it takes (``"cuda"``, ``"cpu"``).
        fused_epilogue: +C and ReLU happen inside the GEMM kernel, before its one store of D.
        tf32: honours ``allow_tf32=True`` (fp32 operands on the TF32 tensor cores).
        strided: reads any strides; otherwise ``gemm()`` hands it contiguous copies.
        differentiable: autograd can differentiate through it.
        max_numel: largest element count of any operand it can index, or None.
        unavailable: returns why it cannot run on this machine, or None when it can.
        config: returns its tile configuration (compile-time sizes, or the autotuner's pick).
    """

    name: str
    summary: str
    run: RunFn
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    fused_epilogue: bool
    tf32: bool
    strided: bool
    differentiable: bool
    max_numel: int | None
    unavailable: Callable[[], str | None]
    config: Callable[[], str]


def _output(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out``, or a new uninitialised (M, N) tensor for a kernel to write D into."""
    if out is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    return out


# The CUDA C rungs: source file, kernel and compile-time tile sizes.
CUDA_KERNELS: dict[str, CudaKernel] = {
    "cuda_naive": CudaKernel("01_naive.cu", "gemm_naive", {"BLOCK_M": 16, "BLOCK_N": 16}),
    "cuda_smem": CudaKernel("02_smem.cu", "gemm_smem",
                            {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}),
    "cuda_regblock": CudaKernel("03_regblock.cu", "gemm_regblock",
                                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 8, "TM": 8, "TN": 8}),
}


def _cuda_backend(name: str, summary: str) -> Backend:
    kernel = CUDA_KERNELS[name]

    def run(a, b, c, relu, allow_tf32, out):
        return kernel(a, b, c, relu, _output(a, b, out))

    return Backend(name, summary, run, dtypes=(torch.float32,), devices=("cuda",),
                   fused_epilogue=True, tf32=False, strided=False, differentiable=False,
                   max_numel=None, unavailable=cuda_unavailable_reason,
                   config=lambda: f"{kernel.source} " + " ".join(kernel.defines()))


def _triton_backend() -> Backend:
    def run(a, b, c, relu, allow_tf32, out):
        return triton_fused.run(a, b, c, relu, allow_tf32, _output(a, b, out))

    present = triton_fused is not None
    return Backend(
        "triton_fused",
        "Triton: 2D tiles, fp32 register accumulator, grouped order, +C/ReLU fused; autotuned",
        run, dtypes=triton_fused.DTYPES if present else (),
        devices=triton_fused.devices() if present else ("cuda",),
        fused_epilogue=True, tf32=True, strided=True, differentiable=False,
        max_numel=triton_fused.MAX_NUMEL if present else None,
        unavailable=triton_fused.unavailable_reason if present else lambda: _TRITON_MISSING,
        config=triton_fused.last_config if present else lambda: "")


def _runs_everywhere() -> None:
    return None


LADDER: tuple[Backend, ...] = (
    Backend("cublas", "cuBLAS via torch.mm/addmm (+C as beta=1), then an in-place ReLU",
            torch_backends.run_cublas, torch_backends.DTYPES, ("cuda", "cpu"),
            fused_epilogue=False, tf32=True, strided=True, differentiable=True,
            max_numel=None, unavailable=_runs_everywhere, config=lambda: "cuBLAS heuristics"),
    Backend("torch_unfused", "torch.relu(a @ b + c) as a user writes it: three kernels",
            torch_backends.run_unfused, torch_backends.DTYPES, ("cuda", "cpu"),
            fused_epilogue=False, tf32=True, strided=True, differentiable=True,
            max_numel=None, unavailable=_runs_everywhere, config=lambda: "cuBLAS + 2 elementwise"),
    _cuda_backend("cuda_naive", "one thread per output, operands straight from global memory"),
    _cuda_backend("cuda_smem", "shared-memory tiling: each operand loaded once per block"),
    _cuda_backend("cuda_regblock", "register blocking: a TM x TN sub-tile of D per thread"),
    _triton_backend(),
)
BACKENDS: dict[str, Backend] = {b.name: b for b in LADDER}
