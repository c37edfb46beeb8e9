"""``gemmlab tp``: check and time the TP layers, with the overlap report (``mpiexec -n P``)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ..session import launch_in_order, mpi_setup


def run(args: argparse.Namespace, console: Console) -> int:
    """Run under ``mpiexec -n P``: every rank is one TP rank of the layers."""
    launch_in_order()  # before MPI_Init, which may already initialise CUDA
    from mpi4py import MPI

    import tp.comm

    from .. import tp_bench
    from ..recording import collect_meta, write_results

    world, device, say = mpi_setup(args, console)
    comm_name = args.comm or ("nccl" if device.type == "cuda" else "mpi")
    comm = tp.comm.create(comm_name, world, device)
    self_comm = tp.comm.create("mpi", MPI.COMM_SELF, device)
    say(f"gemmlab tp: TP={world.Get_size()}, {device.type}, {args.dtype}, backend {args.backend}, "
        f"{comm.name}; M={args.tokens} tokens, hidden {args.hidden}, ratio {args.ratio}, "
        f"{args.chunks} chunks, SM margin {args.sm_margin}")
    rows = tp_bench.run(world, comm, self_comm, device, args.dtype, args.tokens, args.hidden,
                        args.ratio, args.backend, args.chunks, args.iters, args.warmup,
                        sm_margin=args.sm_margin)
    timed = Table(title="TP layers against the dense layers")
    for col in ("layer", "phase", "TP", "M", "N", "K", "dtype", "ms", "max rel err", "check"):
        timed.add_column(col, justify="left" if col in ("layer", "phase", "check") else "right")
    for r in rows:
        if "ms" in r:
            timed.add_row(r["layer"], r["phase"], str(r["tp"]), str(r["M"]), str(r["N"]),
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
    if world.Get_rank() == 0 and args.out:
        for path in write_results(args.out, collect_meta(), rows, tp_bench.plot):
            say(f"wrote {path}")
    failed = [r for r in rows if not r.get("ok", True)]
    say(f"{len(rows)} rows, {len(failed)} failed the check against the dense layers")
    return 1 if failed else 0




def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab tp``."""
    tpp = subparsers.add_parser("tp", help="check and time the TP layers, with the overlap report "
                         "(start with mpiexec -n P gemmlab tp ...)")
    tpp.add_argument("--tokens", type=int, default=1024, help="rows M of the activations")
    tpp.add_argument("--hidden", type=int, default=512, help="model width")
    tpp.add_argument("--ratio", type=float, default=4, help="MLP expansion: fc1 is hidden -> "
                     "ratio * hidden")
    tpp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    tpp.add_argument("--backend", default="cublas", help="backends.gemm backend")
    tpp.add_argument("--comm", help="mpi, ring or nccl (default nccl on GPUs, mpi on CPUs)")
    tpp.add_argument("--chunks", type=int, default=4, help="row chunks of the row-parallel GEMM")
    tpp.add_argument("--sm-margin", type=int, default=0,
                     help="SMs the overlapped cuBLAS GEMMs leave free for NCCL (cuBLASLt SM "
                     "count target; 0: all SMs)")
    tpp.add_argument("--iters", type=int, default=10)
    tpp.add_argument("--warmup", type=int, default=3)
    tpp.add_argument("--device", choices=("cpu", "cuda"))
    tpp.add_argument("--out", help="directory for results.json, results.csv, results.png")
    tpp.set_defaults(func=run)
    return tpp
