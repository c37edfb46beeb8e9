"""``gemmlab comm``: an nccl-tests-style sweep of the collectives, every result checked.

Modelled on NVIDIA/nccl-tests: one engine for every collective; each collective supplies
its element counts, expected result and bus-bandwidth factor. For each size, every rank
fills its input with fresh random integers in [-2, 2], drawn from a generator seeded by
(rank, operation, size), so the data differ at every size and every sum is exact in every
dtype, and every rank can regenerate every other rank's input to compute its expected
output. The operation runs once into a poisoned output and ``#wrong`` counts the elements
that differ from the expected values; then ``-w`` warm-up and ``-n`` timed iterations run
back to back (CUDA events on GPUs, ``MPI.Wtime`` on CPUs) and the time is the slowest rank's
mean: the call time, host included, as nccl-tests reports it. With ``-c N`` the output is
checked again after every N timed iterations, outside the timed stretches (nccl-tests' ``-c``).
A row with any wrong element is FAIL: its time and bandwidths are not reported.

With ``timing="graph"`` (nccl-tests' ``-G``) the ``-n`` calls are captured once into a CUDA
graph and the graph is replayed: the time is then the GPU's alone, without the host's launch
cost per call. The graph's output is poisoned, checked after its first replay and again after
the timed replays. Only stream-ordered communicators can be captured.

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

from backends.dtypes import name_of
from tp.comm.base import raw_stream
from tp.comm.nccl_backend import NCCL_SUM, nccl_code

from .timing import seconds_per_call


@dataclass(frozen=True)
class Collective:
    """What the engine needs to know of one collective (cf. nccl-tests' per-test files).

    ``counts(c, P)`` gives (input, output) element counts for a size of ``c`` elements;
    ``expected(inputs, P, r)`` rank r's correct output (int64) from ``inputs(q)``, rank q's
    input (int64); ``factor(P)`` the busbw factor; ``run(comm, x, out)`` one call.
    """

    counts: Callable[[int, int], tuple[int, int]]
    expected: Callable[[Callable[[int], torch.Tensor], int, int], torch.Tensor]
    factor: Callable[[int], float]
    run: Callable


def _sum(parts) -> torch.Tensor:
    total = None
    for part in parts:
        total = part.clone() if total is None else total.add_(part)
    return total


def _block(x: torch.Tensor, p: int, r: int) -> torch.Tensor:
    n = x.numel() // p
    return x[r * n:(r + 1) * n]


COLLECTIVES = {
    "all_reduce": Collective(lambda c, p: (c, c),
                             lambda inputs, p, r: _sum(inputs(q) for q in range(p)),
                             lambda p: 2 * (p - 1) / p,
                             lambda comm, x, out: comm.all_reduce(x, out=out)),
    "all_gather": Collective(lambda c, p: (c // p, c),
                             lambda inputs, p, r: torch.cat([inputs(q) for q in range(p)]),
                             lambda p: (p - 1) / p,
                             lambda comm, x, out: comm.all_gather(x, out=out)),
    "reduce_scatter": Collective(lambda c, p: (c, c // p),
                                 lambda inputs, p, r: _sum(_block(inputs(q), p, r)
                                                           for q in range(p)),
                                 lambda p: (p - 1) / p,
                                 lambda comm, x, out: comm.reduce_scatter(x, out=out)),
    "all_to_all": Collective(lambda c, p: (c, c),
                             lambda inputs, p, r: torch.cat([_block(inputs(q), p, r)
                                                             for q in range(p)]),
                             lambda p: (p - 1) / p,
                             lambda comm, x, out: comm.all_to_all(x, out=out)),
    "broadcast": Collective(lambda c, p: (c, c), lambda inputs, p, r: inputs(0),
                            lambda p: 1.0, lambda comm, x, out: comm.broadcast(out, 0)),
}
BLOCK_OPS = ("all_gather", "reduce_scatter", "all_to_all")  # sizes rounded to P blocks


def random_input(rank: int, op: str, nbytes: int, count: int, device: torch.device,
                 seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input for ``op`` at size ``nbytes``: ``count`` random integers in
    [-2, 2] (int64), the same on whichever rank regenerates them."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + rank * 10_007 + list(COLLECTIVES).index(op))
                          * 1_000_033 + nbytes)
    return torch.randint(-2, 3, (count,), generator=generator, device=device)


TIMINGS = ("eager", "graph")
GRAPH_REPLAYS = 5  # replays of the captured -n calls per timed row


class DirectNccl:
    """The baseline: ``cupy.cuda.nccl`` called directly, no gemmlab code in the loop."""

    name = "nccl_direct"
    stream_ordered = True
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

    def __init__(self, comm, device: torch.device):
        from tp.comm.nccl_backend import create_nccl_comm

        self.nccl = create_nccl_comm(comm, device)

    def all_reduce(self, x, out):
        self.nccl.allReduce(x.data_ptr(), out.data_ptr(), x.numel(), nccl_code(x.dtype),
                            NCCL_SUM, raw_stream())

    def all_gather(self, x, out):
        self.nccl.allGather(x.data_ptr(), out.data_ptr(), x.numel(), nccl_code(x.dtype),
                            raw_stream())

    def reduce_scatter(self, x, out):
        self.nccl.reduceScatter(x.data_ptr(), out.data_ptr(), out.numel(),
                                nccl_code(x.dtype), NCCL_SUM,
                                raw_stream())

    def broadcast(self, buf, root):
        self.nccl.broadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_code(buf.dtype),
                            root, raw_stream())

    def close(self):
        self.nccl.destroy()


def supports(comm, op: str, dtype: torch.dtype, timing: str = "eager") -> bool:
    """Whether ``comm`` can run ``op`` on ``dtype`` (native MPI cannot sum fp16/bf16; the
    direct NCCL baseline covers NCCL's own collectives only) under ``timing`` (a CUDA graph
    captures stream-ordered communicators only)."""
    if op not in getattr(comm, "ops", COLLECTIVES):
        return False
    if timing == "graph" and not comm.stream_ordered:
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
            world, iters: int, warmup: int, check_every: int = 0, seed: int = 0,
            timing: str = "eager") -> dict | None:
    """One row: check ``op`` once, then time it (re-checking after every ``check_every``
    timed iterations when > 0; with ``timing="graph"``, the captured calls as the module doc
    says). ``dtype``: a torch dtype of ``backends.dtypes.COMM``; the row's ``dtype`` is its
    name there (fp32, bf16, ...). None when the size holds no whole element per rank. A row
    with a wrong element has ``ok`` False and no time. Collective over ``world``: every rank
    calls it with the same arguments.

    Raises:
        ValueError: an unknown ``timing``, or ``"graph"`` on a device that is not CUDA.
    """
    if timing not in TIMINGS or (timing == "graph" and device.type != "cuda"):
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)} (graph on CUDA only); "
                         f"got {timing!r} on {device.type}")
    p, r = world.Get_size(), world.Get_rank()
    spec = COLLECTIVES[op]
    count = nbytes // dtype.itemsize
    if op in BLOCK_OPS:
        count -= count % p
    if count == 0:
        return None
    n_in, n_out = spec.counts(count, p)

    def inputs(q: int) -> torch.Tensor:
        return random_input(q, op, nbytes, n_in, device, seed)

    x = inputs(r).to(dtype)
    poison = -(2 * p + 3)  # outside every possible result: sums of P values in [-2, 2]
    out = torch.full((n_out,), poison, dtype=dtype, device=device)
    if op == "broadcast" and r == 0:
        out.copy_(x)
    expected = spec.expected(inputs, p, r).to(dtype)

    def call():
        spec.run(comm, x, out)

    def wrong() -> int:
        return world.allreduce(int((out != expected).sum()))  # mpi4py's default op: SUM

    call()
    bad = wrong()
    size = count * dtype.itemsize
    row = {"backend": comm.name, "call_check": getattr(comm, "check", None), "op": op,
           "dtype": name_of(dtype), "device": device.type, "ranks": p, "timing": timing,
           "bytes": size, "count": count, "iters": iters, "check_every": check_every,
           "time_us": None, "algbw": None, "busbw": None, "wrong": bad, "ok": False}
    if bad:
        return row
    for _ in range(warmup):
        call()
    if timing == "graph":
        seconds, bad = _graph_seconds(call, iters, out, poison, op != "broadcast" or r != 0,
                                      wrong, device, world)
        row["wrong"] = bad
        if not bad:
            _timed(row, seconds, size, spec.factor(p))
        return row
    stretch = check_every if check_every > 0 else iters
    seconds, done = 0.0, 0
    while done < iters:
        n = min(stretch, iters - done)
        seconds += seconds_per_call(call, n, device, world) * n
        done += n
        if check_every > 0:
            if op != "broadcast" or r != 0:  # the root's output is its broadcast input
                out.fill_(poison)
            call()  # the checked call is outside the timed stretch
            if (bad := wrong()):
                row["wrong"] = bad
                return row
    _timed(row, seconds / iters, size, spec.factor(p))
    return row


def _timed(row: dict, seconds: float, size: int, factor: float) -> None:
    """Fill a checked row's time and bandwidths from seconds per call."""
    algbw = size / seconds / 1e9
    row.update(time_us=seconds * 1e6, algbw=algbw, busbw=algbw * factor, ok=True)


def _graph_seconds(call, iters: int, out: torch.Tensor, poison: int, poisoned: bool, wrong,
                   device: torch.device, world) -> tuple[float, int]:
    """(seconds per call, wrong elements) of ``iters`` calls captured into one CUDA graph and
    replayed ``GRAPH_REPLAYS`` times; ``out`` (poisoned first when ``poisoned``) is checked
    by ``wrong()`` after the first replay and after the timed ones (0 seconds when wrong)."""
    from .timing import capture

    graph, _ = capture(lambda: [call() for _ in range(iters)])
    if poisoned:
        out.fill_(poison)
    graph.replay()
    if (bad := wrong()):
        return 0.0, bad
    seconds = seconds_per_call(graph.replay, GRAPH_REPLAYS, device, world) / iters
    return seconds, wrong()


def series(row: dict) -> str:
    """A row's line in the plot: its backend, whether its calls were checked when a run
    measured both, and CUDA-graph timing."""
    return (row["backend"] + (" (call check off)" if row.get("call_check") is False else "")
            + (" (graph)" if row.get("timing") == "graph" else ""))


def plot(rows: list[dict], path: Path) -> None:
    """busbw against size, one panel per collective, one line per backend (FAIL rows, which
    have no time, are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["ok"]]
    ops = list(dict.fromkeys(r["op"] for r in rows)) or ["no row passed its check"]
    names = list(dict.fromkeys(series(r) for r in rows))
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        ax.set_title(op, fontsize=10)
        for name in dict.fromkeys(series(r) for r in rows if r["op"] == op):
            sub = [r for r in rows if r["op"] == op and series(r) == name]
            ax.plot([r["bytes"] for r in sub], [r["busbw"] for r in sub], marker=".", label=name,
                    color=colors[name], linestyle=":" if name.endswith("(graph)") else
                    "--" if name.endswith("off)") else "-")
            first = sub[0]
            ax.set_title(f"{op}, {first['ranks']} ranks, {first['dtype']}, {first['device']}",
                         fontsize=10)
            ax.legend(fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
