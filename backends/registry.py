"""The ladder: one ordered table of backends, cuBLAS first as the baseline.

Adding a step = one kernel file (a ``.cu`` in ``backends/cuda/`` or a Triton module) with a
header comment saying what technique it adds, one entry in ``LADDER`` below and one line in
the README's table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from . import torch_backends
from .cuda import CudaKernel, cuda_unavailable_reason, sm90a_unavailable_reason

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
        run: the implementation; ``gemm()`` calls it only with checked inputs. A backend with
            ``pin`` takes a seventh argument, a ``tuning.Choice``: its ``config`` (from ``pin``)
            replaces the default configuration unless it is None.
        dtypes: operand dtypes it computes in (A, B, C and D share one).
        devices: torch device types whose tensors it takes (``"cuda"``, ``"cpu"``).
        fused_epilogue: +C and ReLU happen inside the GEMM kernel, before its one store of D.
        tf32: honours ``allow_tf32=True`` (fp32 operands on the TF32 tensor cores).
        strided: reads any strides; otherwise ``gemm()`` hands it contiguous copies.
        differentiable: autograd can differentiate through it.
        max_numel: largest element count of any operand it can index, or None.
        unavailable: returns why it cannot run on this machine, or None when it can.
        config: returns its tile configuration (compile-time sizes, or the autotuner's pick);
            for a backend with ``pin``, the one of its latest call and that call's
            ``Choice.note`` (the tuned entry used, or why none applied).
        pin: builds the backend's own configuration (``triton.Config``, ``CudaKernel``) from a
            tuned table entry's ``config`` dict; None for a backend with nothing to tune.
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
    pin: Callable[[dict], Any] | None = None


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
    "cuda_vec": CudaKernel("04_vec.cu", "gemm_vec",
                           {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 8, "TM": 8, "TN": 8,
                            "THREADS": 256}),
    "cuda_warptile": CudaKernel("05_warptile.cu", "gemm_warptile",
                                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 16, "WARP_M": 64,
                                 "WARP_N": 32, "TM": 8, "TN": 8, "THREADS": 256}),
    "cuda_pipelined": CudaKernel("06_pipelined.cu", "gemm_pipelined",
                                 {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 16, "WARP_M": 64,
                                  "WARP_N": 32, "TM": 8, "TN": 8, "STAGES": 2, "THREADS": 128}),
    "cuda_wmma": CudaKernel("07_wmma.cu", "gemm_wmma",
                            {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "WARPS_M": 2,
                             "THREADS": 256}, dtypes=(torch.float16, torch.bfloat16)),
    "cuda_mma": CudaKernel("08_mma.cu", "gemm_mma",
                           {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "WARPS_M": 2,
                            "STAGES": 4, "GROUP_M": 8, "THREADS": 256},
                           dtypes=(torch.float16, torch.bfloat16)),
    "cuda_wgmma": CudaKernel("09_wgmma.cu", "gemm_wgmma",
                             {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "STAGES": 4,
                              "GROUP_M": 8, "THREADS": 384},
                             dtypes=(torch.float16, torch.bfloat16), tma=True),
}


def _cuda_backend(name: str, summary: str) -> Backend:
    kernel = CUDA_KERNELS[name]
    last = [None]  # the tuning.Choice of the latest call, for config()

    def chosen(choice) -> CudaKernel:
        return kernel if choice is None or choice.config is None else choice.config

    def run(a, b, c, relu, allow_tf32, out, choice=None):
        last[0] = choice
        return chosen(choice)(a, b, c, relu, _output(a, b, out))

    def describe() -> str:
        choice = last[0]
        ran = chosen(choice)
        text = f"{ran.source} " + " ".join(ran.defines())
        return text if choice is None else f"{text} ({choice.note})"

    return Backend(name, summary, run, dtypes=kernel.dtypes, devices=("cuda",),
                   fused_epilogue=True, tf32=False, strided=False, differentiable=False,
                   max_numel=None,
                   unavailable=sm90a_unavailable_reason if kernel.tma else cuda_unavailable_reason,
                   config=describe,
                   pin=lambda params: replace(kernel, params=dict(params)))


def _triton_backend() -> Backend:
    last = [None]  # the tuning.Choice of the latest call, for config()

    def run(a, b, c, relu, allow_tf32, out, choice=None):
        last[0] = choice
        return triton_fused.run(a, b, c, relu, allow_tf32, _output(a, b, out),
                                config=None if choice is None else choice.config)

    def describe() -> str:
        choice = last[0]
        text = triton_fused.last_config()  # the config that ran and which kernel ran it
        return text if choice is None else f"{text} ({choice.note})"

    def pin(config: dict):
        import triton

        tiles = {key: config[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        # Entries tuned before the persistent TMA kernel existed have no PERSISTENT: 0.
        tiles["PERSISTENT"] = config.get("PERSISTENT", 0)
        if tiles["PERSISTENT"] not in (0, 1):
            raise ValueError(f"PERSISTENT is {tiles['PERSISTENT']}, not 0 or 1")
        return triton.Config(tiles, num_warps=config["num_warps"],
                             num_stages=config["num_stages"])

    present = triton_fused is not None
    return Backend(
        "triton_fused",
        "Triton: 2D tiles, fp32 register accumulator, grouped order, +C/ReLU fused; autotuned",
        run, dtypes=triton_fused.DTYPES if present else (),
        devices=triton_fused.devices() if present else ("cuda",),
        fused_epilogue=True, tf32=True, strided=True, differentiable=False,
        max_numel=triton_fused.MAX_NUMEL if present else None,
        unavailable=triton_fused.unavailable_reason if present else lambda: _TRITON_MISSING,
        config=describe if present else lambda: "", pin=pin if present else None)


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
    _cuda_backend("cuda_vec", "128-bit global loads and shared stores, A transposed, no bank "
                  "conflicts"),
    _cuda_backend("cuda_warptile", "a warp tile between the block tile and the thread tile"),
    _cuda_backend("cuda_pipelined", "cp.async into multi-buffered shared memory: loads of tile "
                  "k+1 overlap the math of tile k"),
    _cuda_backend("cuda_wmma", "tensor cores through WMMA 16x16x16 fragments, fp32 accumulate"),
    _cuda_backend("cuda_mma", "mma.sync m16n8k16 fed by ldmatrix from a swizzled 4-stage "
                  "cp.async pipeline"),
    _cuda_backend("cuda_wgmma", "Hopper wgmma from shared memory fed by TMA, a producer and "
                  "two consumer warpgroups (sm_90a)"),
    _triton_backend(),
)
BACKENDS: dict[str, Backend] = {b.name: b for b in LADDER}
