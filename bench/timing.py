"""Timing helpers, each saying what it includes.

- ``kernel_samples`` / ``kernel_ms``: **kernel time**, the GPU time of a call's work without
  the host. The call is captured once into a CUDA graph and the graph is replayed under
  ``triton.testing.do_bench`` (CUDA events, L2 flushed before every replay by writing a
  256 MB buffer, median). The flush takes the GPU far longer than the host needs to enqueue
  the next replay, so the GPU never waits for the host between the start event and the
  work. A call that cannot be captured (it synchronizes, or launches on a stream of its
  own) is timed eagerly with ``do_bench`` instead, and the label says so and why: eager
  times can include the host when a call costs more CPU than the flush takes on the GPU.
- Before its samples, a kernel time replays the call back to back for ``warmup_ms``
  (``SETTLE_MS`` by default), so that a GPU under sustained load is at its steady clock when
  the samples start. Under its 700 W limit an H200 takes 15% less time for an 8192³ fp16 GEMM
  in its first 25 ms after idling than after a second of load, and is still slowing down
  25-125 ms in, where the samples of a 25 ms warm-up fall: there ladder step 10 ran at 0.96-0.98x
  cuBLASLt, at 1.009-1.010x 1-2 s in and 1.007x 2-3 s in (the two runs of each in
  ``bench/results/h200-sustained-clock/power.txt``).
- ``call_samples``: **call time**, one eager call issued to an idle GPU (synchronize, record
  a start event, call, record an end event; L2 flushed as above): the host's launch path
  plus the work, what one isolated call costs a program.
- On the CPU both are ``torch.utils.benchmark.Timer.blocked_autorange`` (wall time): there
  is no kernel/host split.
- ``seconds_per_call``: the mean over back-to-back calls on every rank of an MPI job, as
  nccl-tests times collectives.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

# Kernel-time modes: "graph" (CUDA-graph replay, the host excluded) or "eager" (do_bench).
TIMINGS = ("graph", "eager")
# Warm-up before a kernel time's samples (ms of back-to-back replays): long enough for a GPU
# at its power limit to reach its sustained clock (see the module doc).
SETTLE_MS = 1000.0
# Most eager calls timed one by one for a call time (each waits for an idle GPU first).
MAX_CALL_SAMPLES = 2000


def _cpu_samples(fn: Callable[[], object], rep_ms: float, min_reps: int) -> list[float]:
    """Per-call wall times in ms of ``blocked_autorange``'s blocks, at least ``min_reps``."""
    from torch.utils import benchmark  # imported here: importing it is slow and noisy

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    times: list[float] = []
    while len(times) < min_reps:
        times += [t * 1e3 for t in timer.blocked_autorange(min_run_time=rep_ms / 1e3).times]
    return times


def _eager_samples(fn, warmup_ms: float, rep_ms: float, min_reps: int) -> list[float]:
    """``do_bench``'s samples, topped up to at least ``min_reps``."""
    from triton.testing import do_bench

    times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    while len(times) < min_reps:
        more = (min_reps - len(times)) * statistics.median(times) * 1.5
        times += do_bench(fn, warmup=0, rep=more, return_mode="all")
    return times


def capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured into a CUDA graph, after one warm-up call on a side stream (PyTorch's
    CUDA-graph recipe: lazy initialisation and library workspaces happen outside the
    capture); returns the graph and what the captured call returned (its output tensors are
    rewritten by every replay).

    Raises:
        RuntimeError: ``fn`` cannot be captured (the CUDA error says why).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def kernel_samples(fn: Callable[[], object], device: torch.device, *,
                   warmup_ms: float = SETTLE_MS,
                   rep_ms: float = 100, min_reps: int = 10, timing: str = "graph",
                   verify: Callable[[object], str | None] | None = None,
                   ) -> tuple[list[float], str]:
    """Kernel-time samples of ``fn()`` in ms (at least ``min_reps``) and how they were taken:
    ``"graph"``, ``"eager"`` (asked for), ``"eager: <why the capture failed>"``, or
    ``"cpu"``. With ``verify``, the graph's output after its first replay is passed to it;
    a returned reason raises.

    Raises:
        ValueError: ``timing`` is not in ``TIMINGS``; ``verify`` rejected the graph's output.
    """
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)}; got {timing!r}")
    if device.type != "cuda":
        return _cpu_samples(fn, rep_ms, min_reps), "cpu"
    if timing == "eager":
        return _eager_samples(fn, warmup_ms, rep_ms, min_reps), "eager"
    try:
        graph, result = capture(fn)
    except Exception as exc:  # noqa: BLE001  (any capture failure means: time it eagerly)
        torch.cuda.synchronize(device)
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        return _eager_samples(fn, warmup_ms, rep_ms, min_reps), f"eager: {why}"
    graph.replay()
    if verify is not None and (problem := verify(result)) is not None:
        raise ValueError(f"the CUDA graph's replay gave a wrong result: {problem}")
    samples = _eager_samples(graph.replay, warmup_ms, rep_ms, min_reps)
    del graph
    return samples, "graph"


def call_samples(fn: Callable[[], object], device: torch.device, *, rep_ms: float = 100,
                 min_reps: int = 10) -> list[float]:
    """Call-time samples of ``fn()`` in ms (at least ``min_reps``, at most
    ``MAX_CALL_SAMPLES`` on a GPU): each call issued to an idle GPU, L2 flushed before it, so
    a sample holds the host's launch path and the work."""
    if device.type != "cuda":
        return _cpu_samples(fn, rep_ms, min_reps)
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def one() -> float:
        driver.clear_cache(cache)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    estimate = min(one() for _ in range(3))  # also warms the path up
    count = min(max(min_reps, int(rep_ms / max(estimate, 1e-3))), MAX_CALL_SAMPLES)
    return [one() for _ in range(count)]


def kernel_ms(fn: Callable[[], object], device: torch.device, **knobs) -> float:
    """Median kernel time of ``fn()`` in ms (``kernel_samples``; its label dropped)."""
    return statistics.median(kernel_samples(fn, device, **knobs)[0])


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
