"""``gemmlab train``: a small GPT trained with DP x TP (``mpiexec -n P``), optionally
sequence-parallel and captured into a CUDA graph, saved to checkpoints and resumed from them
(``tp.checkpoint``)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from backends.dtypes import DTYPES, TP

from ..recording import unwritable_ancestor
from ..session import (
    UsageError,
    add_layer_options,
    add_run_options,
    check_comm,
    check_cuda_graph,
    check_gemm_backend,
    default_comm,
    mpi_setup,
)


def _layout(args, ranks: int) -> tuple[int, int]:
    """(TP, DP) of the run; raises UsageError when they do not fill the ranks."""
    if args.tp < 1 or (args.dp is not None and args.dp < 1):
        raise UsageError("--tp and --dp must be >= 1")
    if args.dp is None:
        if ranks % args.tp:
            raise UsageError(f"--tp {args.tp} does not divide the {ranks} ranks")
        return args.tp, ranks // args.tp
    if args.tp * args.dp != ranks:
        raise UsageError(f"--tp {args.tp} x --dp {args.dp} must equal the {ranks} ranks")
    return args.tp, args.dp


def _reference(path: str) -> dict:
    """The ``results.json`` of another train run; raises UsageError when it is not one."""
    try:
        reference = json.loads(Path(path).read_text())
        reference["summary"]["configuration"], reference["loss"][0]  # noqa: B018
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise UsageError(f"--reference {path} is not the results.json of a gemmlab train run "
                         f"({type(exc).__name__}: {exc})") from None
    return reference


def _config(args):
    """The run's ``GPTConfig``."""
    from tp.transformer import GPTConfig

    return GPTConfig(seq_len=args.seq, hidden=args.hidden, heads=args.heads, layers=args.layers,
                     activation=args.activation)


def _check_checkpoints(args, settings: dict) -> int:
    """The checkpoint options' checks (``--resume``, ``--checkpoint``, ``--checkpoint-every``)
    against the run's ``settings`` (``tp.checkpoint.run_settings``); the step the run starts
    at.

    Raises:
        UsageError: no checkpoint at ``--resume``, one of another run or layout, one
            missing a file, or at a step that leaves nothing to do; ``--checkpoint-every``
            without ``--checkpoint`` or < 1; a ``--checkpoint`` that cannot be written or
            holds checkpoints past the start (without ``--overwrite``); either with
            ``--cuda-graph``.
    """
    from tp import checkpoint

    if args.cuda_graph and (args.checkpoint or args.resume):
        raise UsageError("--cuda-graph cannot be combined with --checkpoint or --resume "
                         "(capturable Adam's state lives in the graph)")
    if args.checkpoint_every is not None and (args.checkpoint_every < 1 or not args.checkpoint):
        raise UsageError(f"--checkpoint-every must be >= 1 and needs --checkpoint DIR; got "
                         f"{args.checkpoint_every}")
    start = 0
    if args.resume:
        try:
            found = checkpoint.find(args.resume)
            manifest = checkpoint.read_manifest(found)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--resume: {exc}") from None
        if problems := checkpoint.mismatches(manifest["settings"], settings):
            raise UsageError(f"--resume {found} was saved by another run or layout: "
                             + "; ".join(problems))
        if absent := checkpoint.missing(found, manifest):
            raise UsageError(f"--resume {found} is incomplete: no {', '.join(absent)}")
        start = manifest["step"]
        if start >= args.steps:
            raise UsageError(f"--resume {found} is at step {start}: --steps {args.steps} (the "
                             f"total, from step 0) leaves nothing to train")
    if args.checkpoint:
        path = Path(args.checkpoint)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--checkpoint {path} exists and is not a directory")
        if path.is_dir():
            try:  # a write, not the mode bits: root, or a read-only or immutable directory
                tempfile.TemporaryFile(dir=path).close()
            except OSError as exc:
                raise UsageError(f"--checkpoint {path} is not writable ({exc.strerror})") from None
        if not path.exists() and (ancestor := unwritable_ancestor(path)) is not None:
            raise UsageError(f"--checkpoint {path} cannot be created: {ancestor} is not a "
                             f"writable directory")
        later = checkpoint.later(path, start)
        if later and not args.overwrite:
            raise UsageError(f"--checkpoint {path} holds checkpoints past step {start} "
                             f"({', '.join(p.name for p in later)}); pass --overwrite to "
                             f"remove them")
    return start


