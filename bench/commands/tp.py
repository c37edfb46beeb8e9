"""``gemmlab tp``: check and time the TP layers, with the overlap report (``mpiexec -n P``)."""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.table import Table

from backends.dtypes import TP

from ..session import (
    UsageError,
    add_layer_options,
    add_run_options,
    check_comm,
    check_cuda_graph,
    check_gemm_backend,
    default_comm,
    mpi_setup,
    row_printer,
)


def _check(args) -> None:
    """The arguments' own checks (no rank count needed); raises UsageError."""
    if (min(args.tokens, args.hidden, args.chunks, args.iters) < 1
            or not (args.ffn_ratio > 0 and math.isfinite(args.ffn_ratio))):
        raise UsageError("--tokens, --hidden, --chunks and --iters must be >= 1, "
                         "--ffn-ratio a finite number > 0")
    if args.warmup_iters < 0 or args.sm_margin < 0:
        raise UsageError("--warmup-iters and --sm-margin must be >= 0")


def run(args: argparse.Namespace, console: Console) -> int:
    """Run under ``mpiexec -n P``: every rank is one TP rank of the layers. 0 when every row
    passed its check against the dense layers, 1 when one failed, 2 for a mistake in the
    arguments."""
    def check(device_type: str, ranks: int) -> None:
        _check(args)
        inner = args.hidden * args.ffn_ratio
        if inner != int(inner) or int(inner) % ranks:
            raise UsageError(f"--ffn-ratio x --hidden = {inner:g} must be a whole multiple of "
                             f"the TP size {ranks}")
        if args.sequence_parallel and args.tokens % ranks:
            raise UsageError(f"--sequence-parallel needs --tokens ({args.tokens}) divisible by "
                             f"the TP size {ranks}")
        check_gemm_backend(args.backend, args.dtype, device_type)
        comm = args.comm or default_comm(device_type)
        check_comm(comm, args.dtype, device_type)
        if args.cuda_graph:
            check_cuda_graph(device_type, comm)

    setup = mpi_setup(args, console, check)
    if isinstance(setup, int):
        return setup
    world, device, say = setup
    from mpi4py import MPI

    import tp.comm

    from .. import tp_bench
    from ..recording import Recorder

    comm = tp.comm.create(args.comm or default_comm(device.type), world, device)
    self_comm = tp.comm.create("mpi", MPI.COMM_SELF, device)
    margin = f", SM margin {args.sm_margin}" if device.type == "cuda" else ""
    say(f"gemmlab tp: TP={world.Get_size()}, {device.type}, {args.dtype}, backend {args.backend}, "
        f"{comm.name}; M={args.tokens} tokens, hidden {args.hidden}, ratio {args.ffn_ratio:g}, "
        f"{args.chunks} chunks{margin}", highlight=False)
    recorder = Recorder(args.out, tp_bench.plot,
                        row_printer(console, _describe) if world.Get_rank() == 0 else None,
                        comm=world)
    tp_bench.run(world, comm, self_comm, device, args.dtype, args.tokens, args.hidden,
                 args.ffn_ratio, args.backend, args.chunks, args.iters, args.warmup_iters,
                 sm_margin=args.sm_margin, sequence_parallel=args.sequence_parallel,
                 cuda_graph=args.cuda_graph, record=recorder.add)
    rows = recorder.rows
    timed = Table(title="TP layers against the dense layers")
    for col in ("layer", "phase", "timing", "TP", "M", "N", "K", "dtype", "ms", "max rel err",
                "check"):
        timed.add_column(col, justify="left" if col in ("layer", "phase", "timing", "check")
                         else "right")
    for r in rows:
        if "ms" in r:
            timed.add_row(r["layer"], r["phase"], "CUDA graph" if r.get("cuda_graph") else
                          "eager", str(r["tp"]), str(r["M"]), str(r["N"]),
                          str(r["K"]), r["dtype"], "-" if r["ms"] is None else f"{r['ms']:.3f}",
                          f"{r['max_rel_err']:.1e}", "PASS" if r["ok"] else "FAIL")
    say(timed)
    lapped = Table(title="compute/communication overlap (ms)")
    for col in ("layer", "phase", "chunks", "compute", "comm", "serial", "overlapped",
                "efficiency", "comm hidden", "max rel err", "check"):
        lapped.add_column(col, justify="left" if col in ("layer", "phase", "check") else "right")
    for r in rows:
        if "overlap_efficiency" in r:
            times = ((f"{r[k]:.3f}" for k in ("compute_ms", "comm_ms", "serial_ms",
                                              "overlapped_ms")) if r["ok"] else ["-"] * 4)
            shares = ((f"{r['overlap_efficiency']:.0%}", f"{r['comm_hidden']:.0%}")
                      if r["ok"] else ("-", "-"))
            lapped.add_row(r["layer"], r["phase"], str(r["chunks"]), *times, *shares,
                           f"{r['max_rel_err']:.1e}", "PASS" if r["ok"] else "FAIL")
    say(lapped)
    for path in recorder.finish():
        say(f"wrote {path}")
    failed = [r for r in rows if not r.get("ok", True)]
    say(f"{len(rows)} rows, {len(failed)} failed the check against the dense layers")
    return 1 if failed else 0


def _describe(r: dict) -> str:
    what = f"{r['layer']} {r['phase']}{' (CUDA graph)' if r.get('cuda_graph') else ''}"
    if not r.get("ok", True):
        return f"{what}: FAIL"
    ms = r.get("ms", r.get("overlapped_ms"))
    return f"{what}: {'-' if ms is None else f'{ms:.3f} ms'}"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab tp``."""
    tpp = subparsers.add_parser("tp", help="check and time the TP layers, with the overlap "
                                "report (start with mpiexec -n P gemmlab tp ...)")
    tpp.add_argument("--tokens", type=int, default=1024, help="rows M of the activations")
    tpp.add_argument("--hidden", type=int, default=512, help="model width")
    tpp.add_argument("--ffn-ratio", type=float, default=4, help="MLP expansion: fc1 is "
                     "hidden -> ratio * hidden")
    tpp.add_argument("--dtype", choices=TP, default="fp32")
    tpp.add_argument("--cuda-graph", action="store_true",
                     help="add the MLP block (and with --sequence-parallel the SP block) "
                     "captured into one CUDA graph and replayed (a stream-ordered communicator: "
                     "nccl, symm, ring or ring/nccl)")
    tpp.add_argument("--sequence-parallel", action="store_true",
                     help="add the sequence-parallel rows: the block on each rank's token "
                     "block, and AG+GEMM / GEMM+RS as compute, comm, serial, overlapped")
    add_layer_options(tpp, "iterations")
    add_run_options(tpp)
    tpp.set_defaults(func=run)
    return tpp
