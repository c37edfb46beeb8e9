"""``gemmlab tune``: grid search over the configurations of the tunable backends (engine:
``bench.tune``)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from backends.dtypes import GEMM, GEMM_CPU, GEMM_GPU

from ..recording import unwritable_ancestor
from ..session import (
    UsageError,
    check_timing_options,
    csv_list,
    prepare_backends,
    set_threads,
)
from ..style import flops
from ..timing import SETTLE_MS
from ..tune import CPU_SHAPES, run_tune, tunable


def _table_problem(path: Path) -> str | None:
    """Why the tuned table at ``path`` cannot be written, or None (changes nothing)."""
    if path.is_dir():
        return f"--out {path} is a directory; it names the tuned table file (JSON)"
    if (ancestor := unwritable_ancestor(path)) is not None:  # the table is replaced atomically
        return f"--out {path} cannot be written: {ancestor} is not a writable directory"
    return None


def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab tune``: 0 when every default configuration passed its check, 1 when one
    failed; a mistake in the arguments (checked before any work) raises UsageError."""
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1; got {args.threads}")
    check_timing_options(args.warmup_ms, args.rep_ms)
    if args.budget is not None and not (args.budget >= 0 and math.isfinite(args.budget)):
        raise UsageError(f"--budget must be a finite number >= 0 seconds; got {args.budget:g}")
    set_threads(args.threads)
    gpu = prepare_backends(console)
    import backends
    from backends import tuning

    from .. import gemm_bench as gb

    device = torch.device("cuda" if gpu else "cpu")
    try:
        shapes = ([gb.parse_shape(s) for s in csv_list(args.shape)] if args.shape
                  else (gb.GPU_SHAPES if gpu else CPU_SHAPES))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dtype_names = csv_list(args.dtype) or list(GEMM_GPU if gpu else GEMM_CPU)
    choices = tunable()
    for backend in backends.LADDER:
        if backend.pin is not None and backend.name not in choices:
            console.print(f"skipped {backend.name}: no search space (Backend.search_space)")
    names = csv_list(args.backend) or choices
    unknown = [d for d in dtype_names if d not in GEMM]
    unknown += [n for n in names if n not in choices]
    if unknown:
        raise UsageError(f"unknown or not tunable: {', '.join(unknown)}; tunable backends: "
                         f"{', '.join(choices)}; dtypes: {', '.join(GEMM)}")
    if (why := gb.too_large(shapes, dtype_names, device)) is not None:
        raise UsageError(why)
    path = Path(args.out) if args.out else tuning.table_path()
    if (why := _table_problem(path)) is not None:
        raise UsageError(why)
    runnable = gb.runnable(names, console.print)
    if not any(gb.supports(backends.BACKENDS[n], d, device) for n in runnable
               for d in dtype_names):
        raise UsageError(gb.nothing_runs(names, dtype_names, device))
    names = runnable
    if args.budget is not None:
        console.print(f"budget: {args.budget:g} s")
    try:
        rows = run_tune(names, shapes, dtype_names, device, budget_s=args.budget, out=path,
                        seed=args.seed, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                        console=console)
    except ValueError as exc:  # a malformed table at --out: found before the search starts
        raise UsageError(str(exc)) from None

    table = Table(title="gemmlab tune: best configuration per (backend, dtype, shape)"
                  + ("" if gpu else "  [CPU: Triton interpreter times]"))
    for col in ("backend", "dtype", "M", "N", "K", "tried", "failed", "wrong", "default",
                "table", "best", "x default", "best config", "stored"):
        table.add_column(col, justify="left" if col in ("backend", "dtype", "best config",
                                                       "stored") else "right")
    for r in rows:
        speedup = (r["best_tflops"] / r["default_tflops"]
                   if r["best_tflops"] and r["default_tflops"] else None)
        config = " ".join(f"{k}={v}" for k, v in (r["best_config"] or {}).items()) or "-"
        table.add_row(r["backend"], r["dtype"], str(r["M"]), str(r["N"]), str(r["K"]),
                      f"{r['tried']}/{r['candidates']}", str(r["failed"]), str(r["rejected"]),
                      flops(r["default_tflops"]), flops(r["table_tflops"]),
                      flops(r["best_tflops"]), gb.fmt(speedup, ".2f"), config,
                      "yes" if r["stored"] else r["note"] or "no")
    console.print(table)
    stored = sum(r["stored"] for r in rows)
    console.print(f"{stored} of {len(rows)} groups stored in {path}" if stored
                  else f"nothing stored in {path}")
    return 1 if any(r["default_ok"] is False for r in rows) else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab tune``."""
    tune = subparsers.add_parser(
        "tune", help="grid search over the configurations of the tunable backends",
        description="Check, then time, every candidate configuration of each backend with a "
        "search space per shape and dtype; merge the fastest per (GPU, backend, dtype, shape "
        "bucket) into the tuned table that gemm() and gemmlab bench use, each group as it "
        "finishes (an interrupted search keeps them). A bad argument lists the tunable "
        "backends.")
    tune.add_argument("--backend", help="comma list of GEMM backends (default: every backend "
                      "with a search space)")
    tune.add_argument("--shape", help="comma list of N (square) or MxNxK (default on GPU: "
                      "gemmlab bench's shapes; on CPU: 64)")
    tune.add_argument("--dtype", help="comma list of fp32, tf32, fp16, bf16 "
                      "(default on GPU: all four; on CPU: fp32,fp16,bf16)")
    tune.add_argument("--budget", type=float, metavar="SECONDS",
                      help="wall-clock budget for the whole search (default: none)")
    tune.add_argument("--out", help="tuned table (JSON) to merge into (default: "
                      "$GEMMLAB_TUNED_FILE or backends/tuned.json)")
    tune.add_argument("--seed", type=int, default=0,
                      help="seed of the random inputs and of the candidate order")
    tune.add_argument("--warmup-ms", type=float, default=SETTLE_MS,
                      help="back-to-back calls before each candidate's samples (ms; default "
                      f"{SETTLE_MS:.0f}: the GPU at its sustained clock)")
    tune.add_argument("--rep-ms", type=float, default=50, help="timed repeats per candidate (ms)")
    tune.add_argument("--threads", type=int, metavar="N",
                      help="torch CPU threads (default: the machine's cores)")
    tune.set_defaults(func=run)
    return tune