def run(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab train`` (one process) or ``mpiexec -n P gemmlab train --tp T --dp D``: 0
    when it trained, 2 for a mistake in the arguments."""
    start = 0  # the step the run starts at (a resumed run: its checkpoint's)

    def check(device_type: str, ranks: int) -> None:
        nonlocal start
        # after mpi_setup's Triton interpreter policy
        from tp.checkpoint import run_settings
        from tp.train import GRAPH_WARMUP_STEPS
        from tp.transformer import GPTConfig

        tp_size, dp = _layout(args, ranks)
        if min(args.steps, args.batch, args.seq, args.hidden, args.heads, args.layers) < 1:
            raise UsageError("--steps, --batch, --seq, --hidden, --heads and --layers must "
                             "be >= 1")
        if not (args.lr > 0 and math.isfinite(args.lr)):
            raise UsageError(f"--lr must be a finite number > 0; got {args.lr}")
        if args.hidden % args.heads or args.heads % tp_size:
            raise UsageError(f"--heads {args.heads} must divide --hidden {args.hidden} and be "
                             f"a multiple of --tp {tp_size}")
        if GPTConfig.mlp_ratio * args.hidden % tp_size:
            raise UsageError(f"the MLP width {GPTConfig.mlp_ratio * args.hidden} is not a "
                             f"multiple of --tp {tp_size}")
        if args.batch % dp:
            raise UsageError(f"--batch {args.batch} is not a multiple of the DP size {dp}")
        if args.sequence_parallel and (tokens := args.batch // dp * args.seq) % tp_size:
            raise UsageError(f"--sequence-parallel needs the tokens of each DP rank's batch "
                             f"(--batch {args.batch} / DP {dp} x --seq {args.seq} = {tokens}) "
                             f"to be a multiple of --tp {tp_size}")
        check_gemm_backend(args.backend, args.dtype, device_type)
        comm = args.comm or default_comm(device_type)
        check_comm(comm, args.dtype, device_type)
        if args.cuda_graph:
            check_cuda_graph(device_type, comm)
            if args.steps <= GRAPH_WARMUP_STEPS:
                raise UsageError(f"--cuda-graph needs --steps > {GRAPH_WARMUP_STEPS}: the "
                                 f"first {GRAPH_WARMUP_STEPS} steps run eagerly before the "
                                 f"capture")
        if args.reference:
            _reference(args.reference)
        start = _check_checkpoints(args, run_settings(
            _config(args), tp=tp_size, dp=dp, sequence_parallel=args.sequence_parallel,
            seed=args.seed, batch=args.batch, lr=args.lr, dtype=DTYPES[args.dtype].torch,
            device_type=device_type, backend=args.backend))

    setup = mpi_setup(args, console, check)
    if isinstance(setup, int):
        return setup
    world, device, say = setup
    import torch

    import tp.comm
    from tp import checkpoint
    from tp.grid import ProcessGrid
    from tp.train import GRAPH_WARMUP_STEPS, train

    from ..recording import Recorder
    from ..train_plot import plot_loss

    tp_size, dp = _layout(args, world.Get_size())
    config = _config(args)
    grid = ProcessGrid.create(tp_size, world)
    comm_name = args.comm or default_comm(device.type)
    tp_comm = tp.comm.create(comm_name, grid.tp_comm, device)
    dp_comm = tp.comm.create(comm_name, grid.dp_comm, device)
    label = (f"DP {dp} x TP {tp_size}" + (", SP" if args.sequence_parallel else "")
             + (", CUDA graph" if args.cuda_graph else ""))
    say(f"gemmlab train: {label}, {device.type}, {args.dtype}, backend {args.backend}, "
        f"{tp_comm.name}; {config}", highlight=False)
    if args.resume:
        say(f"resuming {args.resume} at step {start}", highlight=False)
    if args.checkpoint and world.Get_rank() == 0:  # only with --overwrite (else refused)
        for stale in checkpoint.later(args.checkpoint, start):
            shutil.rmtree(stale)
    reference = _reference(args.reference) if args.reference else None
    plot = functools.partial(plot_loss, label=label, reference=None if reference is None else
                             {"configuration": reference["summary"]["configuration"],
                              "loss": reference["loss"]})
    recorder = Recorder(args.out, plot, comm=world)
    every = max(1, args.steps // 10)

    def log(step, loss, ms):
        recorder.add({"step": step, "loss": loss, "ms": ms})
        if step % every == 0 or step == args.steps - 1:
            say(f"step {step:5d}  loss {loss:.4f}  {ms:8.1f} ms")

    result = train(config, tp_comm, dp_comm, steps=args.steps, batch=args.batch, lr=args.lr,
                   seed=args.seed, device=device, dtype=DTYPES[args.dtype].torch,
                   backend=args.backend, overlap=not args.no_overlap,
                   sequence_parallel=args.sequence_parallel, cuda_graph=args.cuda_graph,
                   log=log, checkpoint=args.checkpoint,
                   checkpoint_every=args.checkpoint_every or 0, resume=args.resume)
    if args.checkpoint:
        say(f"saved step {args.steps} in {Path(args.checkpoint) / f'step-{args.steps:08d}'}")
    # the first step includes compilation; with a CUDA graph, the replays are what is timed
    timed = result.step_ms[GRAPH_WARMUP_STEPS if args.cuda_graph else 1:] or result.step_ms
    summary = {"configuration": label, "tp": tp_size, "dp": dp, "device": device.type,
               "dtype": args.dtype, "backend": args.backend, "comm": tp_comm.name,
               "sequence_parallel": args.sequence_parallel, "cuda_graph": args.cuda_graph,
               "steps": args.steps, "ms_per_step": statistics.median(timed),
               "tokens_per_s": args.batch * args.seq / (statistics.median(timed) / 1e3),
               "final_loss": result.loss[-1], "torch_threads": torch.get_num_threads(),
               "model": dataclasses.asdict(config), "seed": args.seed, "batch": args.batch,
               "lr": args.lr, "resumed_from": result.first_step if args.resume else None}
    runs = [summary]
    if reference is not None:
        runs.append(reference["summary"])
        summary["max_loss_diff_vs_reference"] = max(
            abs(a - b) for a, b in zip(result.loss, reference["loss"]))
    table = Table(title="run time per configuration")
    for col in ("configuration", "device", "dtype", "backend", "comm", "threads", "steps",
                "ms/step", "tokens/s", "final loss"):
        table.add_column(col, justify="left" if col in ("configuration", "device", "dtype",
                                                        "backend", "comm") else "right")
    for entry in runs:
        table.add_row(entry["configuration"], entry["device"], entry["dtype"], entry["backend"],
                      entry["comm"], str(entry.get("torch_threads", "-")), str(entry["steps"]),
                      f"{entry['ms_per_step']:.1f}", f"{entry['tokens_per_s']:.0f}",
                      f"{entry['final_loss']:.4f}")
    say(table)
    if reference is not None:
        say(f"largest |loss - reference loss| over {len(reference['loss'])} steps: "
            f"{summary['max_loss_diff_vs_reference']:.2e}")
    extra = {"loss": result.loss, "summary": summary}
    if reference is not None:
        extra["reference"] = {"configuration": reference["summary"]["configuration"],
                              "loss": reference["loss"]}
    for path in recorder.finish(**extra):
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
    tr.add_argument("--dtype", choices=TP, default="fp32")
    tr.add_argument("--no-overlap", action="store_true", help="no compute/communication overlap")
    tr.add_argument("--sequence-parallel", action="store_true",
                    help="sequence parallelism: each TP rank runs the LayerNorms, residuals, "
                    "LM head and loss on its block of the tokens (needs --batch / DP x --seq "
                    "divisible by --tp)")
    tr.add_argument("--cuda-graph", action="store_true",
                    help="capture the whole training step into one CUDA graph after "
                    "the eager warm-up steps and replay it (CUDA, with a stream-ordered "
                    "communicator: nccl, symm, ring or ring/nccl)")
    tr.add_argument("--activation", choices=("relu", "gelu"), default="relu",
                    help="the MLP's activation: relu (fused into the GEMM) or gelu (GPT-2's "
                    "tanh approximation, after the bias-fused GEMM)")
    tr.add_argument("--reference", help="results.json of another run to compare the loss with")
    tr.add_argument("--checkpoint", metavar="DIR",
                    help="save the run in DIR/step-<s> after the last step (and every "
                    "--checkpoint-every steps): dense weights, each rank's Adam and data "
                    "state; with --overwrite, checkpoints in DIR past the start are removed")
    tr.add_argument("--checkpoint-every", type=int, metavar="S",
                    help="also save every S steps (needs --checkpoint)")
    tr.add_argument("--resume", metavar="PATH",
                    help="continue the run saved at PATH (a step-<s> checkpoint, or a "
                    "--checkpoint DIR: its latest) up to --steps, bit for bit; the model, "
                    "seed, batch, lr, TP, DP, SP, dtype, device and backend must be the same")
    add_layer_options(tr)
    add_run_options(tr, "directory for results.jsonl (steps as they finish), results.json "
                    "(with a loss list), results.csv and results.png")
    tr.set_defaults(func=run)
    return tr
