"""triton_fused: D = act(A @ B + C) as one Triton kernel.

The kernel follows the structure of Triton's matrix-multiplication tutorial
(``python/tutorials/03-matrix-multiplication.py``): each program computes a
BLOCK_M x BLOCK_N tile of D, walking K in steps of BLOCK_K and accumulating in an fp32
register tile through ``tl.dot``; +C and ReLU are applied to that accumulator, so D is
stored once and no intermediate touches global memory. Programs are ordered in groups of
GROUP_M tile rows so that tiles running together share rows of A and columns of B in L2.

On a GPU the tile shape, ``num_warps`` and ``num_stages`` come from ``triton.autotune``
over ``CONFIGS_16BIT`` (fp16/bf16), ``CONFIGS_TF32`` or ``CONFIGS_FP32`` (IEEE fp32), tuned
once per (M, N, K, dtype, precision). Under the Triton interpreter (``TRITON_INTERPRET=1``, CPU
tensors) nothing can be timed, so one small ``INTERPRETER_CONFIG`` is used. ``gemmlab tune``
searches a grid that holds those lists (``search_space``) and stores its winners in the tuned
table, whose entry for a call's shape bucket is then pinned instead.

A persistent TMA variant, ``fused_gemm_persistent_kernel``, runs when a pinned config (the
tuned table's) sets ``PERSISTENT=1``. It follows Triton's persistent-matmul tutorial
(``python/tutorials/09-persistent-matmul.py``): min(#SMs, #tiles) programs each loop over
tiles in the same grouped order; A, B, C and D move through host-built
``TensorDescriptor``s (the Tensor Memory Accelerator of compute capability 9.0+), whose
out-of-bounds loads read zeros and whose stores are clipped, so no masks are needed; the
epilogue handles the accumulator in two BLOCK_M x BLOCK_N/2 halves. TMA needs 16-byte
aligned base addresses and row strides that are multiples of 16 bytes, last stride 1 (CUDA
driver API, ``cuTensorMapEncodeTiled``); a call that does not qualify (a 1-D bias, a
broadcast or transposed operand, rows of K or N elements that are not a multiple of 16
bytes, a GPU before compute capability 9.0) runs the pointer kernel above with the same
tiles, and ``last_config()`` says why.

TF32 needs B K-major. Hopper's TF32 ``wgmma`` reads both operands K-major from shared memory
(only 16-bit types may be transposed there: PTX ISA, ``wgmma.mma_async``). A row-major B is
N-major, so Triton fills its tiles with 4-byte ``cp.async`` copies that transpose as they go,
where a K-major B takes 16-byte ones (Triton 3.9's PTX of the 128x128x32 pointer kernel with 8
warps and 3 stages holds 48 4-byte and 12 16-byte copies; with B K-major, 24 16-byte ones:
bench/results/triton-ptx-copies/). On an H200 (Triton 3.6) at
4096^3 and 8192^3 that ran at 23-43% of cuBLASLt's TF32 GEMM, and at 58-88% with B K-major.
So TF32 calls with an N-major B first copy B K-major (``k_major``, a tiled transpose kernel)
and run the GEMM on the copy; the copy is part of the call and of its kernel time.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.tools.tensor_descriptor import TensorDescriptor

from .problem import Launch, Problem

# Read once, as triton.jit does when it decorates the kernel below.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
# The interpreter does no bfloat16 arithmetic (Triton's debugging guide); its tl.dot
# multiplies the stored bit patterns (triton-lang/triton#11584). bf16 is GPU-only.
DTYPES = ((torch.float16, torch.float32) if INTERPRETED
          else (torch.float16, torch.bfloat16, torch.float32))
# Offsets and tile indices are 32-bit: an element 2**31 or more elements past its tensor's
# start would wrap, and so would a row or column index of a tile past M or N (at most 255
# past, the largest tile) as M or N nears 2**31, letting the store's mask through.
MAX_OFFSET = 2**31 - 1
MAX_DIM = 2**31 - 1 - 256


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
# TF32: 4-byte operands on the tensor cores, so BLOCK_K 32 where 16-bit takes 64 (the same
# bytes per stage). Measured on an H200 at 4096^3 and 8192^3 with B K-major: 128x256x32 with
# 8 warps, 3 stages, ran at 87-88% of cuBLASLt's TF32 GEMM, 128x128x64 at 70%.
CONFIGS_TF32 = [
    _config(128, 256, 32, 8, 3),
    _config(256, 128, 32, 8, 3),
    _config(128, 128, 64, 8, 3),
    _config(128, 128, 32, 4, 4),
    _config(64, 64, 32, 4, 4),
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

# gemmlab tune's grid (``candidates``), a superset of the lists above. BLOCK_K depends on the
# operand type: 16-bit and TF32 operands feed the tensor cores in K steps of 32-64; IEEE fp32
# runs on the FMA units, with smaller steps.
SEARCH_SPACE = {"BLOCK_M": (64, 128, 256), "BLOCK_N": (64, 128, 256), "GROUP_M": (4, 8),
                "num_warps": (4, 8), "num_stages": (2, 3, 4, 5)}
SEARCH_BLOCK_K = {"fp32": (16, 32), "tf32": (32, 64), "fp16": (32, 64), "bf16": (32, 64)}
# PERSISTENT=1: the persistent TMA kernel (compute capability 9.0+); 0: the pointer kernel.
SEARCH_PERSISTENT = (0, 1)
# Under the interpreter times are CPU times of a Python simulation: a tiny space keeps a CPU
# run (and the tests) to seconds. It holds both kernels, so CPU runs cover both.
INTERPRETER_SEARCH_SPACE = {"BLOCK_M": (16, 32), "BLOCK_N": (16, 32), "BLOCK_K": (16,),
                            "GROUP_M": (4,), "num_warps": (4,), "num_stages": (1,),
                            "PERSISTENT": SEARCH_PERSISTENT}
# A thread can hold 255 registers; an fp32 accumulator of more than 128 per thread leaves too
# few for operands and addresses, and spills.
MAX_ACC_PER_THREAD = 128


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile ``tile_id`` in grouped order: consecutive tiles sweep GROUP_M
    tile rows column by column, so the B columns they load are reused from L2 by the other
    rows of the group."""
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // pids_per_group) * GROUP_M
    group_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % pids_per_group) % group_m
    pid_n = (tile_id % pids_per_group) // group_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, c, HAS_C: tl.constexpr, RELU: tl.constexpr):
    """act(acc + C) on the fp32 accumulator; ``c`` (a tile of C) is read only if HAS_C."""
    if HAS_C:
        acc += c.to(tl.float32)
    if RELU:
        acc = tl.where(acc < 0.0, 0.0, acc)  # keeps NaN, like torch.relu
    return acc


