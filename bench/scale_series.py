"""A whole TP scaling series: ``gemmlab scale`` at every P, merged into one table and curves.

    python3 -m bench.scale_series strong|weak --ranks 1,2,4,8 --out DIR -- <gemmlab scale flags>

For each P in ``--ranks``, in order, runs

    <mpiexec> -n P python3 -m bench.cli scale strong|weak <flags> --out DIR/P<P>

(``gemmlab scale`` through ``python3 -m bench.cli``: no installed script needed) from the
repository root, killed after ``--timeout`` seconds, its output in ``DIR/P<P>/log.txt``. A P
the machine cannot run (the run exits with ``bench.session.CANNOT_RUN``: more ranks on a node
than GPUs) is reported and skipped; any other failure (nonzero exit, timeout, a workload that
failed its check: status ``check_failed``) stops the series, keeping the Ps already measured.
``<mpiexec>`` is ``--mpiexec``, else ``$GEMMLAB_MPIEXEC``, else ``mpiexec`` (with
``--oversubscribe`` under Open MPI, which otherwise refuses more ranks than cores), split like
a shell command line.

The per-P rows are merged, against the P = 1 row of the same workload (T(P): step_ms at P;
``scaling``):

- strong: speedup = T(1) / T(P), efficiency = T(1) / (P x T(P));
- weak: efficiency = T(1) / T(P) (each rank does the P = 1 work, so ideal is a flat time),
  speedup = P x T(1) / T(P) (scaled speedup: P times the work per unit of time).

Written to DIR: ``results.json`` (meta, rows, and ``runs``: what happened at each P),
``results.csv``, ``results.png`` (speedup against the ideal line, efficiency against P, one
curve per workload). Exit status 0 when every P ran or was skipped, 1 when one failed or none
ran, 2 for bad arguments, 130 on Ctrl-C or SIGTERM (the running P's ranks are killed, and the
Ps that finished are merged and written, marked ``"interrupted": true``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .recording import REPO, collect_meta, out_problem, write_results
from .scale import MODES
from .session import CANNOT_RUN, INTERRUPTED, UsageError, int_list, sigterm_as_ctrl_c


def default_mpiexec() -> str:
    """``$GEMMLAB_MPIEXEC``, else ``mpiexec``, plus ``--oversubscribe`` under Open MPI."""
    if command := os.environ.get("GEMMLAB_MPIEXEC"):
        return command
    try:
        version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "mpiexec"
    return "mpiexec --oversubscribe" if "Open MPI" in version or "OpenRTE" in version \
        else "mpiexec"


def run_one(mpiexec: list[str], p: int, mode: str, flags: list[str], out: Path,
            timeout: float) -> tuple[str, str]:
    """Run ``gemmlab scale`` on ``p`` ranks into ``out``; (status, reason) with status
    ``ok``, ``skipped`` (the machine cannot run P), ``check_failed`` (a workload failed its
    check: ``out/results.json`` holds its FAIL row beside the others) or ``failed``. On
    timeout or Ctrl-C (KeyboardInterrupt, raised again) the whole process group of mpiexec is
    killed, ranks included."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    # --overwrite: the directory holds this run's log.txt, written first
    cmd = [*mpiexec, "-n", str(p), sys.executable, "-m", "bench.cli", "scale", mode, *flags,
           "--out", str(out), "--overwrite"]
    with log.open("w") as f:
        f.write(shlex.join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return "failed", f"timed out after {timeout:g} s (log: {log})"
        except KeyboardInterrupt:  # the ranks run in a session of their own: Ctrl-C misses them
            _kill(proc)
            raise
    lines = log.read_text().strip().splitlines()
    if rc == CANNOT_RUN:
        return "skipped", f"the machine cannot run it: {lines[-1] if lines else ''}"
    # gemmlab scale exits 1 after writing its results when a workload failed its check.
    if rc == 1 and (out / "results.json").exists():
        return "check_failed", f"a workload failed its check (log: {log})"
    if rc != 0 or not (out / "results.json").exists():
        tail = "\n".join(lines[-15:])
        return "failed", f"exit status {rc} (log: {log}); last lines:\n{tail}"
    return "ok", ""


def _kill(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group (mpiexec and its ranks) and reap it."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def scaling(mode: str, p: int, t1: float, tp: float) -> tuple[float, float]:
    """(speedup, efficiency) of step time ``tp`` (ms) at TP degree ``p`` against ``t1`` at
    P = 1 (module doc): strong T(1) / T(P) and T(1) / (P T(P)); weak P T(1) / T(P) and
    T(1) / T(P). Both are exactly 1.0 at P = 1."""
    if mode == "strong":
        return t1 / tp, t1 / (p * tp)
    return p * t1 / tp, t1 / tp


def merge(mode: str, results: dict[int, list[dict]]) -> list[dict]:
    """Every timed row of every P, with ``speedup`` and ``efficiency`` against the P = 1
    row of its workload (None without one; ``scaling``)."""
    base = {r["workload"]: r["step_ms"] for r in results.get(1, []) if "step_ms" in r}
    rows = []
    for p in sorted(results):
        for r in results[p]:
            if "step_ms" not in r:
                continue
            speedup, efficiency = (scaling(mode, p, base[r["workload"]], r["step_ms"])
                                   if r["workload"] in base else (None, None))
            rows.append({**r, "speedup": speedup, "efficiency": efficiency})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Left: speedup against P, per workload, with the ideal (speedup = P). Right: efficiency
    against P (ideal 100%), with the communication share dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ps = sorted({r["P"] for r in rows})
    left.plot(ps, ps, "k--", label="ideal")
    right.axhline(100, color="k", linestyle="--", label="ideal")
    for i, workload in enumerate(dict.fromkeys(r["workload"] for r in rows)):
        sub = [r for r in rows if r["workload"] == workload and r["speedup"] is not None]
        x = [r["P"] for r in sub]
        left.plot(x, [r["speedup"] for r in sub], marker="o", color=f"C{i}", label=workload)
        right.plot(x, [100 * r["efficiency"] for r in sub], marker="o", color=f"C{i}",
                   label=f"{workload} efficiency")
        right.plot(x, [100 * r["comm_share"] for r in sub], marker=".", linestyle=":",
                   color=f"C{i}", label=f"{workload} comm share")
    first = rows[0] if rows else {"mode": "", "dtype": ""}
    for ax, label in ((left, "speedup"), (right, "%")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_xlabel("P (TP ranks)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_title(f"{first['mode']} scaling, {first['dtype']}: speedup", fontsize=10)
    right.set_title(f"{first['mode']} scaling: efficiency and communication share",
                    fontsize=10)
    right.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(mode: str, rows: list[dict]) -> Table:
    table = Table(title=f"TP {mode} scaling")
    for col in ("workload", "P", "tokens", "hidden", "ffn", "heads", "step ms", "comm ms",
                "comm share", "TFLOP/s/GPU", "speedup", "efficiency"):
        table.add_column(col, justify="left" if col == "workload" else "right")
    for r in rows:
        table.add_row(r["workload"], str(r["P"]), str(r["tokens"]), str(r["hidden"]),
                      str(r["ffn"]), "-" if r["heads"] is None else str(r["heads"]),
                      f"{r['step_ms']:.3f}", f"{r['comm_ms']:.3f}", f"{r['comm_share']:.0%}",
                      f"{r['tflops_per_gpu']:.3g}",
                      "-" if r["speedup"] is None else f"{r['speedup']:.2f}",
                      "-" if r["efficiency"] is None else f"{r['efficiency']:.0%}")
    return table


def main(argv: list[str] | None = None) -> int:
    """The series (module doc); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    flags = argv[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.scale_series",
        description="Run gemmlab scale under mpiexec -n P for each P, then merge the results "
        "(speedup, efficiency, communication share) into one table and curves. Flags after "
        "-- go to gemmlab scale.")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--ranks", default="1,2,4,8", help="comma list of P (default 1,2,4,8)")
    parser.add_argument("--out", required=True, help="directory: DIR/P<P>/ per run, and the "
                        "merged results.json, results.csv, results.png")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per P")
    parser.add_argument("--mpiexec", help="launcher command with its flags (default "
                        "$GEMMLAB_MPIEXEC, else mpiexec, with --oversubscribe under Open MPI)")
    args = parser.parse_args(argv[:cut])
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        ranks = int_list(args.ranks, "--ranks")
    except UsageError as exc:
        parser.error(str(exc))
    if "--out" in flags:
        parser.error("--out after -- : the series sets each run's --out (DIR/P<P>)")
    if (why := out_problem(args.out, overwrite=True)) is not None:  # each P's run replaces its own
        parser.error(why)
    mpiexec = shlex.split(args.mpiexec or default_mpiexec())
    out = Path(args.out).resolve()
    # Of the series' start: the code that runs, whatever changes in the checkout meanwhile.
    meta = {**collect_meta(),
            "command": shlex.join(["python3", "-m", "bench.scale_series", *argv])}
    sigterm_as_ctrl_c()
    results: dict[int, list[dict]] = {}
    runs = []
    failed = interrupted = False
    try:
        for p in ranks:
            console.print(f"P={p}: gemmlab scale {args.mode} under {shlex.join(mpiexec)} -n "
                          f"{p} ...")
            status, reason = run_one(mpiexec, p, args.mode, flags, out / f"P{p}", args.timeout)
            runs.append({"P": p, "status": status, "reason": reason, "dir": str(out / f"P{p}")})
            if status == "ok":
                results[p] = json.loads((out / f"P{p}" / "results.json").read_text())["rows"]
                continue
            console.print(f"P={p}: {status}: {reason}", markup=False)
            if status in ("failed", "check_failed"):
                console.print(f"stopping the series; keeping P = {sorted(results) or 'none'}")
                failed = True
                break
    except KeyboardInterrupt:  # run_one has killed the running P's ranks
        console.print(f"interrupted: keeping P = {sorted(results) or 'none'}")
        interrupted = meta["interrupted"] = True
    rows = merge(args.mode, results)
    if results and 1 not in results:
        console.print("no P = 1 run: speedup and efficiency left empty")
    if rows:
        console.print(_table(args.mode, rows))
        for path in write_results(out, meta, rows, plot, runs=runs):
            console.print(f"wrote {path}")
    else:
        console.print("no P ran: nothing to merge")
    if interrupted:
        return INTERRUPTED
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
