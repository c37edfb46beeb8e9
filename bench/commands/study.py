"""``gemmlab study``: how a faster GEMM changes TP scaling (engine: ``bench.study``)."""

from __future__ import annotations

import argparse
import itertools
import shlex
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from backends.dtypes import TP

from .. import study
from ..scale import MODES, WORKLOADS, problem
from ..session import (
    UsageError,
    add_run_options,
    check_run_options,
    csv_list,
    int_list,
    row_printer,
    use_interpreter_without_gpu,
)
from ..style import flops


def _names(given: list[str], known, what: str) -> list[str]:
    """``given`` without repeats, each one of ``known``.

    Raises:
        UsageError: an unknown name, or none given.
    """
    if unknown := [x for x in given if x not in known]:
        raise UsageError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    if not given:
        raise UsageError(f"no {what} given; known: {', '.join(known)}")
    return list(dict.fromkeys(given))


def _runnable(names: list[str], reasons: dict[str, str | None], what: str,
              say) -> list[str]:
    """The names whose reason is None; the others are printed as skipped, with the reason.

    Raises:
        UsageError: none of them can run here (every reason given).
    """
    for name in names:
        if reasons[name] is not None:
            say(f"skipping {what} {name}: {reasons[name]}", highlight=False)
    if not (ok := [n for n in names if reasons[n] is None]):
        raise UsageError(f"no {what} can run here; " + "; ".join(reasons.values()))
    return ok


def _plan(args: argparse.Namespace, console: Console) -> dict:
    """Every argument checked and resolved, before any point runs (see ``add_parser``).

    Raises:
        UsageError: the first mistake found.
    """
    import backends
    import tp.comm

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible")
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    use_interpreter_without_gpu(device_type)  # before the backends import the Triton kernel
    check_run_options(args)
    dtype_name = args.dtype or ("bf16" if device_type == "cuda" else "fp32")
    workloads = _names(csv_list(args.workload), WORKLOADS, "workload")
    modes = _names(csv_list(args.mode), MODES, "mode")
    ranks = sorted(set(int_list(args.ranks, "--ranks")))
    hidden, ratios, tokens = (int_list(getattr(args, f), f"--{f.replace('_', '-')}")
                              for f in ("hidden", "ffn_ratio", "tokens"))
    partitions = list(itertools.product(hidden, ratios, tokens))
    if args.tradeoff:
        if len(ranks) != 1 or ranks[0] < 2:
            raise UsageError(f"--tradeoff runs at one P >= 2 (and P = 1 for the GEMM rate); "
                             f"got --ranks {args.ranks}")
        sizes_at = [1, *ranks]
    else:
        if ranks[0] != 1:
            raise UsageError(f"--ranks must include 1: efficiency is relative to the P = 1 "
                             f"point; got {args.ranks}")
        if len(partitions) > 1:
            raise UsageError("one --hidden, --ffn-ratio and --tokens each without --tradeoff "
                             "(lists sweep the partition with --tradeoff)")
        sizes_at = ranks
    if args.chunks < 1 or args.sm_margin < 0 or args.iters < 1 or args.warmup_iters < 0:
        raise UsageError("--chunks and --iters must be >= 1, --sm-margin and --warmup-iters "
                         ">= 0")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0 seconds; got {args.timeout:g}")
    try:
        for (h, r, t), w, mode, p in itertools.product(partitions, workloads, modes, sizes_at):
            problem(w, mode, p, t, h, r, args.heads, args.seq)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    backend_names = _names(csv_list(args.backend) or list(study.default_backends(dtype_name)),
                           tuple(backends.BACKENDS), "backend")
    comm_names = _names(csv_list(args.comm) or list(study.default_comms(device_type)),
                        tp.comm.BACKENDS, "communicator")
    why = study.why_not_here(backend_names, comm_names, dtype_name, device_type)
    runnable = {kind: _runnable(names, why[kind], kind, console.print)
                for kind, names in (("backend", backend_names), ("communicator", comm_names))}
    layer_flags = ["--iters", str(args.iters), "--warmup-iters", str(args.warmup_iters),
                   "--chunks", str(args.chunks), "--sm-margin", str(args.sm_margin),
                   "--overlap" if args.overlap else "--no-overlap",
                   *(["--threads", str(args.threads)] if args.threads else [])]
    return {"device_type": device_type, "dtype_name": dtype_name, "workloads": workloads,
            "modes": modes, "ranks": ranks, "partitions": partitions,
            "backends": runnable["backend"], "comms": runnable["communicator"],
            "skipped": [{"kind": kind, "name": name, "reason": reason}
                        for kind, reasons in why.items() for name, reason in reasons.items()
                        if reason is not None],
            "layer_flags": layer_flags}


