"""``gemmlab comm``: nccl-tests-style sweep of the collectives (``mpiexec -n P``)."""

from __future__ import annotations

import argparse
import itertools

from rich.console import Console
from rich.table import Table

from backends.dtypes import COMM, parse

from ..session import UsageError, add_run_options, csv_list, mpi_setup

GPU_ONLY = ("ring/nccl", "nccl", "nccl_direct")  # communicators that need --device cuda


def default_comms(device_type: str) -> str:
    """``--comm`` when not given: every communicator that runs on the device."""
    return ("nccl_direct,nccl,symm,ring,ring/mpi,mpi" if device_type == "cuda"
            else "mpi,ring,symm")


def _check(args, device_type: str) -> None:
    """The arguments' checks, on every rank before any work; raises UsageError (the first
    mistake found)."""
    import tp.comm

    from .. import comm_bench as cb

    names = csv_list(args.comm or default_comms(device_type))
    for kind, given, known in (("op", csv_list(args.op), tuple(cb.COLLECTIVES)),
                               ("communicator", names, (*tp.comm.BACKENDS, "nccl_direct")),
                               ("--call-check", csv_list(args.call_check), ("on", "off")),
                               ("--timing", csv_list(args.timing), cb.TIMINGS)):
        if not given:
            raise UsageError(f"no {kind} given; known: {', '.join(known)}")
        if bad := [x for x in given if x not in known]:
            raise UsageError(f"unknown {kind} {', '.join(bad)}; known: {', '.join(known)}")
    try:
        parse(args.dtype, COMM)
        cb.sizes(cb.parse_bytes(args.min_bytes), cb.parse_bytes(args.max_bytes),
                 args.step_factor)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.iters < 1 or args.warmup_iters < 0 or args.check_every < 0:
        raise UsageError(f"-n/--iters must be >= 1, -w/--warmup-iters and -c/--check-every "
                         f">= 0; got {args.iters}, {args.warmup_iters}, {args.check_every}")
    if device_type != "cuda" and (gpu := [x for x in names if x in GPU_ONLY]):
        raise UsageError(f"--comm {', '.join(gpu)} needs GPUs (--device cuda)")
    if device_type != "cuda" and "graph" in csv_list(args.timing):
        raise UsageError("--timing graph captures CUDA graphs: it needs --device cuda")


def run(args: argparse.Namespace, console: Console) -> int:
    """Run under ``mpiexec -n P``; rank 0 prints and writes, every rank measures. 0 when
    every element was right, 1 when one was wrong, 2 for a mistake in the arguments."""
    setup = mpi_setup(args, console, lambda device_type, ranks: _check(args, device_type))
    if isinstance(setup, int):
        return setup
    world, device, say = setup
    import tp.comm

    from .. import comm_bench as cb
    from ..recording import Recorder

    names = csv_list(args.comm or default_comms(device.type))
    ops = csv_list(args.op)
    call_checks = csv_list(args.call_check)
    steps = cb.sizes(cb.parse_bytes(args.min_bytes), cb.parse_bytes(args.max_bytes),
                     args.step_factor)
    dtype = parse(args.dtype, COMM).torch
    say(f"gemmlab comm: {world.Get_size()} ranks, {device.type}, {args.dtype}, "
        f"{args.iters} iterations after {args.warmup_iters} warm-up", highlight=False)
    comms = {}
    for name in names:
        if name == "nccl_direct":
            comms[name] = cb.DirectNccl(world, device)
            continue
        for setting in call_checks:
            label = name if call_checks == ["on"] else f"{name} (call check {setting})"
            comms[label] = tp.comm.create(name, world, device, check=setting == "on")
    recorder = Recorder(args.out, cb.plot, comm=world)
    for op, (label, comm), timing in itertools.product(ops, comms.items(),
                                                       csv_list(args.timing)):
        if not cb.supports(comm, op, dtype, timing):
            say(f"skipped {op} on {label}, {timing}: not supported for {args.dtype}"
                + (" (a CUDA graph needs a stream-ordered communicator)"
                   if timing == "graph" and not comm.stream_ordered else ""))
            continue
        table = Table(title=f"{op} | {label} | {timing} | {world.Get_size()} ranks | "
                      f"{args.dtype} | {device.type}")
        for col in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)",
                    "busbw (GB/s)", "#wrong"):
            table.add_column(col, justify="right")
        try:
            for size in steps:
                r = cb.measure(comm, op, size, dtype, device, world, args.iters,
                               args.warmup_iters, args.check_every, args.seed, timing)
                if r is None:
                    continue
                timed = ((f"{r['time_us']:.1f}", f"{r['algbw']:.2f}", f"{r['busbw']:.2f}")
                         if r["ok"] else ("FAIL", "-", "-"))
                table.add_row(str(r["bytes"]), str(r["count"]), r["dtype"], *timed,
                              str(r["wrong"]))
                recorder.add(r)  # per size: a Ctrl-C stops the ranks at the next one
        finally:
            say(table)  # the sizes that finished, an interrupted block's too
    for comm in comms.values():
        comm.close()
    rows = recorder.rows
    for path in recorder.finish():
        say(f"wrote {path}")
    wrong = sum(r["wrong"] for r in rows)
    say(f"{len(rows)} measurements, {wrong} wrong elements")
    return 1 if wrong else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab comm``."""
    comm = subparsers.add_parser("comm", help="nccl-tests-style sweep of the collectives "
                                 "(start with mpiexec -n P gemmlab comm ...)",
                                 description="Check, then time, collectives over a size sweep "
                                 "on every rank of MPI_COMM_WORLD; rank 0 prints and writes "
                                 "the results. The one-letter options are nccl-tests'.")
    comm.add_argument("-b", "--min-bytes", default="1K", help="smallest size (default 1K)")
    comm.add_argument("-e", "--max-bytes", default="16M", help="largest size (default 16M)")
    comm.add_argument("-f", "--step-factor", type=int, default=2,
                      help="size multiplier (default 2)")
    comm.add_argument("-n", "--iters", type=int, default=20,
                      help="timed iterations per size (default 20)")
    comm.add_argument("-w", "--warmup-iters", type=int, default=5,
                      help="warm-up iterations (default 5)")
    comm.add_argument("-c", "--check-every", type=int, default=0, metavar="N",
                      help="check the output again after every N timed iterations, outside "
                      "the timing (default 0: the first call only, which is always checked)")
    comm.add_argument("--op", default="all_reduce",
                      help="comma list of all_reduce, all_gather, reduce_scatter, all_to_all, "
                      "broadcast")
    comm.add_argument("--comm", help="communicators: comma list of mpi, ring, ring/mpi, "
                      "ring/nccl, nccl, symm, nccl_direct (default: all that run on the "
                      "device)")
    comm.add_argument("--dtype", default="fp32", help=f"{', '.join(COMM)} (default fp32)")
    comm.add_argument("--device", choices=("cpu", "cuda"),
                      help="where the buffers live (default: cuda when a GPU is visible)")
    comm.add_argument("--call-check", default="on",
                      help="comma list of on, off: gemmlab communicators with and without "
                      "the ranks' call check (tp.comm.create's check=); both measure its cost")
    comm.add_argument("--timing", default="eager",
                      help="comma list of eager (back-to-back calls: call time, host "
                      "included) and graph (the -n calls captured into one CUDA graph and "
                      "replayed: GPU time; stream-ordered communicators; nccl-tests' -G)")
    comm.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    add_run_options(comm)
    comm.set_defaults(func=run)
    return comm
