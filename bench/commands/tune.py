"""``gemmlab tune``: grid search over the configurations of the tunable backends (engine:
``bench.tune``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ..session import csv_list, prepare_backends
from ..tune import CPU_SHAPES, run_tune, tunable


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab tune`` on the ``gemmlab`` command's subparsers."""
    tune = subparsers.add_parser(
        "tune", help="grid search over triton_fused and cuda_* configurations",
        description="Check, then time, every candidate configuration of triton_fused and the "
        "cuda_* backends per shape and dtype; merge the fastest per (GPU, backend, dtype, shape "
        "bucket) into the tuned table that gemm() and gemmlab bench use.")
    tune.add_argument("--backends", help="comma list (default: triton_fused and every cuda_* "
                      "backend with a search space)")
    tune.add_argument("--shapes", help="comma list of N (square) or MxNxK (default on GPU: "
                      "gemmlab bench's shapes; on CPU: 64)")
    tune.add_argument("--dtypes", help="comma list of fp32, tf32, fp16, bf16 "
                      "(default on GPU: all four; on CPU: fp32,fp16,bf16)")
    tune.add_argument("--budget", type=float, metavar="SECONDS",
                      help="wall-clock budget for the whole search (default: none)")
    tune.add_argument("--out", help="tuned table to merge into (default: $GEMMLAB_TUNED_FILE "
                      "or backends/tuned.json)")
    tune.add_argument("--seed", type=int, default=0,
                      help="seed of the random inputs and of the candidate order")
    tune.add_argument("--warmup-ms", type=float, default=10, help="warm-up per candidate (ms)")
    tune.add_argument("--rep-ms", type=float, default=50, help="timed repeats per candidate (ms)")
    tune.set_defaults(func=run)
    return tune




def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab tune``: 0 when every default configuration passed its check, 1 when one
    failed, 2 for bad arguments."""
    gpu = prepare_backends(console)
    import backends
    from backends import tuning

    from .. import gemm_bench as gb

    device = torch.device("cuda" if gpu else "cpu")
    try:
        shapes = [gb.parse_shape(s) for s in csv_list(args.shapes)] if args.shapes else (
            gb.GPU_SHAPES if gpu else CPU_SHAPES)
    except ValueError as exc:
        console.print(f"error: {exc}")
        return 2
    dtype_names = (csv_list(args.dtypes) if args.dtypes
                   else (gb.GPU_DTYPES if gpu else gb.CPU_DTYPES))
    choices = tunable()
    for backend in backends.LADDER:
        if backend.pin is not None and backend.name not in choices:
            console.print(f"skipped {backend.name}: no search space (bench.tune.CUDA_SPACES)")
    names = csv_list(args.backends) if args.backends else choices
    unknown = [d for d in dtype_names if d not in gb.DTYPES]
    unknown += [n for n in names if n not in choices]
    if unknown:
        console.print(f"error: unknown or not tunable: {', '.join(unknown)}; tunable backends: "
                      f"{', '.join(choices)}; dtypes: {', '.join(gb.DTYPES)}")
        return 2
    if (why := gb.too_large(shapes, dtype_names, device)) is not None:
        console.print(f"error: {why}")
        return 2
    names = gb.runnable(names, console.print)
    path = Path(args.out) if args.out else tuning.table_path()
    if args.budget is not None:
        console.print(f"budget: {args.budget:g} s")
    try:
        rows = run_tune(names, shapes, dtype_names, device, budget_s=args.budget, out=path,
                        seed=args.seed, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                        console=console)
    except ValueError as exc:  # a malformed table at --out
        console.print(f"error: {exc}")
        return 2

    table = Table(title="gemmlab tune: best configuration per (backend, dtype, shape)"
                  + ("" if gpu else "  [CPU: Triton interpreter times]"))
    for col in ("backend", "dtype", "M", "N", "K", "tried", "failed", "wrong", "default TFLOP/s",
                "table TFLOP/s", "best TFLOP/s", "x default", "best config", "stored"):
        table.add_column(col, justify="left" if col in ("backend", "dtype", "best config",
                                                       "stored") else "right")
    for r in rows:
        speedup = (r["best_tflops"] / r["default_tflops"]
                   if r["best_tflops"] and r["default_tflops"] else None)
        config = " ".join(f"{k}={v}" for k, v in (r["best_config"] or {}).items()) or "-"
        table.add_row(r["backend"], r["dtype"], str(r["M"]), str(r["N"]), str(r["K"]),
                      f"{r['tried']}/{r['candidates']}", str(r["failed"]), str(r["rejected"]),
                      gb.fmt(r["default_tflops"], ".4g"), gb.fmt(r["table_tflops"], ".4g"),
                      gb.fmt(r["best_tflops"], ".4g"),
                      gb.fmt(speedup, ".2f"), config, "yes" if r["stored"] else r["note"] or "no")
    console.print(table)
    stored = sum(r["stored"] for r in rows)
    console.print(f"{stored} of {len(rows)} groups stored in {path}" if stored
                  else f"nothing stored in {path}")
    return 1 if any(r["default_ok"] is False for r in rows) else 0
