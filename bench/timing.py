"""Timing helpers. ``time_ms``: the median time of one call on one device (CUDA events
through ``triton.testing.do_bench`` with warm-up and the L2 flushed before every repeat;
``torch.utils.benchmark`` on the CPU). ``seconds_per_call``: the mean over back-to-back calls
on every rank of an MPI job, as nccl-tests times collectives."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.utils import benchmark


def time_ms(fn: Callable[[], object], device: torch.device, *, warmup_ms: float = 25,
            rep_ms: float = 100, min_reps: int = 10) -> float:
    """Median time of one ``fn()`` call in milliseconds.

    On CUDA, ``do_bench`` repeats for about ``rep_ms``; a kernel slower than
    ``rep_ms / min_reps`` is repeated again until at least ``min_reps`` samples exist, so
    the median is never of one or two runs. On the CPU, ``Timer.blocked_autorange`` runs
    for at least ``rep_ms``.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        if len(times) < min_reps:
            more = (min_reps - len(times)) * statistics.median(times)
            times += do_bench(fn, warmup=0, rep=more, return_mode="all")
        return statistics.median(times)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=rep_ms / 1e3).median * 1e3


def seconds_per_call(fn: Callable[[], object], iters: int, device: torch.device, world) -> float:
    """Mean seconds per ``fn()`` over ``iters`` back-to-back calls, all ranks of mpi4py
    ``world`` starting together (a barrier), reported as the slowest rank's time (the job
    runs at the pace of its slowest rank). CUDA events time GPU work; ``MPI.Wtime`` the CPU.
    Collective over ``world``; call ``fn`` enough beforehand to warm it up."""
    from mpi4py import MPI

    if device.type == "cuda":
        torch.cuda.synchronize()
        world.Barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
    else:
        world.Barrier()
        t0 = MPI.Wtime()
        for _ in range(iters):
            fn()
        seconds = (MPI.Wtime() - t0) / iters
    return world.allreduce(seconds, op=MPI.MAX)
