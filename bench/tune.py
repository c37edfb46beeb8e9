"""``gemmlab tune``: grid search over the configurations of every backend with a search space
(``Backend.search_space``: triton_fused's beside its autotune lists, each CUDA C kernel's beside
its default tile sizes in the registry); the fastest per (GPU, backend, dtype, shape bucket)
goes into the tuned table (``backends/tuning.py``) that ``gemm()`` and ``gemmlab bench`` then
use.

For each shape x dtype, fresh random A, B and a full C feed every backend; the op is
D = ReLU(A @ B + C). Each backend's default configuration (Triton's autotuner, the registry's
tile sizes) is checked and timed first, then every candidate of its search space in a seeded
random order, each launched through ``Backend.bind_config``: written into an output poisoned
with NaN, compared with the float64 reference (relative Frobenius error, tolerance by dtype),
and timed (``bench.timing.kernel_ms``: kernel time from CUDA-graph replay, the host excluded)
only if it passed. A candidate that does not compile (a ``static_assert``, too much shared
memory) or launch is counted as failed, one with a wrong result as rejected: neither is ever
stored. The few fastest candidates, the default and the table's entry are then timed again in
turns (``FINAL_ROUNDS``), so a drift of the GPU's clocks over the search favours none of them.
The best candidate is stored when it is at least as fast as the default and as the tuned
table's entry for the bucket (if any), both measured in the same run; it then replaces that
entry, at once, so an interrupted run keeps the groups it finished. When the default is the
fastest of the three, or the best candidate is the default's own configuration (timed
twice), nothing is stored and a slower table entry is removed, so the bucket runs the default.
The search follows siboehm/SGEMM_CUDA's autotuner scripts (a grid over the compile-time tile
sizes, every variant checked) and ``triton.autotune``'s config lists.

``backends`` is imported inside the functions: the CLI must switch the Triton interpreter on
(no GPU) before the Triton kernel is first imported.
"""

from __future__ import annotations

import datetime
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from backends.dtypes import DTYPES

from .recording import declared_commit, git_commit
from .timing import SETTLE_MS, kernel_ms

# After the screening pass the fastest FINALISTS candidates, the default and the table's entry
# are timed again FINAL_ROUNDS times, taking turns: a GPU's clocks drift with its temperature
# over a search, so one time per candidate favours whatever ran while the GPU was cool.
FINALISTS = 3
FINAL_ROUNDS = 3
# Without a GPU: one tiny shape, so the Triton interpreter gets through the space in seconds.
CPU_SHAPES = [(64, 64, 64)]


def tunable() -> list[str]:
    """The backends with a search space (``Backend.search_space``), in ladder order."""
    import backends

    return [b.name for b in backends.LADDER if b.search_space is not None]


def _measure(run: Callable[[], object], out: torch.Tensor, ref: torch.Tensor, tol: float,
             device: torch.device, warmup_ms: float, rep_ms: float,
             min_reps: int) -> tuple[str, float | None, str]:
    """Check ``run`` (which writes D into ``out``) on a NaN-poisoned ``out``, then time it if
    it passed. Returns ("ok", ms, "") or ("failed" | "rejected", None, why)."""
    from backends import relative_error

    out.fill_(float("nan"))
    try:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # an asynchronous launch error surfaces here
    except Exception as exc:  # does not compile or launch: skipped and counted, not fatal
        return "failed", None, f"{type(exc).__name__}: {exc}"
    err = relative_error(out, ref)
    if not err <= tol:
        return "rejected", None, f"relative error {err:.2e} > tolerance {tol:.0e}"
    return "ok", kernel_ms(run, device, warmup_ms=warmup_ms, rep_ms=rep_ms,
                           min_reps=min_reps), ""