@triton.jit
def fused_gemm_kernel(a_ptr, b_ptr, c_ptr, d_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, stride_dm, stride_dn,
                      HAS_C: tl.constexpr, RELU: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of D = act(A @ B + C); C's strides may be 0 (bias).

    EVEN_K: K is a multiple of BLOCK_K, so the loads of A and B need no mask (as in the
    matmul templates of PyTorch's Inductor); the launch computes it (``_even_k``).
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N),
                                GROUP_M)

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
    c = None
    if HAS_C:
        c = tl.load(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                    mask=mask, other=0.0)
    acc = _epilogue(acc, c, HAS_C, RELU)
    tl.store(d_ptr + offs_m[:, None] * stride_dm + offs_n[None, :] * stride_dn,
             acc.to(d_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fused_gemm_persistent_kernel(a_desc, b_desc, c_desc, d_desc, M, N, K,
                                 HAS_C: tl.constexpr, RELU: tl.constexpr,
                                 INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    """D = act(A @ B + C) with TMA descriptors; program p computes tiles p, p + NUM_SMS, ...

    The grid is min(NUM_SMS, #tiles) programs. The descriptors of C and D have blocks of
    BLOCK_M x BLOCK_N/2; C's is never read when HAS_C is False.
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    start = tl.program_id(0)
    # The epilogue takes its tile from a counter of its own (as tutorial 09 does): it does not
    # depend on the loop's, so the flattened loop can issue the next tile's loads early.
    tile_c = start - NUM_SMS
    # flatten: the tile and K loops become one, software-pipelined across tile boundaries.
    for tile_id in tl.range(start, num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_tiles):
            # Out of bounds (the K tail, the M and N edges) TMA reads zeros: no masks.
            a = a_desc.load([off_m, k * BLOCK_K])
            b = b_desc.load([k * BLOCK_K, off_n])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

        tile_c += NUM_SMS
        pid_m, pid_n = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        # Epilogue subtiling (tutorial 09): in two BLOCK_N/2 halves, C and D need half the
        # shared memory to stage them, memory the operand pipeline can use instead.
        acc = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(acc)
        c0 = None
        c1 = None
        if HAS_C:
            c0 = c_desc.load([off_m, off_n])
            c1 = c_desc.load([off_m, off_n + BLOCK_N // 2])
        # Stores past M or N are clipped by the TMA unit.
        d_desc.store([off_m, off_n], _epilogue(acc0, c0, HAS_C, RELU).to(d_desc.dtype))
        d_desc.store([off_m, off_n + BLOCK_N // 2],
                     _epilogue(acc1, c1, HAS_C, RELU).to(d_desc.dtype))


@triton.jit
def transpose_kernel(src_ptr, dst_ptr, R, C, stride_r, stride_c, BLOCK: tl.constexpr):
    """dst (C, R), contiguous, = src^T for src (R, C) of any strides: one BLOCK x BLOCK tile
    per program, read along src's rows and written along dst's (Triton moves the tile
    between the two layouts through shared memory)."""
    offs_r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    tile = tl.load(src_ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c, mask=mask)
    tl.store(dst_ptr + offs_c[None, :] * R + offs_r[:, None], tile, mask=mask)


TRANSPOSE_BLOCK = 64


def k_major(b: torch.Tensor) -> torch.Tensor:
    """B (K, N) as a new K-major (column-major) copy, strides (1, K): a TF32 ``tl.dot`` on an
    H200 reads it with 16-byte copies where an N-major B takes 4-byte ones (the TF32 wgmma
    wants both operands K-major; see the module doc)."""
    k, n = b.shape
    dst = torch.empty((n, k), dtype=b.dtype, device=b.device)
    grid = (triton.cdiv(k, TRANSPOSE_BLOCK), triton.cdiv(n, TRANSPOSE_BLOCK))
    transpose_kernel[grid](b, dst, k, n, b.stride(0), b.stride(1), BLOCK=TRANSPOSE_BLOCK)
    return dst.t()


def _prune(configs, named_args, **kwargs):
    """Keep the config list that matches the operand type: 16-bit or TF32 on the tensor
    cores, IEEE fp32 on the FMA units."""
    precision = {**named_args, **kwargs}["INPUT_PRECISION"]  # passed by position or name
    if named_args["a_ptr"].dtype != torch.float32:
        wanted = CONFIGS_16BIT
    else:
        wanted = CONFIGS_FP32 if precision == "ieee" else CONFIGS_TF32
    # by identity: a config of one list may equal one of another (Config compares values)
    return [c for c in configs if any(c is w for w in wanted)]


def _even_k(args: dict) -> bool:
    return args["K"] % args["BLOCK_K"] == 0


def autotuned(configs: list[triton.Config]) -> triton.runtime.Autotuner:
    """``fused_gemm_kernel`` under ``triton.autotune`` over ``configs``, pruned to the
    operand type's list by ``_prune``, keyed by M, N, K and the input precision; EVEN_K is
    computed per config."""
    return triton.autotune(configs=configs, key=["M", "N", "K", "INPUT_PRECISION"],
                           prune_configs_by={"early_config_prune": _prune})(
        triton.heuristics({"EVEN_K": _even_k})(fused_gemm_kernel))


tuned_kernel = autotuned(CONFIGS_16BIT + CONFIGS_FP32 + CONFIGS_TF32)


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


# Programs of the persistent kernel under the interpreter: few, so each loops over several
# tiles (on a GPU: one per SM).
INTERPRETER_PROGRAMS = 3
# TMA (the Tensor Memory Accelerator) arrived with Hopper.
TMA_MIN_CAPABILITY = 9
# [config, which kernel ran it] of the latest launch, for last_config(); no kernel: none yet.
_last: list = [[None, ""]]


@functools.cache
def _num_sms(device: torch.device) -> int:
    """The persistent kernel's program count when there are enough tiles."""
    if INTERPRETED:
        return INTERPRETER_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _tma_problem(name: str, t: torch.Tensor) -> str | None:
    """Why a TMA descriptor cannot address ``t`` (2-D, last stride 1, a row stride that is a
    positive multiple of 16 bytes, a 16-byte aligned base), or None when it can."""
    if t.dim() != 2:
        return f"{name} is {t.dim()}-D"
    if t.stride(1) != 1:
        return f"{name} has last stride {t.stride(1)}, not 1"
    row_bytes = t.stride(0) * t.element_size()
    if row_bytes == 0:
        return f"{name} is broadcast over rows (row stride 0)"
    if row_bytes % 16:
        return f"{name}'s row stride is {row_bytes} bytes, not a multiple of 16"
    if t.data_ptr() % 16:
        return f"{name}'s data is not 16-byte aligned"
    return None


def persistent_unavailable_reason(device: torch.device) -> str | None:
    """Why the persistent TMA kernel cannot run on ``device`` at all (the GPU predates TMA),
    or None when it can (always under the interpreter)."""
    if not INTERPRETED:
        if device.type != "cuda":
            return f"it runs on CUDA GPUs; got {device}"
        major, minor = _capability(device)
        if major < TMA_MIN_CAPABILITY:
            return f"compute capability {major}.{minor} has no TMA (9.0 or newer has)"
    return None


def candidates(dtype_name: str, smem_bytes: int | None = None, interpreted: bool = False,
               persistent: bool = False) -> list[dict[str, int]]:
    """The tuner's configurations for ``dtype_name`` (fp32, tf32, fp16, bf16), as tuned-table
    configs (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, and PERSISTENT where
    searched).

    On a GPU (``interpreted=False``) ``SEARCH_SPACE`` with ``SEARCH_BLOCK_K``, and with
    PERSISTENT 0 and 1 (``SEARCH_PERSISTENT``) when ``persistent`` (the GPU runs the
    persistent TMA kernel) and the dtype is not TF32 (TF32 runs on B K-major, which the TMA
    kernel's descriptors do not take: PERSISTENT 1 would time the pointer kernel again),
    less the configs that cannot fit: more shared memory than
    ``smem_bytes`` bytes (when given), that is the operand tiles of all stages,
    (BLOCK_M + BLOCK_N) * BLOCK_K * bytes * num_stages, plus with PERSISTENT=1 the
    epilogue's C and D buffers, 2 * BLOCK_M * BLOCK_N/2 * bytes; or more than
    ``MAX_ACC_PER_THREAD`` accumulator elements per thread. Under the Triton interpreter,
    ``INTERPRETER_SEARCH_SPACE`` (PERSISTENT 0 and 1 whatever ``persistent`` says).
    """
    if interpreted:
        space = INTERPRETER_SEARCH_SPACE
    else:
        space = {**SEARCH_SPACE, "BLOCK_K": SEARCH_BLOCK_K[dtype_name]}
        if persistent and dtype_name != "tf32":
            space["PERSISTENT"] = SEARCH_PERSISTENT
    size = 2 if dtype_name in ("fp16", "bf16") else 4  # TF32 operands are stored as fp32
    configs = [dict(zip(space, values)) for values in itertools.product(*space.values())]
    if interpreted:
        return configs

    def smem(c: dict[str, int]) -> int:
        operands = (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * size * c["num_stages"]
        epilogue = 2 * c["BLOCK_M"] * (c["BLOCK_N"] // 2) * size if c.get("PERSISTENT") else 0
        return operands + epilogue

    return [c for c in configs
            if (smem_bytes is None or smem(c) <= smem_bytes)
            and c["BLOCK_M"] * c["BLOCK_N"] <= MAX_ACC_PER_THREAD * 32 * c["num_warps"]]


def search_space(dtype_name: str, device: torch.device) -> list[dict[str, int]]:
    """``candidates`` for ``dtype_name`` on ``device``: the interpreter's space on the CPU;
    on a GPU, pruned to its opt-in shared memory per block (227 KiB on an H200), with the
    persistent TMA kernel where it runs (compute capability 9.0 or newer)."""
    if device.type == "cpu":
        return candidates(dtype_name, interpreted=True)
    props = torch.cuda.get_device_properties(device)
    smem = getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block)
    return candidates(dtype_name, smem,
                      persistent=persistent_unavailable_reason(device) is None)


def _persistent_problem(a, b, c, out, tiles: dict) -> str | None:
    """Why the persistent TMA kernel cannot run this call with tiles ``tiles``, or None."""
    if (why := persistent_unavailable_reason(a.device)) is not None:
        return why
    for name, t in (("a", a), ("b", b), ("c", c), ("out", out)):
        problem = None if t is None else _tma_problem(name, t)
        if problem:
            return problem
    # The innermost block dimension of a TMA copy must span a multiple of 16 bytes too.
    row_bytes = min(tiles["BLOCK_K"], tiles["BLOCK_N"] // 2) * a.element_size()
    if row_bytes % 16:
        return f"a block row of BLOCK_K or BLOCK_N/2 is {row_bytes} bytes, not a multiple of 16"
    return None


class _Descriptor(TensorDescriptor):
    """A host TMA descriptor built without ``TensorDescriptor``'s checks: a bound launch
    checks its signature once (the first launch goes through Triton's own path), after which
    only the base pointer changes. The launcher reads base, shape, strides and padding."""

    def __post_init__(self):
        pass


def _persistent_args(p: Problem, tiles: dict, flags: dict, num_sms: int, a, b, c, out,
                     descriptor=None) -> tuple:
    """The persistent kernel's arguments, in its parameter order (``descriptor``: the
    descriptor class, checked ``TensorDescriptor`` by default)."""
    make = TensorDescriptor if descriptor is None else descriptor
    bm, bn, bk = tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["BLOCK_K"]
    # Host-side descriptors travel as kernel parameters: no triton.set_allocator needed (only
    # descriptors made on the device, tl.make_tensor_descriptor, need global scratch).
    d_desc = make(out, [p.m, p.n], [out.stride(0), 1], [bm, bn // 2])
    c_desc = d_desc if c is None else make(c, [p.m, p.n], [c.stride(0), 1], [bm, bn // 2])
    return (make(a, [p.m, p.k], [a.stride(0), 1], [bm, bk]),
            make(b, [p.k, p.n], [b.stride(0), 1], [bk, bn]), c_desc, d_desc, p.m, p.n, p.k,
            flags["HAS_C"], flags["RELU"], flags["INPUT_PRECISION"], bm, bn, bk,
            tiles["GROUP_M"], num_sms)


def _pointer_args(p: Problem, tiles: dict, flags: dict, a, b, c, out) -> tuple:
    """The pointer kernel's arguments, in its parameter order, up to the tiles."""
    if c is None:
        c_arg, stride_cm, stride_cn = out, 0, 0  # never read: HAS_C is False
    elif c.dim() == 1:
        c_arg, stride_cm, stride_cn = c, 0, c.stride(0)
    else:
        c_arg, stride_cm, stride_cn = c, c.stride(0), c.stride(1)
    return (a, b, c_arg, out, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), stride_cm, stride_cn, out.stride(0), out.stride(1),
            flags["HAS_C"], flags["RELU"], flags["INPUT_PRECISION"])


def bind(p: Problem, config: triton.Config | None = None, record: list | None = None,
         tag: object = None) -> Launch:
    """The launch of the fused kernel for Problem ``p``: any strides, any M, N, K >= 1.

    ``config`` pins BLOCK_M/N/K, GROUP_M, num_warps and num_stages instead of autotuning (the
    tuned table's entry; tests use it to cover several tile shapes under the interpreter).
    With a truthy ``PERSISTENT`` among its kwargs the persistent TMA kernel runs if the call
    qualifies: a GPU of compute capability 9.0 or newer (or the interpreter); A, B, ``out``
    and C (None or 2-D) TMA-addressable (last stride 1, row stride a multiple of 16 bytes,
    16-byte aligned). Otherwise the pointer kernel runs with the same tiles; ``last_config()``
    says which ran, and why it fell back.

    Each launch stores ``tag`` in ``record[0]`` when ``record`` is given (the registry's
    tuning note, for ``Backend.config()``).

    The launch is for the signature of its first call (strides and the 16-byte alignment of
    each pointer, which Triton specializes on; ``gemm()`` binds once per signature). The first
    call goes through Triton's JIT (and autotuner); on a GPU it keeps the compiled kernel
    and every later call launches it directly (``CompiledKernel.run``), skipping the
    autotuner's and the JIT's argument binding, which cost most of a launch's host time; the
    pointer kernel's four addresses go as integers, which Triton's launcher takes as they are.
    """
    flags = {"HAS_C": p.c is not None, "RELU": p.relu,
             "INPUT_PRECISION": "tf32" if p.allow_tf32 else "ieee"}
    if config is None and INTERPRETED:
        config = INTERPRETER_CONFIG
    tiles = {} if config is None else dict(config.kwargs)
    persistent = bool(tiles.pop("PERSISTENT", 0))
    device = p.device.index if p.device.index is not None else (
        torch.cuda.current_device() if p.device.type == "cuda" else None)
    compiled: list = []  # [kernel, grid, make_args] once the first launch has compiled
    described: list = [config, ""]
    # TF32 with an N-major B (N contiguous, as a row-major B is): B goes through a K-major
    # copy first (``k_major``), decided at the first call (a launch is for one signature).
    transposed: list = []

    def first(a, b, c, out):
        """Launch through Triton's JIT, then keep what later launches need."""
        problem = None
        if persistent:
            problem = ("TF32 runs on a K-major copy of B, which the TMA kernel does not take"
                       if transposed[0] else _persistent_problem(a, b, c, out, tiles))
        if persistent and problem is None:
            num_sms = _num_sms(a.device)
            grid = (min(num_sms, triton.cdiv(p.m, tiles["BLOCK_M"]) *
                        triton.cdiv(p.n, tiles["BLOCK_N"])), 1, 1)
            args = _persistent_args(p, tiles, flags, num_sms, a, b, c, out)
            kernel = fused_gemm_persistent_kernel.run(
                *args, grid=grid, warmup=False, num_warps=config.num_warps,
                num_stages=config.num_stages)
            described[1] = "persistent TMA kernel"

            def make_args(a, b, c, out):
                return _persistent_args(p, tiles, flags, num_sms, a, b, c, out, _Descriptor)
        else:
            args = _pointer_args(p, tiles, flags, a, b, c, out)
            chosen = config
            if chosen is None:
                tuned_kernel[lambda meta: (triton.cdiv(p.m, meta["BLOCK_M"]) *
                                           triton.cdiv(p.n, meta["BLOCK_N"]),)](*args)
                chosen = tuned_kernel.best_config
                described[0] = chosen
            bm, bn, bk = (chosen.kwargs[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
            tail = (bm, bn, bk, chosen.kwargs["GROUP_M"], p.k % bk == 0)  # ..., EVEN_K
            grid = (triton.cdiv(p.m, bm) * triton.cdiv(p.n, bn), 1, 1)
            # After the autotuner's launch this only fetches its compiled kernel.
            kernel = fused_gemm_kernel.run(*args, *tail, grid=grid, warmup=config is None,
                                           num_warps=chosen.num_warps,
                                           num_stages=chosen.num_stages)
            described[1] = "pointer kernel" if problem is None else (
                f"pointer kernel (PERSISTENT fell back: {problem})")

            # Everything after the four pointers is fixed by the binding's signature. The
            # pointers go as integers: given a tensor, Triton's launcher calls its data_ptr()
            # and asks the driver whether the address is device memory (cuPointerGetAttribute)
            # per pointer per launch, which gemm()'s checks made once, at binding.
            fixed = (*args[4:], *tail)

            def make_args(a, b, c, out):
                return (a.data_ptr(), b.data_ptr(), (out if c is None else c).data_ptr(),
                        out.data_ptr(), *fixed)
        if transposed[0]:
            described[1] += "; B copied K-major first (TF32)"
        if not INTERPRETED:
            # Load the module now, before another thread can launch the kernel: the first
            # read of CompiledKernel.run sets the launcher before it loads the module, so a
            # thread reading ``run`` meanwhile would launch with ``function`` still None.
            kernel.run
            compiled[:] = kernel, grid, make_args

    # Triton's own way to ask (its launch asks the same); never asked under the interpreter.
    current_device = (triton.runtime.driver.active.get_current_device
                      if p.device.type == "cuda" else None)

    template, empty_like = p.d_template, torch.empty_like
    raw_stream = torch._C._cuda_getCurrentRawStream if p.device.type == "cuda" else None

    def launch(a, b, c, out):
        if record is not None:
            record[0] = tag
        if out is None:
            out = empty_like(template)
        if not transposed:
            transposed.append(p.allow_tf32 and b.stride(1) == 1 and b.stride(0) != 1)
        if transposed[0]:
            b = k_major(b)
        if not compiled or current_device() != device:
            with torch.cuda.device(device) if a.is_cuda else contextlib.nullcontext():
                first(a, b, c, out)
        else:
            kernel, grid, make_args = compiled
            enter = knobs.runtime.launch_enter_hook
            args = make_args(a, b, c, out)
            stream = raw_stream(device)
            kernel.run(grid[0], grid[1], grid[2], stream, kernel.function,
                       kernel.packed_metadata,
                       None if enter is None else kernel.launch_metadata(grid, stream, *args),
                       enter, knobs.runtime.launch_exit_hook, *args)
        _last[0] = described
        return out

    launch.compiled = compiled  # for gemmlab bench --overhead: Triton's own launch of it
    return launch


def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, relu: bool,
        allow_tf32: bool, out: torch.Tensor, config: triton.Config | None = None) -> torch.Tensor:
    """Bind (``bind``) and launch once: D = act(A @ B + C) into ``out``. For repeated calls
    of one signature, keep the launch ``bind`` returns (as ``gemm()`` does)."""
    return bind(Problem.of(a, b, c, relu, allow_tf32), config)(a, b, c, out)


def last_config() -> str:
    """The configuration of the most recent launch (the pinned one, or the autotuner's pick)
    and the kernel that ran it: the pointer kernel, the persistent TMA kernel, or the pointer
    kernel because the call did not qualify for the persistent one it asked for, and why."""
    config, kernel = _last[0]
    if not kernel:
        return "not launched yet"
    return f"{config}; {kernel}"
