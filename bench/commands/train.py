"""``gemmlab train``: a small GPT trained with DP x TP (``mpiexec -n P``)."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ..session import launch_in_order, mpi_setup


def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab train`` (one process) or ``mpiexec -n P gemmlab train --tp T --dp D``."""
    launch_in_order()  # before MPI_Init, which may already initialise CUDA
    import json
    import statistics

    import tp.comm
    from tp.grid import ProcessGrid
    from tp.train import train
    from tp.transformer import GPTConfig

    from ..recording import collect_meta, write_results

    world, device, say = mpi_setup(args, console)
    size = world.Get_size()
    dp = args.dp or size // max(args.tp, 1)
    if args.tp < 1 or args.tp * dp != size:
        say(f"error: --tp {args.tp} x --dp {dp} must equal the {size} ranks")
        return 2
    grid = ProcessGrid.create(args.tp, world)
    comm_name = args.comm or ("nccl" if device.type == "cuda" else "mpi")
    tp_comm = tp.comm.create(comm_name, grid.tp_comm, device)
    dp_comm = tp.comm.create(comm_name, grid.dp_comm, device)
    config = GPTConfig(seq_len=args.seq, hidden=args.hidden, heads=args.heads, layers=args.layers)
    label = f"DP {dp} x TP {args.tp}"
    say(f"gemmlab train: {label}, {device.type}, {args.dtype}, backend {args.backend}, "
        f"{tp_comm.name}; {config}")
    every = max(1, args.steps // 10)

    def log(step, loss, ms):
        if step % every == 0 or step == args.steps - 1:
            say(f"step {step:5d}  loss {loss:.4f}  {ms:8.1f} ms")

    result = train(config, tp_comm, dp_comm, steps=args.steps, batch=args.batch, lr=args.lr,
                   seed=args.seed, device=device, dtype={"fp32": torch.float32,
                                                         "bf16": torch.bfloat16}[args.dtype],
                   backend=args.backend, overlap=not args.no_overlap, log=log)
    timed = result.step_ms[1:] or result.step_ms  # the first step includes compilation
    summary = {"configuration": label, "tp": args.tp, "dp": dp, "device": device.type,
               "dtype": args.dtype, "backend": args.backend, "comm": tp_comm.name,
               "steps": args.steps, "ms_per_step": statistics.median(timed),
               "tokens_per_s": args.batch * args.seq / (statistics.median(timed) / 1e3),
               "final_loss": result.loss[-1]}
    runs = [summary]
    reference = None
    if args.reference:
        reference = json.loads(Path(args.reference).read_text())
        runs.append(reference["summary"])
        diff = max(abs(a - b) for a, b in zip(result.loss, reference["loss"]))
        summary["max_loss_diff_vs_reference"] = diff
    table = Table(title="run time per configuration")
    for col in ("configuration", "device", "dtype", "backend", "comm", "steps", "ms/step",
                "tokens/s", "final loss"):
        table.add_column(col, justify="left" if col in ("configuration", "device", "dtype",
                                                        "backend", "comm") else "right")
    for run in runs:
        table.add_row(run["configuration"], run["device"], run["dtype"], run["backend"],
                      run["comm"], str(run["steps"]), f"{run['ms_per_step']:.1f}",
                      f"{run['tokens_per_s']:.0f}", f"{run['final_loss']:.4f}")
    say(table)
    if reference is not None:
        say(f"largest |loss - reference loss| over {len(reference['loss'])} steps: "
            f"{summary['max_loss_diff_vs_reference']:.2e}")
    if world.Get_rank() == 0 and args.out:
        from ..train_plot import plot_loss

        rows = [{"step": i, "loss": loss, "ms": ms}
                for i, (loss, ms) in enumerate(zip(result.loss, result.step_ms))]
        extra = {"loss": result.loss, "summary": summary}
        if reference is not None:
            extra["reference"] = {"configuration": reference["summary"]["configuration"],
                                  "loss": reference["loss"]}
        plot = functools.partial(plot_loss, label=label, reference=extra.get("reference"))
        for path in write_results(args.out, collect_meta(), rows, plot, **extra):
            say(f"wrote {path}")
    return 0




def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab train``."""
    tr = subparsers.add_parser("train", help="train a small GPT with DP x TP "
                        "(mpiexec -n P gemmlab train --tp T --dp D)")
    tr.add_argument("--tp", type=int, default=1, help="TP size")
    tr.add_argument("--dp", type=int, help="DP size (default: ranks / TP)")
    tr.add_argument("--steps", type=int, default=50)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    tr.add_argument("--seq", type=int, default=64, help="sequence length (bytes)")
    tr.add_argument("--hidden", type=int, default=128)
    tr.add_argument("--heads", type=int, default=4)
    tr.add_argument("--layers", type=int, default=2)
    tr.add_argument("--lr", type=float, default=3e-3)
    tr.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    tr.add_argument("--backend", default="cublas", help="backends.gemm backend of the TP layers")
    tr.add_argument("--comm", help="mpi, ring or nccl (default nccl on GPUs, mpi on CPUs)")
    tr.add_argument("--no-overlap", action="store_true", help="no compute/communication overlap")
    tr.add_argument("--device", choices=("cpu", "cuda"))
    tr.add_argument("--reference", help="results.json of another run to compare the loss with")
    tr.add_argument("--out", help="directory for results.json (with a loss list), .csv, .png")
    tr.set_defaults(func=run)
    return tr
