"""triton_fused: D = act(A @ B + C) as one Triton kernel.

The kernel follows the structure of Triton's matrix-multiplication tutorial
(``python/tutorials/03-matrix-multiplication.py``): each program computes a
BLOCK_M x BLOCK_N tile of D, walking K in steps of BLOCK_K and accumulating in an fp32
register tile through ``tl.dot``; +C and ReLU are applied to that accumulator, so D is
stored once and no intermediate touches global memory. Programs are ordered in groups of
GROUP_M tile rows so that tiles running together share rows of A and columns of B in L2.

On a GPU the tile shape, ``num_warps`` and ``num_stages`` come from ``triton.autotune``
over ``CONFIGS_16BIT`` (fp16/bf16 and TF32) or ``CONFIGS_FP32`` (IEEE fp32), tuned once per
(M, N, K, dtype, precision). Under the Triton interpreter (``TRITON_INTERPRET=1``, CPU
tensors) nothing can be timed, so one small ``INTERPRETER_CONFIG`` is used.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

# Read once, as triton.jit does when it decorates the kernel below.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
# The interpreter does no bfloat16 arithmetic (Triton's debugging guide); its tl.dot
# multiplies the stored bit patterns (triton-lang/triton#11584). bf16 is GPU-only.
DTYPES = ((torch.float16, torch.float32) if INTERPRETED
          else (torch.float16, torch.bfloat16, torch.float32))
# Offsets are 32-bit: a tensor of 2**31 or more elements would overflow them.
MAX_NUMEL = 2**31 - 1


def _config(bm, bn, bk, warps, stages, group_m=8):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
                         num_warps=warps, num_stages=stages)


# Tensor-core paths (fp16, bf16, TF32): large tiles, deep software pipelines.
CONFIGS_16BIT = [
    _config(128, 256, 64, 8, 3),
    _config(256, 128, 64, 8, 3),
    _config(128, 128, 64, 8, 4),
    _config(128, 128, 64, 4, 4),
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
    _config(128, 128, 32, 4, 4),
    _config(64, 64, 64, 4, 5),
]
# IEEE fp32 runs on the FMA units: 4-byte operands, smaller K steps.
CONFIGS_FP32 = [
    _config(128, 128, 32, 8, 3),
    _config(128, 128, 16, 8, 4),
    _config(128, 64, 32, 4, 4),
    _config(64, 128, 32, 4, 4),
    _config(64, 64, 32, 4, 4),
]
INTERPRETER_CONFIG = _config(32, 32, 16, 4, 1, group_m=4)


# EVEN_K: K is a multiple of BLOCK_K, so the loads of A and B need no mask (as in the matmul
# templates of PyTorch's inductor); computed from the launch's arguments and meta-parameters.
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def fused_gemm_kernel(a_ptr, b_ptr, c_ptr, d_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, stride_dm, stride_dn,
                      HAS_C: tl.constexpr, RELU: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of D = act(A @ B + C); C's strides may be 0 (bias)."""
    # Grouped ordering: consecutive programs sweep GROUP_M tile rows column by column, so the
    # B columns they load are reused from L2 by the other rows of the group.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_m
    pid_n = (pid % pids_per_group) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows of A and columns of B past the edge wrap around (% M, % N) instead of being
    # masked: they only feed rows/columns of the tile that the final store masks out.
    a_ptrs = a_ptr + (offs_m[:, None] % M) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n[None, :] % N) * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_C:
        c = tl.load(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                    mask=mask, other=0.0)
        acc += c.to(tl.float32)
    if RELU:
        acc = tl.where(acc < 0.0, 0.0, acc)  # keeps NaN, like torch.relu
    tl.store(d_ptr + offs_m[:, None] * stride_dm + offs_n[None, :] * stride_dn,
             acc.to(d_ptr.dtype.element_ty), mask=mask)


def _prune(configs, named_args, **kwargs):
    """Keep the config list that matches the operand type (tensor cores or FMA units)."""
    ieee_fp32 = named_args["a_ptr"].dtype == torch.float32 and kwargs["INPUT_PRECISION"] == "ieee"
    wanted = CONFIGS_FP32 if ieee_fp32 else CONFIGS_16BIT
    return [c for c in configs if c in wanted]


tuned_kernel = triton.autotune(configs=CONFIGS_16BIT + CONFIGS_FP32,
                               key=["M", "N", "K", "INPUT_PRECISION"],
                               prune_configs_by={"early_config_prune": _prune})(fused_gemm_kernel)


@functools.cache
def unavailable_reason() -> str | None:
    """Why triton_fused cannot run here, or None when it can (asked once per process)."""
    if INTERPRETED or torch.cuda.is_available():
        return None
    return ("no CUDA GPU visible to torch; set TRITON_INTERPRET=1 before importing gemmlab "
            "to run it on CPU tensors under the Triton interpreter")


def devices() -> tuple[str, ...]:
    """Devices whose tensors the kernel takes: CPU only under the interpreter."""
    return ("cpu",) if INTERPRETED else ("cuda",)


def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, relu: bool,
        allow_tf32: bool, out: torch.Tensor, config: triton.Config | None = None) -> torch.Tensor:
    """Launch the fused kernel into ``out``; any strides, any M, N, K >= 1.

    ``config`` pins BLOCK_M/N/K, GROUP_M, num_warps and num_stages instead of autotuning
    (tests use it to cover several tile shapes under the interpreter).
    """
    m, k = a.shape
    n = b.shape[1]
    if c is None:
        c_arg, stride_cm, stride_cn = out, 0, 0  # never read: HAS_C is False
    elif c.dim() == 1:
        c_arg, stride_cm, stride_cn = c, 0, c.stride(0)
    else:
        c_arg, stride_cm, stride_cn = c, c.stride(0), c.stride(1)
    args = (a, b, c_arg, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            stride_cm, stride_cn, out.stride(0), out.stride(1))
    flags = {"HAS_C": c is not None, "RELU": relu,
             "INPUT_PRECISION": "tf32" if allow_tf32 else "ieee"}
    if config is None and INTERPRETED:
        config = INTERPRETER_CONFIG

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        if config is None:
            tuned_kernel[grid](*args, **flags)
        else:
            fused_gemm_kernel[grid](*args, **flags, **config.kwargs, num_warps=config.num_warps,
                                    num_stages=config.num_stages)
    return out


def last_config() -> str:
    """BLOCK_M/N/K, GROUP_M, num_warps and num_stages of the most recent autotuned launch."""
    config = INTERPRETER_CONFIG if INTERPRETED else getattr(tuned_kernel, "best_config", None)
    return "not launched yet" if config is None else str(config)
