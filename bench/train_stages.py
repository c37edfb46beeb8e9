"""One GPT trained four ways, side by side: the runtime table and loss chart of several
``gemmlab train`` runs of the same model.

The four stages (the same model, seed, global batch and learning rate in each)::

    gemmlab train --device cpu --out runs/cpu1                        # 1 CPU process
    mpiexec -n P gemmlab train --device cpu --dp P --out runs/cpuP    # P CPU ranks, DP
    gemmlab train --device cuda --out runs/gpu1                       # 1 GPU
    mpiexec -n P gemmlab train --device cuda --dp D --tp T --out runs/gpuP  # P GPUs
    python -m bench.train_stages runs/cpu1 runs/cpuP runs/gpu1 runs/gpuP --out runs/stages

Each RUN is a train run's ``--out`` directory (or its ``results.json``). The serial CPU run
(one process on the CPU; the first if several) is the baseline. One row per run: ``stage``
(its layout and device), dtype, ranks, steps, ms/step and tokens/s (the run's own medians,
its first step left out), ``speedup`` (the baseline's ms/step over the run's: the same global
batch per step, so also the ratio of tokens/s), the final loss, and ``max_loss_diff``, the
largest |loss - baseline loss| over the steps both ran (0 for the baseline). Printed as a
table; with ``--out``, written as results.jsonl/json/csv and a PNG of the loss curves with
their distance to the baseline's below (``bench.train_plot.plot_curves``).

Runs of different models are refused (exit status 2): their model config, seed, global batch
and learning rate must agree, and so must be recorded (``results.json`` from before
``gemmlab train`` recorded them are refused too).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import cli
from .session import UsageError

SAME_MODEL = ("model", "seed", "batch", "lr")
"""The summary fields that make runs the same model trained the same way."""


def load_run(path: str | Path) -> dict:
    """The ``results.json`` of a ``gemmlab train`` run at ``path`` (its directory or the file),
    with ``"source"``: the file's path.

    Raises:
        UsageError: it cannot be read, or is not a train run's, or lacks a ``SAME_MODEL`` field.
    """
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    try:
        run = json.loads(file.read_text())
        summary = run["summary"]
        summary["ms_per_step"], summary["device"], run["loss"][0]  # noqa: B018
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise UsageError(f"{file} is not the results.json of a gemmlab train run "
                         f"({type(exc).__name__}: {exc})") from None
    if missing := [key for key in SAME_MODEL if key not in summary]:
        raise UsageError(f"{file} does not record the run's {', '.join(missing)} (written by "
                         f"an older gemmlab train): run it again")
    return {**run, "source": str(file)}


def stage_rows(runs: list[dict]) -> tuple[list[dict], int]:
    """The table's rows, one per run (module doc), and the index of the baseline run.

    Raises:
        UsageError: fewer than two runs, runs of different models (``SAME_MODEL``), or no
            serial CPU run among them.
    """
    if len(runs) < 2:
        raise UsageError("give two runs or more (the serial CPU run among them)")
    def identity(run: dict) -> dict:  # the model's fields one by one, for a precise message
        summary = run["summary"]
        return {**summary["model"], **{key: summary[key] for key in SAME_MODEL[1:]}}

    first = identity(runs[0])
    for run in runs[1:]:
        other = identity(run)
        if differ := [f"{key} {first.get(key)!r} vs {other.get(key)!r}"
                      for key in dict.fromkeys([*first, *other])
                      if first.get(key) != other.get(key)]:
            raise UsageError(f"{run['source']} is not the same model as {runs[0]['source']}: "
                             + "; ".join(differ))
    serial = [i for i, run in enumerate(runs) if run["summary"]["device"] == "cpu"
              and run["summary"]["tp"] * run["summary"]["dp"] == 1]
    if not serial:
        raise UsageError("no serial CPU run (one process, --device cpu) among the runs: it is "
                         "the baseline")
    base = runs[serial[0]]
    rows = []
    for run in runs:
        s = run["summary"]
        rows.append({
            "stage": f"{s['configuration']}, {s['device']}", "dtype": s["dtype"],
            "ranks": s["tp"] * s["dp"], "steps": len(run["loss"]),
            "ms_per_step": s["ms_per_step"], "tokens_per_s": s["tokens_per_s"],
            "speedup": base["summary"]["ms_per_step"] / s["ms_per_step"],
            "final_loss": run["loss"][-1],
            "max_loss_diff": max(abs(a - b) for a, b in zip(run["loss"], base["loss"]))})
    return rows, serial[0]


def stages(args: argparse.Namespace, console: Console) -> int:
    """Read, check, print and (with ``--out``) write; 0, or 2 for a mistake."""
    from .recording import Recorder, out_problem
    from .train_plot import plot_curves

    if args.out and (why := out_problem(args.out, args.overwrite)) is not None:
        raise UsageError(why)
    runs = [load_run(path) for path in args.runs]
    rows, baseline = stage_rows(runs)
    table = Table(title=f"one GPT trained {len(rows)} ways (baseline: {rows[baseline]['stage']})")
    for col in ("stage", "dtype", "ranks", "steps", "ms/step", "tokens/s", "speedup",
                "final loss", "max |loss diff|"):
        table.add_column(col, justify="left" if col in ("stage", "dtype") else "right")
    for r in rows:
        table.add_row(r["stage"], r["dtype"], str(r["ranks"]), str(r["steps"]),
                      f"{r['ms_per_step']:.2f}", f"{r['tokens_per_s']:.0f}",
                      f"{r['speedup']:.2f}x", f"{r['final_loss']:.4f}",
                      f"{r['max_loss_diff']:.2e}")
    console.print(table)
    curves = [{"label": r["stage"], "steps": list(range(len(run["loss"]))), "loss": run["loss"]}
              for r, run in zip(rows, runs)]
    recorder = Recorder(args.out, lambda _rows, path: plot_curves(curves, path,
                                                                  baseline=baseline))
    recorder.extend(rows)
    for path in recorder.finish(runs=[str(p) for p in args.runs],
                                baseline=rows[baseline]["stage"],
                                loss={r["stage"]: run["loss"] for r, run in zip(rows, runs)}):
        console.print(f"wrote {path}", highlight=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.train_stages",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a gemmlab train --out directory (or its results.json)")
    parser.add_argument("--out", help="directory for results.jsonl, results.json (rows, "
                        "runs, baseline, loss per stage), results.csv and results.png")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out (its result files are replaced)")
    parser.set_defaults(func=stages)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run, as ``gemmlab``'s commands do (``bench.cli.run``: one ``error:``
    line and status 2 for a mistake); the exit status."""
    console = Console(width=None if sys.stdout.isatty() else 160)
    return cli.run(build_parser().parse_args(argv), console)


if __name__ == "__main__":
    sys.exit(main())
