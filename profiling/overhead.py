"""What gemmlab's NVTX ranges cost when no profiler is attached.

    python3 -m profiling.overhead [--size 4096] [--dtype fp16] [--out DIR]

Two measurements, same process:

1. one ``annotate`` push/pop on its own: the best of several ``timeit`` loops, in µs;
2. ``backends.gemm`` (cublas, ``size``³) called back to back, with its NVTX range opened
   (into NVTX's stand-in when no profiler is attached, where ``gemm()`` would skip it) and
   with the range skipped, taking turns (on first in even rounds, off first in odd ones) so
   clock drift hits both alike: mean wall time per call over ``--calls`` calls after a
   synchronize, in ms (on a GPU, the CPU runs ahead of the GPU, so this is the GEMM's time
   unless the range made the CPU the bottleneck).

The ratio (1) / (2) is the share of a call the range can cost at most; the difference of the
two timings in (2) is what it cost here, within the run-to-run noise printed beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import timeit
from pathlib import Path

import torch

from backends.dtypes import DTYPES, GEMM, name_of

from . import nvtx as gemmlab_nvtx


def range_cost_us(repeats: int = 7, number: int = 20000) -> float:
    """Best time of one push/pop of a gemmlab range, in µs."""
    def one():
        with gemmlab_nvtx.annotate("overhead probe"):
            pass
    return min(timeit.repeat(one, repeat=repeats, number=number)) / number * 1e6


@contextlib.contextmanager
def gemm_range(opened: bool):
    """Inside, ``gemm()`` opens its NVTX range on every call (``opened``: as when a profiler
    is attached, into whatever the domain is) or skips it (as when none is; the domain is
    then a stand-in that records nothing)."""
    saved = gemmlab_nvtx.domain, gemmlab_nvtx.NO_PROFILER
    if opened:
        gemmlab_nvtx.NO_PROFILER = None
    else:
        gemmlab_nvtx.domain = gemmlab_nvtx.NO_PROFILER = _Silent()
    try:
        yield
    finally:
        gemmlab_nvtx.domain, gemmlab_nvtx.NO_PROFILER = saved


class _Silent:
    """A domain handle that records nothing."""

    def get_event_attributes(self, **kwargs):
        return None

    def push_range(self, attributes):
        pass

    def pop_range(self):
        pass


def gemm_ms(a, b, calls: int) -> float:
    """Mean wall time per back-to-back ``backends.gemm`` call, in ms."""
    import backends

    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    backends.gemm(a, b, backend="cublas")
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        backends.gemm(a, b, backend="cublas")
    sync()
    return (time.perf_counter() - start) / calls * 1e3


def measure(size: int, dtype: torch.dtype, device: torch.device, calls: int,
            rounds: int) -> dict:
    """Both measurements; ``rounds`` pairs of GEMM timings, (on, off) in even rounds and
    (off, on) in odd ones, so that a drift in clock or temperature favours neither."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    timings = {True: [], False: []}
    for round_ in range(rounds):
        for opened in ((True, False) if round_ % 2 == 0 else (False, True)):
            with gemm_range(opened=opened):
                timings[opened].append(gemm_ms(a, b, calls))
    on, off = timings[True], timings[False]
    cost = range_cost_us()
    ms_on, ms_off = statistics.median(on), statistics.median(off)
    return {"size": size, "dtype": name_of(dtype), "device": str(device),
            "range_us": cost, "gemm_ms_with_ranges": ms_on, "gemm_ms_without_ranges": ms_off,
            "range_share_of_call": cost / (ms_off * 1e3),
            "measured_difference": (ms_on - ms_off) / ms_off,
            "noise": statistics.pstdev(off) / ms_off, "calls": calls, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m profiling.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=4096, help="M = N = K (default 4096)")
    parser.add_argument("--dtype", choices=[n for n in GEMM if not DTYPES[n].tf32],
                        default="fp16")
    parser.add_argument("--calls", type=int, default=200, help="GEMM calls per timing")
    parser.add_argument("--rounds", type=int, default=5, help="alternating on/off timings")
    parser.add_argument("--device", choices=("cpu", "cuda"))
    parser.add_argument("--out", help="directory for overhead.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype].torch
    result = measure(args.size, dtype, device, args.calls, args.rounds)
    print(f"NVTX range push/pop: {result['range_us']:.2f} µs; {args.size}³ {args.dtype} cublas "
          f"GEMM on {device}: {result['gemm_ms_with_ranges']:.4f} ms with ranges, "
          f"{result['gemm_ms_without_ranges']:.4f} ms without "
          f"(difference {result['measured_difference']:+.2%}, noise {result['noise']:.2%}); "
          f"one range = {result['range_share_of_call']:.3%} of a call")
    if args.out:
        path = Path(args.out) / "overhead.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
