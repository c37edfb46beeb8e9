"""Median wall time of a callable: CUDA events through ``triton.testing.do_bench`` on a GPU
(warm-up, L2 flushed before every repeat), ``torch.utils.benchmark`` on the CPU."""

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
