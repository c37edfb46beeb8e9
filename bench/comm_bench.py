"""``gemmlab comm``: an nccl-tests-style sweep of the collectives, every result checked.

Modelled on NVIDIA/nccl-tests: one engine for every collective; each collective supplies
its element counts, expected result and bus-bandwidth factor. For each size, every rank
fills its input with small integers derived from (rank, element), so every sum is exact in
every dtype; the operation runs once and ``#wrong`` counts the elements that differ from the
expected values; then ``-w`` warm-up and ``-n`` timed iterations run back to back (CUDA
events on GPUs, ``MPI.Wtime`` on CPUs) and the time is the slowest rank's mean.

Bandwidths follow nccl-tests' PERFORMANCE.md: size S is the larger of the input and output
buffers in bytes, algbw = S / t, busbw = algbw * factor, with factor 2(P-1)/P for
all_reduce, (P-1)/P for all_gather, reduce_scatter and all_to_all, and 1 for broadcast.
GB/s are 1e9 bytes per second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tp.comm.nccl_backend import NCCL_DTYPES, NCCL_SUM

from .timing import seconds_per_call

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}


def _value(rank: int, index: torch.Tensor, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input at ``index``: an integer in [-2, 2] (sums stay exact)."""
    return (index * 7 + rank * 13 + salt) % 5 - 2


@dataclass(frozen=True)
class Collective:
    """What the engine needs to know of one collective (cf. nccl-tests' per-test files).

    ``counts(c, P)`` gives (input, output) element counts for a size of ``c`` elements;
    ``expected(c, P, r, device)`` rank r's correct output (int64); ``factor(P)`` the busbw
    factor; ``run(comm, x, out)`` one call.
    """

    counts: Callable[[int, int], tuple[int, int]]
    expected: Callable[[int, int, int, torch.device], torch.Tensor]
    factor: Callable[[int], float]
    run: Callable


def _ar_expected(c, p, r, device):
    idx = torch.arange(c, device=device)
    return sum(_value(q, idx) for q in range(p))


