"""``gemmlab scale``: one point of a TP strong or weak scaling curve (engine: ``bench.scale``)."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from ..scale import CANNOT_RUN, MODES, RULES, WORKLOADS, measure, plot, problem
from ..session import csv_list, launch_in_order, mpi_setup


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab scale`` on the ``gemmlab`` command's subparsers."""
    scale = subparsers.add_parser(
        "scale", help="one point of a TP strong or weak scaling curve "
        "(mpiexec -n P gemmlab scale strong|weak ...)",
        description="Check, then time forward + backward of the TP MLP block and transformer "
        "layer at TP = P (every rank of MPI_COMM_WORLD), with the communication alone; "
        "python3 -m bench.scale_series runs P = 1, 2, 4, 8 and merges the results.")
    scale.add_argument("mode", choices=MODES, help="strong: the same global sizes at every P; "
                       "weak: ffn and heads grow with P, so each rank's share stays the P = 1 "
                       "problem")
    scale.add_argument("--workload", default="mlp,layer", help="comma list of mlp, layer")
    scale.add_argument("--tokens", type=int, default=1024, help="rows of the activations "
                       "(batch x seq)")
    scale.add_argument("--hidden", type=int, default=512, help="model width h")
    scale.add_argument("--ffn-ratio", type=int, default=4,
                       help="FFN width = ratio x h (weak: x P as well)")
    scale.add_argument("--heads", type=int, default=8,
                       help="attention heads of the layer (weak: at P = 1; x P at P)")
    scale.add_argument("--seq", type=int, default=256, help="sequence length of the layer")
    scale.add_argument("--dtype", choices=("fp32", "bf16", "fp16"),
                       help="default bf16 on GPUs, fp32 on CPUs")
    scale.add_argument("--backend", default="cublas", help="backends.gemm backend")
    scale.add_argument("--comm", help="mpi, ring or nccl (default nccl on GPUs, mpi on CPUs)")
    scale.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                       help="compute/communication overlap in the TP layers")
    scale.add_argument("--chunks", type=int, default=4,
                       help="row chunks of the row-parallel GEMMs")
    scale.add_argument("--sm-margin", type=int, default=0,
                       help="SMs the overlapped cuBLAS GEMMs leave free for NCCL")
    scale.add_argument("--iters", type=int, default=10, help="timed steps")
    scale.add_argument("--warmup", type=int, default=3, help="warm-up steps")
    scale.add_argument("--device", choices=("cpu", "cuda"))
    scale.add_argument("--out", help="directory for results.json, results.csv, results.png")
    scale.set_defaults(func=run)
    return scale


def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab scale``: 0 when every workload passed its check, 1 when one failed, 2 for
    bad arguments or sizes, ``CANNOT_RUN`` when a node has more ranks than GPUs."""
    launch_in_order()  # before MPI_Init, which may already initialise CUDA
    from mpi4py import MPI

    import backends
    import tp.comm
    from tp.mpi import local_rank

    from ..recording import collect_meta, write_results
    from ..tp_bench import DTYPES

    world, device, say = mpi_setup(args, console)
    p = world.Get_size()
    if device.type == "cuda" and world.allreduce(
            local_rank(world) >= torch.cuda.device_count(), op=MPI.MAX):
        say(f"cannot run: {p} ranks but {torch.cuda.device_count()} GPUs per node "
            f"(ranks would share GPUs)")
        return CANNOT_RUN
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    comm_name = args.comm or ("nccl" if device.type == "cuda" else "mpi")
    try:
        workloads = csv_list(args.workload)
        if unknown := [w for w in workloads if w not in WORKLOADS]:
            raise ValueError(f"unknown workload {', '.join(unknown)}; known: "
                             f"{', '.join(WORKLOADS)}")
        if args.backend not in backends.BACKENDS:
            raise ValueError(f"unknown backend {args.backend}; known: "
                             f"{', '.join(backends.BACKENDS)}")
        if args.chunks < 1 or args.sm_margin < 0 or args.iters < 1 or args.warmup < 0:
            raise ValueError("--chunks and --iters must be >= 1, --sm-margin and --warmup >= 0")
        problems = [problem(w, args.mode, p, args.tokens, args.hidden, args.ffn_ratio,
                            args.heads, args.seq) for w in workloads]
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    comm = tp.comm.create(comm_name, world, device)
    if comm.reduce_dtypes is not None and DTYPES[dtype_name] not in comm.reduce_dtypes:
        say(f"error: the {comm.name} communicator cannot sum {dtype_name}")
        return 2
    self_comm = tp.comm.create("mpi", MPI.COMM_SELF, device)
    settings = {"backend": args.backend, "overlap": args.overlap, "chunks": args.chunks,
                "sm_margin": args.sm_margin}
    say(f"gemmlab scale {args.mode}: TP={p}, {device.type}, {dtype_name}, backend "
        f"{args.backend}, {comm.name}, overlap {'on' if args.overlap else 'off'}, "
        f"{args.chunks} chunks, SM margin {args.sm_margin}; {RULES[args.mode]}")
    rows = [measure(prob, args.mode, world, comm, self_comm, device, dtype_name, settings,
                    args.iters, args.warmup) for prob in problems]
    comm.close()
    table = Table(title=f"gemmlab scale {args.mode}, P = {p}, {dtype_name}, {device.type}")
    for col in ("workload", "P", "tokens", "hidden", "ffn", "heads", "step ms", "comm ms",
                "comm share", "TFLOP/s/GPU", "rel err", "check"):
        table.add_column(col, justify="left" if col in ("workload", "check") else "right")
    for r in rows:
        timed = "step_ms" in r
        table.add_row(r["workload"], str(r["P"]), str(r["tokens"]), str(r["hidden"]),
                      str(r["ffn"]), "-" if r["heads"] is None else str(r["heads"]),
                      f"{r['step_ms']:.3f}" if timed else "-",
                      f"{r['comm_ms']:.3f}" if timed else "-",
                      f"{r['comm_share']:.0%}" if timed else "-",
                      f"{r['tflops_per_gpu']:.3g}" if timed else "-",
                      f"{r['max_rel_err']:.1e}", "PASS" if r["ok"] else "FAIL")
    say(table)
    if world.Get_rank() == 0 and args.out:
        for path in write_results(args.out, collect_meta(), rows, plot):
            say(f"wrote {path}")
    failed = [r["workload"] for r in rows if not r["ok"]]
    if failed:
        say(f"FAIL {', '.join(failed)}: output or input gradient off the TP = 1 fp32 "
            f"reference; not timed")
    return 1 if failed else 0


