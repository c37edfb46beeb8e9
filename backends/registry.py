"""The ladder: one ordered table of backends, the baselines first, then the rungs
(``gemmlab info`` prints it, with what runs on this machine).

Adding a step = one kernel file (a ``.cu`` in ``backends/cuda/`` or a Triton module) with a
header comment saying what technique it adds, one registry entry (a CUDA C kernel: its name,
technique, default tile sizes and search space in ``_CUDA_RUNGS``; any other: a ``Backend``
in ``LADDER``) and one row in the README's ladder table. The tests, ``gemmlab bench`` and
``gemmlab tune`` take the ladder from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from . import cublaslt, torch_backends, torch_compile
from .cuda import (
    MAX_DIM,
    CudaKernel,
    CudaSpace,
    cuda_unavailable_reason,
    sm80_unavailable_reason,
    sm90a_unavailable_reason,
)
from .problem import Launch, Problem

try:
    from . import triton_fused
except ImportError as exc:  # Triton ships wheels for Linux only
    triton_fused = None
    _TRITON_MISSING = f"Triton is not importable ({exc})"


@dataclass(frozen=True)
class Backend:
    """One rung of the ladder, or a baseline, and what it supports.

    Attributes:
        name: registry key, e.g. ``"cuda_regblock"``.
        summary: the technique it adds, one line.
        bind: ``bind(problem, config)`` returns the backend's ``Launch`` for one ``Problem``
            (``problem.Launch``); ``gemm()`` binds once per call signature (shapes, strides,
            dtypes, devices, the alignment of each pointer unless ``any_address``) and
            after that only launches.
            ``config`` is None (the default configuration) or, for a backend with ``pin``,
            the configuration ``pin`` built from a tuned entry; such a backend also takes
            ``note``, the tuning note its ``config()`` reports.
        dtypes: operand dtypes it computes in (A, B, C and D share one).
        devices: torch device types whose tensors it takes (``"cuda"``, ``"cpu"``).
        fused_epilogue: +C and ReLU happen inside the GEMM kernel, before its one store of D;
            None where an autotuner's pick decides (``torch_compile``: fused in Inductor's
            Triton templates, a separate kernel after cuBLAS; a profile shows which ran).
        tf32: honours ``allow_tf32=True`` (fp32 operands on the TF32 tensor cores).
        strided: reads any strides; otherwise ``gemm()`` hands it contiguous copies.
        differentiable: autograd can differentiate through it.
        any_address: its launch takes operands at any address, so ``gemm()`` binds it once
            for every alignment and reads no pointer to find the binding: the torch
            backends (Inductor's graph copies an input it assumed aligned when it is not),
            cuBLASLt (its launch plans per alignment) and the CUDA C kernels (each checks its
            bases' alignment before a vector access; the TMA rungs copy a misaligned A or B
            and choose D's and C's maps per launch). Otherwise (``triton_fused``: Triton
            specializes a kernel on its pointers' 16-byte alignment) a binding is for the
            16-byte misalignment of each pointer of its first call.
        max_offset: the largest element offset from an operand's start (D's included) it
            can index, or None for no limit.
        max_dim: the largest M, N or K it can index, or None for no limit.
        unavailable: returns why it cannot run on this machine, or None when it can.
        config: returns the configuration of its latest launch (compile-time sizes, the
            autotuner's pick, the library's plan) and, for a backend with ``pin``, which tuned
            entry was used or why none applied.
        pin: builds the backend's own configuration (``triton.Config``, ``CudaKernel``) from a
            tuned table entry's ``config`` dict; None for a backend with nothing to tune.
        search_space: ``search_space(dtype_name, device)`` lists the configurations (tuned
            table ``config`` dicts, the default's among them) that ``gemmlab tune`` checks
            and times for operands of ``dtype_name`` (fp32, tf32, fp16, bf16) on ``device``;
            None for a backend with nothing to tune. A backend with one has ``pin`` too.
        default_config: the default configuration as a ``search_space`` dict, where it is
            one (the CUDA C kernels' registry tile sizes); None where the default is chosen
            at run time (Triton's autotuner) or there is nothing to tune.
    """

    name: str
    summary: str
    bind: Callable[..., Launch]
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    fused_epilogue: bool | None
    tf32: bool
    strided: bool
    differentiable: bool
    unavailable: Callable[[], str | None]
    config: Callable[[], str]
    pin: Callable[[dict], Any] | None = None
    search_space: Callable[[str, torch.device], list[dict[str, int]]] | None = None
    default_config: dict[str, int] | None = None
    max_offset: int | None = None
    max_dim: int | None = None
    any_address: bool = False

    def bind_config(self, problem: Problem, config: dict[str, int] | None,
                    note: str) -> Launch:
        """The tuning interface: the launch of ``problem`` (as ``bind`` gives it) with
        ``config``, a tuned-table ``config`` dict such as ``search_space`` lists (None: the
        backend's default configuration). ``note`` says which configuration this is; the
        backend's ``config()`` reports it after each launch. The launch writes D into its
        ``out`` like every launch; checking D is the caller's job (``gemmlab tune`` checks
        each one against float64 on a NaN-poisoned output before timing it).

        Raises:
            ValueError: the backend has nothing to tune (no ``pin``); or, like KeyError and
                TypeError, ``config`` is not one the backend can use. A configuration that
                does not compile raises what the compiler raises, here (CUDA C) or at the
                first launch (Triton).
        """
        if self.pin is None:
            raise ValueError(f"backend {self.name!r} has no configuration to set")
        return self.bind(problem, None if config is None else self.pin(config), note)


def _warp_tiles(p: dict[str, int]) -> dict[str, int]:
    """WARP_N such that a warp's 32 lanes tile WARP_M x WARP_N with TM x TN each, and the
    THREADS of BLOCK_M x BLOCK_N such warps (cuda_warptile, cuda_pipelined)."""
    warp_n = 32 * p["TM"] * p["TN"] // p["WARP_M"]
    return {"WARP_N": warp_n,
            "THREADS": 32 * (p["BLOCK_M"] // p["WARP_M"]) * max(p["BLOCK_N"] // warp_n, 1)}


def _warpgroup_threads(params: dict[str, int]) -> dict[str, int]:
    """THREADS of a wgmma tile: one producer warpgroup and BLOCK_M / 64 consumer warpgroups."""
    return {"THREADS": 128 * (1 + params["BLOCK_M"] // 64)}


# The CUDA C rungs, in ladder order: name, the technique it adds, and its kernel (source file,
# kernel, default compile-time tile sizes, the space gemmlab tune searches). Each space holds
# the kernel's defaults (the tests check it), so the default is a candidate too.
_CUDA_RUNGS: tuple[tuple[str, str, CudaKernel], ...] = (
    ("cuda_naive", "one thread per output, operands straight from global memory",
     CudaKernel("01_naive.cu", "gemm_naive", {"BLOCK_M": 16, "BLOCK_N": 16},
                space=CudaSpace({"BLOCK_M": (4, 8, 16, 32), "BLOCK_N": (16, 32, 64, 128)}))),
    ("cuda_smem", "shared-memory tiling: each operand loaded once per block",
     CudaKernel("02_smem.cu", "gemm_smem", {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32},
                # One element of each input tile per thread: the tiles are square.
                space=CudaSpace({"BLOCK_M": (8, 16, 32)},
                                lambda p: {"BLOCK_N": p["BLOCK_M"], "BLOCK_K": p["BLOCK_M"]}))),
    ("cuda_regblock", "register blocking: a TM x TN sub-tile of D per thread",
     CudaKernel("03_regblock.cu", "gemm_regblock",
                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 8, "TM": 8, "TN": 8},
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (64, 128), "BLOCK_K": (8, 16),
                                 "TM": (4, 8), "TN": (4, 8)}))),
    ("cuda_vec", "128-bit global loads and shared stores, A transposed, no bank conflicts",
     CudaKernel("04_vec.cu", "gemm_vec",
                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 8, "TM": 8, "TN": 8, "THREADS": 256},
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (64, 128), "BLOCK_K": (8, 16),
                                 "TM": (4, 8), "TN": (4, 8)},
                                lambda p: {"THREADS": p["BLOCK_M"] // p["TM"] * p["BLOCK_N"]
                                           // p["TN"]}))),
    ("cuda_warptile", "a warp tile between the block tile and the thread tile",
     CudaKernel("05_warptile.cu", "gemm_warptile",
                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 16, "WARP_M": 64, "WARP_N": 32,
                 "TM": 8, "TN": 8, "THREADS": 256},
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (64, 128), "BLOCK_K": (8, 16),
                                 "WARP_M": (32, 64), "TM": (8,), "TN": (4, 8)}, _warp_tiles))),
    ("cuda_pipelined", "cp.async into multi-buffered shared memory: loads of tile k+1 overlap "
     "the math of tile k",
     CudaKernel("06_pipelined.cu", "gemm_pipelined",
                {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 16, "WARP_M": 64, "WARP_N": 32,
                 "TM": 8, "TN": 8, "STAGES": 2, "THREADS": 128}, sm80=True,
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (64, 128), "BLOCK_K": (8, 16),
                                 "WARP_M": (32, 64), "TM": (8,), "TN": (8,), "STAGES": (2, 3)},
                                _warp_tiles))),
    ("cuda_wmma", "tensor cores through WMMA 16x16x16 fragments, fp32 accumulate",
     CudaKernel("07_wmma.cu", "gemm_wmma",
                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "WARPS_M": 2, "THREADS": 256},
                dtypes=(torch.float16, torch.bfloat16), sm80=True,
                space=CudaSpace({"BLOCK_M": (128, 256), "BLOCK_N": (128,), "BLOCK_K": (16, 32),
                                 "WARPS_M": (2, 4), "THREADS": (256,)}))),
    ("cuda_mma", "mma.sync m16n8k16 fed by ldmatrix from a swizzled 4-stage cp.async pipeline",
     CudaKernel("08_mma.cu", "gemm_mma",
                {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "WARPS_M": 2, "STAGES": 4,
                 "GROUP_M": 8, "THREADS": 256},
                dtypes=(torch.float16, torch.bfloat16), sm80=True,
                space=CudaSpace({"BLOCK_M": (128, 256), "BLOCK_N": (128, 256),
                                 "BLOCK_K": (32, 64), "WARPS_M": (2, 4), "STAGES": (3, 4),
                                 "GROUP_M": (8,), "THREADS": (256,)}))),
    ("cuda_wgmma", "Hopper wgmma from shared memory fed by TMA, a producer and two consumer "
     "warpgroups (sm_90a)",
     CudaKernel("09_wgmma.cu", "gemm_wgmma",
                {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "STAGES": 4, "GROUP_M": 8,
                 "THREADS": 384},
                dtypes=(torch.float16, torch.bfloat16), tma=True,
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (128, 256), "BLOCK_K": (64,),
                                 "STAGES": (3, 4, 5), "GROUP_M": (8, 16)},
                                _warpgroup_threads))),
    ("cuda_wgmma_persistent", "cuda_wgmma persistent: one CTA per SM loops over the tiles, "
     "D leaves through shared memory by TMA bulk copies while the next tile computes (sm_90a)",
     CudaKernel("10_wgmma_persistent.cu", "gemm_wgmma_persistent",
                {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "STAGES": 3, "GROUP_M": 8,
                 "STREAM_K": 0, "C_LEAD": 4, "THREADS": 384},
                dtypes=(torch.float16, torch.bfloat16), tma=True, persistent=True,
                epilogue_maps=True,
                # The staging tile shares the shared memory with the stages: with 4 stages of
                # 128 x 256 it holds half a tile row (EPILOGUE_N, derived in the .cu), which
                # a STREAM_K build refuses.
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (128, 256), "BLOCK_K": (64,),
                                 "STAGES": (2, 3, 4, 5), "GROUP_M": (8, 16),
                                 "STREAM_K": (0, 1), "C_LEAD": (0, 4, 8)},
                                _warpgroup_threads))),
    ("cuda_wgmma_cluster", "cuda_wgmma_persistent in 2-CTA clusters: each CTA loads half of the "
     "shared B tile and TMA multicast writes it into both (sm_90a)",
     CudaKernel("11_wgmma_cluster.cu", "gemm_wgmma_cluster",
                {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "STAGES": 3, "GROUP_M": 8,
                 "THREADS": 384, "CLUSTER_M": 2, "C_LEAD": 8},
                dtypes=(torch.float16, torch.bfloat16), tma=True, persistent=True,
                epilogue_maps=True,
                space=CudaSpace({"BLOCK_M": (64, 128), "BLOCK_N": (128, 256), "BLOCK_K": (64,),
                                 "STAGES": (2, 3, 4, 5), "GROUP_M": (8, 16), "CLUSTER_M": (2,),
                                 "C_LEAD": (0, 4, 8)},
                                _warpgroup_threads))),
    ("cuda_wgmma_pingpong", "cuda_wgmma_cluster with its two consumer warpgroups taking turns "
     "on 64-row tiles: one's epilogue runs during the other's mainloop (sm_90a)",
     CudaKernel("12_wgmma_pingpong.cu", "gemm_wgmma_pingpong",
                {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 64, "STAGES": 5, "GROUP_M": 8,
                 "THREADS": 384, "CLUSTER_M": 2},
                dtypes=(torch.float16, torch.bfloat16), tma=True, persistent=True,
                epilogue_maps=True,
                # Two consumer warpgroups whatever the tile; without a cluster (CLUSTER_M 1)
                # each CTA loads all of B. 64 x 256 tiles fit 5 stages at most.
                space=CudaSpace({"BLOCK_M": (64,), "BLOCK_N": (128, 256), "BLOCK_K": (64,),
                                 "STAGES": (3, 4, 5), "GROUP_M": (8, 16),
                                 "CLUSTER_M": (1, 2), "THREADS": (384,)}))),
)
# Each CUDA C rung's kernel with its default tile sizes, by backend name, in ladder order.
CUDA_KERNELS: dict[str, CudaKernel] = {name: kernel for name, _, kernel in _CUDA_RUNGS}


def _cuda_backend(name: str, summary: str, kernel: CudaKernel) -> Backend:
    last = [None]  # (the CudaKernel, its tuning note) of the latest call, for config()

    def bind(p: Problem, config: CudaKernel | None, note: str | None = None):
        ran = kernel if config is None else config
        return ran.bind(p, record=last, tag=(ran, note))

    def describe() -> str:
        if last[0] is None:
            return "not launched yet"
        ran, note = last[0]
        text = ran.description()
        return text if note is None else f"{text} ({note})"

    def search_space(dtype_name: str, device: torch.device) -> list[dict[str, int]]:
        return kernel.space.candidates()  # the same for every dtype and device

    return Backend(name, summary, bind, dtypes=kernel.dtypes, devices=("cuda",),
                   fused_epilogue=True, tf32=False, strided=False, differentiable=False,
                   max_dim=MAX_DIM,
                   unavailable=(sm90a_unavailable_reason if kernel.tma else
                                sm80_unavailable_reason if kernel.sm80 else
                                cuda_unavailable_reason),
                   config=describe, pin=lambda params: _pin_cuda(kernel, params),
                   search_space=None if kernel.space is None else search_space,
                   default_config=dict(kernel.params), any_address=True)


def _positive(config: dict, fields, switches=()) -> None:
    """Raise ValueError naming the first of ``fields`` in ``config`` that is not an int >= 1
    (a tile size of 0 would divide by zero in the grid), or >= 0 for those in ``switches``."""
    for field in fields:
        value, least = config[field], 0 if field in switches else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "non-negative" if least == 0 else "positive"
            raise ValueError(f"{field} is {value!r}, not a {kind} integer")


def _pin_cuda(kernel: CudaKernel, params: dict) -> CudaKernel:
    """``kernel`` with a tuned entry's macros: positive integers, but for the switches its
    space turns off with 0 (``STREAM_K``, ``C_LEAD``), which may be 0. A macro the entry
    lacks (one added to the rung after the entry was tuned) keeps the rung's default."""
    switches = [m for m, values in (kernel.space.macros if kernel.space else {}).items()
                if 0 in values]
    _positive(params, params, switches)
    return replace(kernel, params={**kernel.params, **params})


def _triton_backend() -> Backend:
    last = [None]  # the tuning note of the latest call, for config()

    def bind(p: Problem, config, note: str | None = None):
        return triton_fused.bind(p, config, record=last, tag=note)

    def describe() -> str:
        text = triton_fused.last_config()  # the config that ran and which kernel ran it
        return text if last[0] is None else f"{text} ({last[0]})"

    def pin(config: dict):
        import triton

        _positive(config, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps",
                           "num_stages"))
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
        bind, dtypes=triton_fused.DTYPES if present else (),
        devices=triton_fused.devices() if present else ("cuda",),
        fused_epilogue=True, tf32=True, strided=True, differentiable=False,
        max_offset=triton_fused.MAX_OFFSET if present else None,
        max_dim=triton_fused.MAX_DIM if present else None,
        unavailable=triton_fused.unavailable_reason if present else lambda: _TRITON_MISSING,
        config=describe if present else lambda: "", pin=pin if present else None,
        search_space=triton_fused.search_space if present else None)


def _runs_everywhere() -> None:
    return None


LADDER: tuple[Backend, ...] = (
    Backend("cublas", "cuBLAS via torch.mm/addmm (+C as beta=1), then an in-place ReLU",
            torch_backends.bind_cublas, torch_backends.DTYPES, ("cuda", "cpu"),
            fused_epilogue=False, tf32=True, strided=True, differentiable=True,
            unavailable=_runs_everywhere, config=lambda: "cuBLAS heuristics",
            any_address=True),
    Backend("cublaslt", "cuBLASLt with its fused epilogue (C as beta=1, or bias; ReLU) via "
            "nvmath-python", cublaslt.bind, cublaslt.DTYPES, ("cuda",),
            fused_epilogue=True, tf32=True, strided=True, differentiable=False,
            unavailable=cublaslt.unavailable_reason, config=cublaslt.describe,
            any_address=True),
    Backend("torch_compile", "torch.compile(mode='max-autotune-no-cudagraphs') of "
            "relu(a @ b + c): Inductor's fused Triton templates or cuBLAS",
            torch_compile.bind, torch_compile.DTYPES, ("cuda", "cpu"),
            fused_epilogue=None, tf32=True, strided=True, differentiable=False,
            unavailable=_runs_everywhere, config=torch_compile.describe,
            any_address=True),
    Backend("torch_unfused", "torch.relu(a @ b + c) as a user writes it: three kernels",
            torch_backends.bind_unfused, torch_backends.DTYPES, ("cuda", "cpu"),
            fused_epilogue=False, tf32=True, strided=True, differentiable=True,
            unavailable=_runs_everywhere, config=lambda: "cuBLAS + 2 elementwise",
            any_address=True),
    *(_cuda_backend(*rung) for rung in _CUDA_RUNGS),
    _triton_backend(),
)
BACKENDS: dict[str, Backend] = {b.name: b for b in LADDER}
# The backends whose bindings serve operands at any address (``Backend.any_address``).
ANY_ADDRESS = frozenset(b.name for b in LADDER if b.any_address)
