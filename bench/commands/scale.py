"""``gemmlab scale``: one point of a TP strong or weak scaling curve (engine: ``bench.scale``)."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from backends.dtypes import TP

from ..scale import MODES, RULES, WORKLOADS, measure, plot, problem
from ..session import (
    CANNOT_RUN,
    UsageError,
    add_layer_options,
    add_run_options,
    check_comm,
    check_cuda_graph,
    check_gemm_backend,
    csv_list,
    default_comm,
    mpi_setup,
    row_printer,
)
from ..style import flops


def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab scale``: 0 when every workload passed its check, 1 when one failed, 2 for
    bad arguments or sizes, ``CANNOT_RUN`` when a node has more ranks than GPUs."""
    def check(device_type: str, ranks: int) -> None:
        dtype_name = args.dtype or ("bf16" if device_type == "cuda" else "fp32")
        workloads = csv_list(args.workload)
        if not workloads:
            raise UsageError(f"--workload {args.workload!r} lists no workload")
        if unknown := [w for w in workloads if w not in WORKLOADS]:
            raise UsageError(f"unknown workload {', '.join(unknown)}; known: "
                             f"{', '.join(WORKLOADS)}")
        if args.chunks < 1 or args.sm_margin < 0 or args.iters < 1 or args.warmup_iters < 0:
            raise UsageError("--chunks and --iters must be >= 1, --sm-margin and "
                             "--warmup-iters >= 0")
        try:
            for w in workloads:
                problem(w, args.mode, ranks, args.tokens, args.hidden, args.ffn_ratio,
                        args.heads, args.seq, args.sequence_parallel)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        check_gemm_backend(args.backend, dtype_name, device_type)
        comm = args.comm or default_comm(device_type)
        check_comm(comm, dtype_name, device_type)
        if args.cuda_graph:
            check_cuda_graph(device_type, comm)

    setup = mpi_setup(args, console, check)
    if isinstance(setup, int):
        return setup
    world, device, say = setup
    from mpi4py import MPI

    import tp.comm
    from tp.mpi import local_rank

    from ..recording import Recorder

    p = world.Get_size()
    if device.type == "cuda" and world.allreduce(
            local_rank(world) >= torch.cuda.device_count(), op=MPI.MAX):
        say(f"cannot run: {p} ranks but {torch.cuda.device_count()} GPUs per node "
            f"(ranks would share GPUs)")
        return CANNOT_RUN
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    problems = [problem(w, args.mode, p, args.tokens, args.hidden, args.ffn_ratio, args.heads,
                        args.seq, args.sequence_parallel) for w in csv_list(args.workload)]
    comm = tp.comm.create(args.comm or default_comm(device.type), world, device)
    self_comm = tp.comm.create("mpi", MPI.COMM_SELF, device)
    settings = {"backend": args.backend, "overlap": args.overlap, "chunks": args.chunks,
                "sm_margin": args.sm_margin, "sequence_parallel": args.sequence_parallel}
    margin = f", SM margin {args.sm_margin}" if device.type == "cuda" else ""
    extras = "".join(f", {what}" for what, on in (("sequence parallel", args.sequence_parallel),
                                                  ("CUDA graph", args.cuda_graph)) if on)
    say(f"gemmlab scale {args.mode}: TP={p}, {device.type}, {dtype_name}, backend "
        f"{args.backend}, {comm.name}, overlap {'on' if args.overlap else 'off'}, "
        f"{args.chunks} chunks{margin}{extras}; {RULES[args.mode]}", highlight=False)
    recorder = Recorder(args.out, plot, row_printer(console, _describe, len(problems))
                        if world.Get_rank() == 0 else None, comm=world)
    for prob in problems:
        recorder.add(measure(prob, args.mode, world, comm, self_comm, device, dtype_name,
                             settings, args.iters, args.warmup_iters,
                             cuda_graph=args.cuda_graph))
    comm.close()
    rows = recorder.rows
    per = "/GPU" if device.type == "cuda" else "/rank"
    table = Table(title=f"gemmlab scale {args.mode}, P = {p}, {dtype_name}, {device.type}")
    graph = ("graph step ms",) if args.cuda_graph else ()
    for col in ("workload", "P", "tokens", "hidden", "ffn", "heads", "step ms", *graph,
                "comm ms", "comm share", f"FLOP/s{per}", "rel err", "dense err", "check"):
        table.add_column(col, justify="left" if col in ("workload", "check") else "right")
    for r in rows:
        timed = "step_ms" in r
        graphed = (f"{r['graph_step_ms']:.3f}" if r["graph_step_ms"] is not None else "-",
                   ) if args.cuda_graph else ()
        table.add_row(r["workload"], str(r["P"]), str(r["tokens"]), str(r["hidden"]),
                      str(r["ffn"]), "-" if r["heads"] is None else str(r["heads"]),
                      f"{r['step_ms']:.3f}" if timed else "-", *graphed,
                      f"{r['comm_ms']:.3f}" if timed else "-",
                      f"{r['comm_share']:.0%}" if timed else "-",
                      flops(r["tflops_per_gpu"]) if timed else "-",
                      f"{r['max_rel_err']:.1e}", f"{r['dense_max_rel_err']:.1e}",
                      "PASS" if r["ok"] else "FAIL")
    say(table)
    for path in recorder.finish():
        say(f"wrote {path}")
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        why = (f"the CUDA graph: {r.get('graph_error', 'its replay was off the reference')}"
               if "step_ms" in r else "output or a gradient off the TP = 1 fp32 reference "
               "by more than the tolerance and twice the dense run's error")
        say(f"FAIL {r['workload']}: {why}; not timed")
    return 1 if failed else 0


def _describe(r: dict) -> str:
    if not r["ok"]:
        return f"{r['workload']} P={r['P']}: FAIL"
    return f"{r['workload']} P={r['P']}: {r['step_ms']:.3f} ms per step"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab scale``."""
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
    scale.add_argument("--dtype", choices=TP, help="default bf16 on GPUs, fp32 on CPUs")
    scale.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                       help="compute/communication overlap in the TP layers")
    scale.add_argument("--sequence-parallel", action="store_true",
                       help="Megatron-LM sequence parallelism: token blocks between layers, "
                       "AG+GEMM and GEMM+RS (needs P to divide --tokens)")
    scale.add_argument("--cuda-graph", action="store_true",
                       help="also time the step captured into one CUDA graph and replayed "
                       "(CUDA; nccl, symm, ring or ring/nccl)")
    add_layer_options(scale, "steps")
    add_run_options(scale)
    scale.set_defaults(func=run)
    return scale
