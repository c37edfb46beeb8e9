"""``gemmlab comm``: nccl-tests-style sweep of the collectives (``mpiexec -n P``)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ..session import csv_list, mpi_setup


def run(args: argparse.Namespace, console: Console) -> int:
    """Run under ``mpiexec -n P``; rank 0 prints and writes, every rank measures."""
    import tp.comm

    from .. import comm_bench as cb
    from ..recording import collect_meta, write_results

    world, device, say = mpi_setup(args, console)
    default_backends = "nccl_direct,nccl,ring,ring/mpi,mpi" if device.type == "cuda" else "mpi,ring"
    names = csv_list(args.backend or default_backends)
    ops = csv_list(args.op)
    try:
        steps = cb.sizes(cb.parse_bytes(args.minbytes), cb.parse_bytes(args.maxbytes),
                         args.stepfactor)
        unknown = [x for x in ops if x not in cb.COLLECTIVES]
        unknown += [x for x in names if x not in (*tp.comm.BACKENDS, "nccl_direct")]
        unknown += [] if args.dtype in cb.DTYPES else [args.dtype]
        call_checks = csv_list(args.call_check)
        unknown += [x for x in call_checks if x not in ("on", "off")]
        if args.check_every < 0:
            raise ValueError(f"-c must be >= 0; got {args.check_every}")
        if unknown:
            raise ValueError(f"unknown {', '.join(unknown)}; ops: {', '.join(cb.COLLECTIVES)}; "
                             f"backends: {', '.join((*tp.comm.BACKENDS, 'nccl_direct'))}; "
                             f"dtypes: {', '.join(cb.DTYPES)}; --call-check: on, off")
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    dtype = cb.DTYPES[args.dtype]
    say(f"gemmlab comm: {world.Get_size()} ranks, {device.type}, {args.dtype}, "
        f"{args.iters} iterations after {args.warmup_iters} warm-up")
    comms = {}
    for name in names:
        if name == "nccl_direct":
            comms[name] = cb.DirectNccl(world, device)
            continue
        for setting in call_checks:
            label = name if call_checks == ["on"] else f"{name} (call check {setting})"
            comms[label] = tp.comm.create(name, world, device, check=setting == "on")
    rows = []
    for op in ops:
        for label, comm in comms.items():
            if not cb.supports(comm, op, dtype):
                say(f"skipped {op} on {label}: not supported for {args.dtype}")
                continue
            block = [row for size in steps
                     if (row := cb.measure(comm, op, size, dtype, device, world, args.iters,
                                           args.warmup_iters, args.check_every,
                                           args.seed)) is not None]
            rows += block
            table = Table(title=f"{op} | {label} | {world.Get_size()} ranks | {args.dtype} | "
                          f"{device.type}")
            for col in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)",
                        "busbw (GB/s)", "#wrong"):
                table.add_column(col, justify="right")
            for r in block:
                timed = ((f"{r['time_us']:.1f}", f"{r['algbw']:.2f}", f"{r['busbw']:.2f}")
                         if r["ok"] else ("FAIL", "-", "-"))
                table.add_row(str(r["bytes"]), str(r["count"]), r["dtype"], *timed,
                              str(r["wrong"]))
            say(table)
    for comm in comms.values():
        comm.close()
    wrong = sum(r["wrong"] for r in rows)
    if world.Get_rank() == 0 and args.out:
        for path in write_results(args.out, collect_meta(), rows, cb.plot):
            say(f"wrote {path}")
    say(f"{len(rows)} measurements, {wrong} wrong elements")
    return 1 if wrong else 0




def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab comm``."""
    comm = subparsers.add_parser("comm", help="nccl-tests-style sweep of the collectives "
                          "(start with mpiexec -n P gemmlab comm ...)",
                          description="Check, then time, collectives over a size sweep on every "
                          "rank of MPI_COMM_WORLD; rank 0 prints and writes the results.")
    comm.add_argument("-b", "--minbytes", default="1K", help="smallest size (default 1K)")
    comm.add_argument("-e", "--maxbytes", default="16M", help="largest size (default 16M)")
    comm.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier")
    comm.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    comm.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations")
    comm.add_argument("--op", default="all_reduce",
                      help="comma list of all_reduce, all_gather, reduce_scatter, all_to_all, "
                      "broadcast")
    comm.add_argument("--backend", help="comma list of mpi, ring, ring/mpi, ring/nccl, nccl, "
                      "nccl_direct (default: all that run on the device)")
    comm.add_argument("--dtype", default="float32", help="float32, float64, float16, "
                      "bfloat16, int32 or int64")
    comm.add_argument("--device", choices=("cpu", "cuda"),
                      help="where the buffers live (default: cuda when a GPU is visible)")
    comm.add_argument("-c", "--check-every", type=int, default=0, metavar="N",
                      help="check the output again after every N timed iterations, outside "
                      "the timing (default 0: the first call only, which is always checked)")
    comm.add_argument("--call-check", default="on",
                      help="comma list of on, off: gemmlab communicators with and without "
                      "the ranks' call check (tp.comm.create's check=); both measure its cost")
    comm.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    comm.add_argument("--out", help="directory for results.json, results.csv, results.png")
    comm.set_defaults(func=run)
    return comm