def _ag_expected(c, p, r, device):
    idx = torch.arange(c // p, device=device)
    return torch.cat([_value(q, idx) for q in range(p)])


def _rs_expected(c, p, r, device):
    idx = r * (c // p) + torch.arange(c // p, device=device)
    return sum(_value(q, idx) for q in range(p))


def _a2a_expected(c, p, r, device):
    idx = r * (c // p) + torch.arange(c // p, device=device)
    return torch.cat([_value(q, idx) for q in range(p)])


def _bcast_expected(c, p, r, device):
    return _value(0, torch.arange(c, device=device))


COLLECTIVES = {
    "all_reduce": Collective(lambda c, p: (c, c), _ar_expected, lambda p: 2 * (p - 1) / p,
                             lambda comm, x, out: comm.all_reduce(x, out=out)),
    "all_gather": Collective(lambda c, p: (c // p, c), _ag_expected, lambda p: (p - 1) / p,
                             lambda comm, x, out: comm.all_gather(x, out=out)),
    "reduce_scatter": Collective(lambda c, p: (c, c // p), _rs_expected, lambda p: (p - 1) / p,
                                 lambda comm, x, out: comm.reduce_scatter(x, out=out)),
    "all_to_all": Collective(lambda c, p: (c, c), _a2a_expected, lambda p: (p - 1) / p,
                             lambda comm, x, out: comm.all_to_all(x, out=out)),
    "broadcast": Collective(lambda c, p: (c, c), _bcast_expected, lambda p: 1.0,
                            lambda comm, x, out: comm.broadcast(out, 0)),
}
BLOCK_OPS = ("all_gather", "reduce_scatter", "all_to_all")  # sizes rounded to P blocks


class DirectNccl:
    """The baseline: ``cupy.cuda.nccl`` called directly, no gemmlab code in the loop."""

    name = "nccl_direct"
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

    def __init__(self, comm, device: torch.device):
        from tp.comm.nccl_backend import create_nccl_comm

        self.nccl = create_nccl_comm(comm, device)

    def all_reduce(self, x, out):
        self.nccl.allReduce(x.data_ptr(), out.data_ptr(), x.numel(), NCCL_DTYPES[x.dtype],
                            NCCL_SUM, torch.cuda.current_stream().cuda_stream)

    def all_gather(self, x, out):
        self.nccl.allGather(x.data_ptr(), out.data_ptr(), x.numel(), NCCL_DTYPES[x.dtype],
                            torch.cuda.current_stream().cuda_stream)

    def reduce_scatter(self, x, out):
        self.nccl.reduceScatter(x.data_ptr(), out.data_ptr(), out.numel(),
                                NCCL_DTYPES[x.dtype], NCCL_SUM,
                                torch.cuda.current_stream().cuda_stream)

    def broadcast(self, buf, root):
        self.nccl.broadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), NCCL_DTYPES[buf.dtype],
                            root, torch.cuda.current_stream().cuda_stream)

    def close(self):
        self.nccl.destroy()


def supports(comm, op: str, dtype: torch.dtype) -> bool:
    """Whether ``comm`` can run ``op`` on ``dtype`` (native MPI cannot sum fp16/bf16; the
    direct NCCL baseline covers NCCL's own collectives only)."""
    if op not in getattr(comm, "ops", COLLECTIVES):
        return False
    sums = op in ("all_reduce", "reduce_scatter")
    reduce_dtypes = getattr(comm, "reduce_dtypes", None)
    return not (sums and reduce_dtypes is not None and dtype not in reduce_dtypes)


def parse_bytes(text: str) -> int:
    """``"64"``, ``"1K"``, ``"16M"``, ``"1G"`` -> bytes (binary multiples, as nccl-tests).

    Raises:
        ValueError: not a non-negative number with an optional K/M/G suffix.
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B")
    scale = units.get(t[-1:], 1)
    try:
        value = int(t[:-1] if t[-1:] in units else t) * scale
    except ValueError:
        raise ValueError(f"size {text!r} is not a byte count like 64, 1K, 16M or 1G") from None
    if value < 0:
        raise ValueError(f"size {text!r} is negative")
    return value


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes * factor, ... up to max_bytes (nccl-tests' -b/-e/-f)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError("need 1 <= min bytes <= max bytes and a step factor >= 2")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def measure(comm, op: str, nbytes: int, dtype: torch.dtype, device: torch.device,
            world, iters: int, warmup: int) -> dict | None:
    """One row: check ``op`` once, then time it. None when the size holds no whole element
    per rank. Collective over ``world``: every rank calls it with the same arguments."""
    from mpi4py import MPI

    p, r = world.Get_size(), world.Get_rank()
    spec = COLLECTIVES[op]
    count = nbytes // dtype.itemsize
    if op in BLOCK_OPS:
        count -= count % p
    if count == 0:
        return None
    n_in, n_out = spec.counts(count, p)
    x = _value(r, torch.arange(n_in, device=device)).to(dtype)
    poison = -(2 * p + 3)  # outside every possible result: sums of P values in [-2, 2]
    out = torch.full((n_out,), poison, dtype=dtype, device=device)
    if op == "broadcast" and r == 0:
        out.copy_(x)

    def call():
        spec.run(comm, x, out)

    call()
    expected = spec.expected(count, p, r, device).to(dtype)
    wrong = world.allreduce(int((out != expected).sum()), op=MPI.SUM)
    del expected
    for _ in range(warmup):
        call()
    seconds = seconds_per_call(call, iters, device, world)
    size = count * dtype.itemsize
    algbw = size / seconds / 1e9
    return {"backend": comm.name, "op": op, "dtype": str(dtype).replace("torch.", ""),
            "device": device.type, "ranks": p, "bytes": size, "count": count,
            "time_us": seconds * 1e6, "algbw": algbw, "busbw": algbw * spec.factor(p),
            "wrong": wrong}


def plot(rows: list[dict], path: Path) -> None:
    """busbw against size, one panel per collective, one line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows))
    colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r["backend"] for r in rows))}
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for name in dict.fromkeys(r["backend"] for r in rows if r["op"] == op):
            sub = [r for r in rows if r["op"] == op and r["backend"] == name]
            ax.plot([r["bytes"] for r in sub], [r["busbw"] for r in sub], marker=".", label=name,
                    color=colors[name])
        first = next(r for r in rows if r["op"] == op)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{op}, {first['ranks']} ranks, {first['dtype']}, {first['device']}",
                     fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