def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab study``: 0 when every point ran (or was skipped) and passed its checks, 1
    when one failed or failed a check (its rows are kept and marked FAIL) or none ran, 2 for
    bad arguments."""
    from ..recording import Recorder
    from ..scale_series import default_mpiexec

    plan = _plan(args, console)
    mpiexec = shlex.split(args.mpiexec or default_mpiexec())
    what = "trade-off" if args.tradeoff else "study"
    console.print(f"gemmlab study ({what}): {plan['device_type']}, {plan['dtype_name']}, "
                  f"P {','.join(map(str, plan['ranks']))}, {', '.join(plan['modes'])}, "
                  f"workloads {', '.join(plan['workloads'])}, backends "
                  f"{', '.join(plan['backends'])}, communicators {', '.join(plan['comms'])}; "
                  f"each point: gemmlab scale under {shlex.join(mpiexec)} -n P",
                  highlight=False)
    recorder = Recorder(args.out, study.plot_tradeoff if args.tradeoff else study.plot,
                        row_printer(console, _describe))
    with tempfile.TemporaryDirectory(prefix="gemmlab-study-") as scratch:
        root = Path(args.out) if args.out else Path(scratch)
        measure = _tradeoff if args.tradeoff else _study
        runs = measure(args, plan, mpiexec, root, recorder, console)
    rows = recorder.rows
    if args.tradeoff:
        study.add_model(rows)
        stats, lines = study.summarize_tradeoff(rows)
        extra = {"model": study.MODEL}
    else:
        stats, lines = study.summarize(rows)
        extra = {}
    console.print(_tradeoff_table(rows) if args.tradeoff else _study_table(rows))
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    for path in recorder.finish(runs=runs, skipped=plan["skipped"],
                                summary={"lines": lines, "stats": stats}, **extra):
        console.print(f"wrote {path}")
    failed = [r for r in runs if r["status"] in ("failed", "check_failed")]
    for r in failed:
        console.print(f"{_name(r)}: {r['status']}: {r['reason']}", markup=False)
    return 1 if failed or not rows else 0


def _name(run: dict) -> str:
    """A point as the progress lines name it: ``strong cublas mpi P=2 [h512_r4_t1024]``."""
    return " ".join(x for x in (run["mode"], run["backend"], run["comm"], f"P={run['P']}",
                                run["partition"]) if x)


def _launch(args, plan: dict, mpiexec: list[str], root: Path, console: Console,
            runs: list[dict], mode: str, backend: str, comm: str, p: int,
            partition: tuple[int, int, int], label: str = "") -> tuple[str, list[dict]]:
    """One point (``bench.study.run_point``) of sizes ``partition`` (hidden, FFN ratio,
    tokens), announced and added to ``runs``; its status and rows."""
    h, r, t = partition
    flags = study.scale_flags(
        workloads=plan["workloads"], device_type=plan["device_type"],
        dtype_name=plan["dtype_name"], backend=backend, comm=comm, tokens=t, hidden=h,
        ffn_ratio=r, heads=args.heads, seq=args.seq, layer_flags=plan["layer_flags"])
    out = study.point_dir(root, mode, backend, comm, p, label)
    point = {"mode": mode, "backend": backend, "comm": comm, "P": p, "partition": label}
    console.print(f"{_name(point)}: gemmlab scale ...", highlight=False)
    status, reason, rows = study.run_point(mpiexec, p, mode, flags, out, args.timeout)
    runs.append({**point, "status": status, "reason": reason, "dir": str(out)})
    if status != "ok":
        console.print(f"{_name(point)}: {status}: {reason}", markup=False)
    return status, rows


def _study(args, plan: dict, mpiexec: list[str], root: Path, recorder, console: Console
           ) -> list[dict]:
    """Every point of the study, P ascending (so each P = 1 row is there before the rows it
    is the baseline of); rows added with their efficiency as they finish. The runs."""
    runs: list[dict] = []
    base: dict[tuple, dict] = {}  # (mode, backend, comm) -> its P = 1 rows by workload
    stopped: set[tuple] = set()  # series ended by a point that failed to run
    for mode, comm, p, backend in itertools.product(plan["modes"], plan["comms"],
                                                    plan["ranks"], plan["backends"]):
        key = (mode, backend, comm)
        if key in stopped:
            continue
        status, rows = _launch(args, plan, mpiexec, root, console, runs, mode, backend, comm,
                               p, plan["partitions"][0])
        if status == "failed":
            stopped.add(key)
        if p == 1:
            base[key] = {r["workload"]: r for r in rows}
        recorder.extend(study.with_efficiency(mode, rows, base.get(key, {})))
    return runs


def _tradeoff(args, plan: dict, mpiexec: list[str], root: Path, recorder, console: Console
              ) -> list[dict]:
    """Every point of the trade-off: per partition and backend, the P = 1 point (its rate),
    then the points at P; rows added as they finish (the model is added at the end). The
    runs."""
    runs: list[dict] = []
    (p,) = plan["ranks"]
    for partition, backend in itertools.product(plan["partitions"], plan["backends"]):
        label = "h{}_r{}_t{}".format(*partition)
        _, first = _launch(args, plan, mpiexec, root, console, runs, "strong", backend,
                           plan["comms"][0], 1, partition, label)
        rates = {r["workload"]: r["tflops_per_gpu"] for r in first if study.timed(r)}
        for mode, comm in itertools.product(plan["modes"], plan["comms"]):
            _, rows = _launch(args, plan, mpiexec, root, console, runs, mode, backend, comm, p,
                              partition, label)
            recorder.extend(study.tradeoff_fields(r, rates.get(r["workload"])) for r in rows)
    return runs


def _number(x: float | None, text) -> str:
    return "-" if x is None else text(x)


def _study_table(rows: list[dict]) -> Table:
    per = "GPU" if any(r.get("device") == "cuda" for r in rows) else "rank"
    table = Table(title="gemmlab study: TP scaling against the GEMM rate at P = 1")
    for col in ("workload", "mode", "backend", "comm", "P", f"P=1 FLOP/s/{per}", "step ms",
                "comm ms", "comm share", f"FLOP/s/{per}", "speedup", "efficiency", "check"):
        table.add_column(col, justify="left" if col in ("workload", "mode", "backend", "comm",
                                                         "check") else "right")
    for r in rows:
        table.add_row(r["workload"], r["mode"], r["backend"], r["comm"], str(r["P"]),
                      flops(r["p1_tflops_per_gpu"]),
                      _number(r.get("step_ms"), lambda x: f"{x:.3f}"),
                      _number(r.get("comm_ms"), lambda x: f"{x:.3f}"),
                      _number(r.get("comm_share"), lambda x: f"{x:.0%}"),
                      flops(r.get("tflops_per_gpu")),
                      _number(r["speedup"], lambda x: f"{x:.2f}"),
                      _number(r["efficiency"], lambda x: f"{x:.0%}"),
                      "PASS" if r["ok"] else "FAIL")
    return table


def _tradeoff_table(rows: list[dict]) -> Table:
    table = Table(title="gemmlab study --tradeoff: comm share against FLOP per byte, "
                  "measured and modelled")
    for col in ("workload", "mode", "backend", "comm", "P", "tokens", "hidden", "ffn",
                "FLOP/B", "step ms", "comm ms", "comm share", "busbw GB/s", "model compute ms",
                "model comm ms", "model share", "check"):
        table.add_column(col, justify="left" if col in ("workload", "mode", "backend", "comm",
                                                         "check") else "right")
    for r in rows:
        table.add_row(r["workload"], r["mode"], r["backend"], r["comm"], str(r["P"]),
                      str(r["tokens"]), str(r["hidden"]), str(r["ffn"]),
                      _number(r["flop_per_byte"], lambda x: f"{x:.3g}"),
                      _number(r.get("step_ms"), lambda x: f"{x:.3f}"),
                      _number(r.get("comm_ms"), lambda x: f"{x:.3f}"),
                      _number(r.get("comm_share"), lambda x: f"{x:.0%}"),
                      _number(r["busbw_GBps"], lambda x: f"{x:.3g}"),
                      _number(r["model_compute_ms"], lambda x: f"{x:.3f}"),
                      _number(r["model_comm_ms"], lambda x: f"{x:.3f}"),
                      _number(r["model_comm_share"], lambda x: f"{x:.0%}"),
                      "PASS" if r["ok"] else "FAIL")
    return table


def _describe(r: dict) -> str:
    name = f"{r['workload']} {r['mode']} {r['backend']} {r['comm']} P={r['P']}"
    if not study.timed(r):
        return f"{name}: FAIL"
    if "flop_per_byte" in r:
        return (f"{name} hidden {r['hidden']} ffn {r['ffn']} tokens {r['tokens']}: comm share "
                f"{r['comm_share']:.0%} at {r['flop_per_byte']:.3g} FLOP/B")
    efficiency = _number(r["efficiency"], lambda x: f"{x:.0%}")
    return f"{name}: {r['step_ms']:.3f} ms per step, efficiency {efficiency}"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab study``."""
    parser = subparsers.add_parser(
        "study", help="how a faster GEMM changes TP scaling: gemmlab scale for each GEMM "
        "backend and communicator over P; --tradeoff: comm share against FLOP per byte",
        description="Run gemmlab scale strong and weak under mpiexec -n P for each P, GEMM "
        "backend and communicator (every point checked before it is timed; FAIL points are "
        "kept and never used), then relate scaling efficiency and communication share to "
        "each backend's TFLOP/s per GPU at P = 1: table, chart, correlations. With --tradeoff, "
        "at one P, sweep the partition (--hidden, --ffn-ratio, --tokens lists) and set the "
        "measured comm share against FLOP per byte communicated beside an analytical model.")
    parser.add_argument("--workload", default="mlp,layer", help="comma list of mlp, layer")
    parser.add_argument("--mode", default="strong,weak", help="comma list of strong, weak")
    parser.add_argument("--ranks", default="1,2,4,8", help="comma list of P, 1 among them "
                        "(--tradeoff: one P >= 2)")
    parser.add_argument("--backend", help="comma list of GEMM backends (default: the ladder's "
                        "rungs for the dtype, triton_fused and the libraries; fp32: "
                        f"{','.join(study.default_backends('fp32'))}; fp16/bf16: "
                        f"{','.join(study.default_backends('bf16'))}); those that cannot run "
                        "here are skipped, with the reason")
    parser.add_argument("--comm", help="comma list of communicators (default nccl,symm on "
                        "GPUs, mpi,symm on CPUs)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="default cuda when a GPU is visible")
    parser.add_argument("--dtype", choices=TP, help="default bf16 on GPUs, fp32 on CPUs")
    parser.add_argument("--tokens", default="1024", help="rows of the activations (batch x "
                        "seq); a comma list with --tradeoff")
    parser.add_argument("--hidden", default="512", help="model width h; a comma list with "
                        "--tradeoff")
    parser.add_argument("--ffn-ratio", default="4", help="FFN width = ratio x h (weak: x P "
                        "as well); a comma list with --tradeoff")
    parser.add_argument("--heads", type=int, default=8,
                        help="attention heads of the layer (weak: at P = 1; x P at P)")
    parser.add_argument("--seq", type=int, default=256, help="sequence length of the layer")
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                        help="compute/communication overlap in the TP layers (--no-overlap "
                        "to compare with the trade-off model, which has none)")
    parser.add_argument("--chunks", type=int, default=4,
                        help="row chunks of the row-parallel GEMMs")
    parser.add_argument("--sm-margin", type=int, default=0,
                        help="GPU only: SMs the overlapped cuBLAS GEMMs leave free for NCCL")
    parser.add_argument("--iters", type=int, default=10, help="timed steps per point")
    parser.add_argument("--warmup-iters", type=int, default=3, help="warm-up steps per point")
    parser.add_argument("--tradeoff", action="store_true",
                        help="the compute/communication trade-off at one P (see --ranks)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per point")
    parser.add_argument("--mpiexec", help="launcher command with its flags (default "
                        "$GEMMLAB_MPIEXEC, else mpiexec, with --oversubscribe under Open MPI)")
    add_run_options(parser, "directory for results.jsonl (rows as they finish), results.json "
                    "(with the summary), results.csv and results.png; points/ holds each "
                    "gemmlab scale run (its results and log.txt)")
    parser.set_defaults(func=run)
    return parser