def _operands(m: int, n: int, k: int, dtype_name: str, device: torch.device,
              generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Fresh random A (M, K), B (K, N), a full C (M, N) and the float64 ReLU(A @ B + C)."""
    import backends

    from . import gemm_bench as gb

    dtype = DTYPES[dtype_name].torch
    a = gb.random_operand(m, k, dtype=dtype, device=device, generator=generator)
    b = gb.random_operand(k, n, dtype=dtype, device=device, generator=generator)
    c = gb.random_operand(m, n, dtype=dtype, device=device, generator=generator)
    return a, b, c, backends.reference(a, b, c, "relu")


def _add_note(row: dict, note: str) -> None:
    row["note"] = f"{row['note']}; {note}" if row["note"] else note


def _tflops(m: int, n: int, k: int, ms: float | None) -> float | None:
    return None if ms is None else 2 * m * n * k / (ms * 1e-3) / 1e12


def _search(row: dict, impl, space: list[dict], operands, device: torch.device,
            deadline: float | None, order: random.Random, timing: dict,
            progress: Callable[[str, int], None], say: Callable[[str], None],
            incumbent: dict | None = None) -> None:
    """One group: check and time ``impl``'s default configuration and the ``incumbent``
    configuration (the tuned table's for this bucket, if any), then screen the candidates of
    ``space`` in a random order until ``deadline`` (``time.monotonic()``); then time the
    ``FINALISTS`` fastest, the default and the incumbent again in ``FINAL_ROUNDS`` turns and
    keep each one's median. Fills ``row``."""
    import backends
    from backends.problem import Problem

    a, b, c, ref = operands
    m, n, k, dtype_name = row["M"], row["N"], row["K"], row["dtype"]
    tf32 = dtype_name == "tf32"
    tol = backends.TOLERANCES[dtype_name]
    label = f"{impl.name} {dtype_name} {m}x{n}x{k}"
    d = torch.empty((m, n), dtype=a.dtype, device=device)
    problem = Problem.of(a, b, c, True, tf32)

    def bound(config: dict | None, note: str) -> Callable[[], object]:
        """The backend's launch with ``config`` (None: its default), bound on first use (a
        config it cannot use or that does not compile then counts as failed, in
        ``_measure``)."""
        launch = []

        def run():
            if not launch:
                launch.append(impl.bind_config(problem, config, note))
            return launch[0](a, b, c, d)

        return run

    progress(f"{label} default", 0)
    status, ms, why = _measure(bound(None, "default"), d, ref, tol, device, **timing)
    row.update(default_ok=status == "ok", default_config=impl.config(), default_ms=ms,
               default_tflops=_tflops(m, n, k, ms))
    if status != "ok":
        row["error"] = f"default configuration {status}: {why}"
        say(f"{label}: the default configuration {status}: {why}")
    runs = {}  # what passed its check: "default", "table", or a candidate's index -> call
    if status == "ok":
        runs["default"] = bound(None, "default")
    if incumbent is not None:
        runs["table"] = bound(incumbent, "the tuned table's entry")
        status, ms, why = _measure(runs["table"], d, ref, tol, device, **timing)
        row.update(table_ms=ms, table_tflops=_tflops(m, n, k, ms))
        if status != "ok":
            del runs["table"]
            _add_note(row, f"the table's entry {status}: {why}")
    progress(f"{label}: 0/{len(space)} candidates", 1)

    order.shuffle(space)
    screened = []  # (ms, index in space) of the candidates that passed
    for i, config in enumerate(space):
        if deadline is not None and time.monotonic() >= deadline:
            row["note"] = f"budget spent after {row['tried']} of {len(space)} candidates"
            say(f"{label}: {row['note']}; keeping the best so far")
            break
        status, ms, why = _measure(bound(config, "tuning candidate"), d, ref, tol, device,
                                   **timing)
        row["tried"] += 1
        progress(f"{label}: {row['tried']}/{len(space)} candidates", 1)
        if status != "ok":
            row[status] += 1  # "failed" or "rejected"
            row["error"] = row["error"] or f"{config}: {why}"
        else:
            screened.append((ms, i))
    for _, i in sorted(screened)[:FINALISTS]:
        runs[i] = bound(space[i], "tuning finalist")
    # The final: everything that passed, timed in turns; each keeps the median of its rounds.
    times = {key: [] for key in runs}
    for _ in range(FINAL_ROUNDS if len(runs) > 1 else 0):
        for key, run in runs.items():
            times[key].append(kernel_ms(run, device, **timing))
    median = {key: statistics.median(t) for key, t in times.items() if t}
    if "default" in median:
        row.update(default_ms=median["default"], default_tflops=_tflops(m, n, k,
                                                                         median["default"]))
    if "table" in median:
        row.update(table_ms=median["table"], table_tflops=_tflops(m, n, k, median["table"]))
    finalists = [(median.get(i, ms), i) for ms, i in sorted(screened)[:FINALISTS]]
    if finalists:
        ms, i = min(finalists)
        row.update(best_config=space[i], best_ms=ms, best_tflops=_tflops(m, n, k, ms))
    progress(label, len(space) - row["tried"])


def run_tune(names: list[str], shapes: list[tuple[int, int, int]], dtype_names: list[str],
             device: torch.device, *, budget_s: float | None = None,
             out: str | Path | None = None, seed: int = 0, warmup_ms: float = SETTLE_MS,
             rep_ms: float = 50, min_reps: int = 10,
             console: Console | None = None) -> list[dict]:
    """Search every (shape, dtype, backend) group and merge the winners into the tuned table.

    Args:
        names: backends to tune; each needs a search space (``Backend.search_space``,
            ``tunable()``) and must run here; a (backend, dtype) the backend does not support
            on ``device`` is left out.
        shapes: (M, N, K) problems to tune on, each standing for its shape bucket.
        dtype_names: fp32, tf32, fp16, bf16.
        device: where to run; on the CPU the Triton kernels run under the Triton
            interpreter and the times are CPU times.
        budget_s: wall-clock budget in seconds for the whole run, or None. It is shared out
            evenly over the groups still to tune (time a group leaves unused passes on); a
            group stops starting candidates when its share is spent and keeps its best so far.
        out: the tuned table to merge into (default ``backends.tuning.table_path()``).
        seed: seeds the random inputs and the order in which candidates are tried.
        warmup_ms, rep_ms, min_reps: ``bench.timing.kernel_ms`` knobs per timed configuration
            (the warm-up, ``SETTLE_MS`` by default, brings the GPU to its sustained clock
            before each candidate's samples, so every candidate is timed at that clock).
        console: where to show a progress bar and notes (none when None).

    Returns:
        One dict per group, in sweep order: backend, dtype, M, N, K, bucket, candidates (size
        of the space), tried, failed (did not compile or launch), rejected (wrong result),
        default_ok (the default configuration passed its check; None when the budget left
        the group out), default_config, default_ms, default_tflops, table_ms and
        table_tflops (the table's entry for the bucket timed in this run; None without one),
        best_config, best_ms, best_tflops, stored (whether the best is now in the table),
        note, error (the first failure's message).

    A stored winner is saved (``tuning.save``) as soon as its group finishes, so an
    interrupted run (KeyboardInterrupt) keeps the groups it finished.

    Raises:
        ValueError: the table at ``out`` is malformed (nothing is written over it).
    """
    import backends
    from backends import tuning

    from . import gemm_bench as gb

    path = tuning.table_path() if out is None else Path(out)
    tuning.load(path)  # a malformed table fails now, not after the search
    gpu = tuning.device_name(device)
    plan = [(shape, dtype_name, name, backends.BACKENDS[name].search_space(dtype_name, device))
            for shape in shapes for dtype_name in dtype_names for name in names
            if gb.supports(backends.BACKENDS[name], dtype_name, device)]
    say = console.print if console is not None else (lambda *args: None)
    generator = torch.Generator(device=device).manual_seed(seed)
    order = random.Random(seed)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    commit = git_commit()
    declared = {"declared_commit": c} if (c := declared_commit()) else {}
    timing = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "min_reps": min_reps}
    end = None if budget_s is None else time.monotonic() + budget_s
    rows, problem, operands = [], None, None
    with Progress(console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("tune", total=sum(len(space) + 1 for *_, space in plan))
        for i, ((m, n, k), dtype_name, name, space) in enumerate(plan):
            if problem != (m, n, k, dtype_name):  # the plan runs one problem's groups in a row
                problem, operands = (m, n, k, dtype_name), None  # frees the previous operands
                operands = _operands(m, n, k, dtype_name, device, generator)
            impl = backends.BACKENDS[name]
            row = {"backend": name, "dtype": dtype_name, "M": m, "N": n, "K": k,
                   "bucket": list(tuning.bucket(m, n, k)), "candidates": len(space), "tried": 0,
                   "failed": 0, "rejected": 0, "default_ok": None, "default_config": "",
                   "default_ms": None, "default_tflops": None, "table_ms": None,
                   "table_tflops": None, "best_config": None,
                   "best_ms": None, "best_tflops": None, "stored": False, "note": "",
                   "error": ""}
            rows.append(row)
            now = time.monotonic()
            if end is not None and now >= end:
                row["note"] = "budget spent before this group started"
                progress.advance(task, len(space) + 1)
                continue
            deadline = None if end is None else now + (end - now) / (len(plan) - i)
            # Read again per group: an earlier group of the same bucket may have replaced it.
            incumbent = tuning.load(path).get(name, gpu, dtype_name, m, n, k)
            _search(row, impl, space, operands, device, deadline, order, timing,
                    lambda text, advance: progress.update(task, description=text,
                                                          advance=advance), say,
                    None if incumbent is None else incumbent["config"])
            if row["best_ms"] is None:
                _add_note(row, "no candidate passed")
            elif row["default_ms"] is not None and (
                    row["best_ms"] > row["default_ms"]
                    or row["best_config"] == impl.default_config):  # one build, timed twice
                why = ("the default configuration was faster"
                       if row["best_ms"] > row["default_ms"]
                       else "the best candidate is the default configuration")
                if row["table_ms"] is not None and row["table_ms"] >= row["default_ms"]:
                    # The entry would keep running a configuration this run found slower.
                    tuning.remove(gpu, name, dtype_name, row["bucket"], path)
                    _add_note(row, f"{why}: not stored, and the table's entry for this bucket "
                                   f"removed")
                else:
                    _add_note(row, f"{why}: not stored")
            elif row["table_ms"] is not None and row["best_ms"] > row["table_ms"]:
                _add_note(row, "the table's entry was faster in this run: kept")
            else:
                tuning.save([{"gpu": gpu, "backend": name, "dtype": dtype_name,
                              "bucket": row["bucket"], "config": row["best_config"],
                              "tflops": row["best_tflops"], "ms": row["best_ms"],
                              "default_tflops": row["default_tflops"], "shape": [m, n, k],
                              "date": date, "git_commit": commit, **declared}], path)
                row["stored"] = True
    return rows
