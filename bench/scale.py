"""``gemmlab scale strong|weak``: one point of a TP scaling curve, started under ``mpiexec -n P``.

Every rank is one TP rank (TP = P, DP = 1). Two workloads, each timed forward + backward:

- ``mlp``: the TP MLP block, ``fc1`` = ``tp.layers.ColumnParallelLinear`` (hidden -> ffn,
  fused bias + ReLU) then ``fc2`` = ``RowParallelLinear`` (ffn -> hidden); input (tokens,
  hidden).
- ``layer``: ``tp.transformer.TransformerLayer`` (pre-LN attention + the same MLP); input
  (tokens / seq, seq, hidden).

Sizes at TP degree P, from ``--tokens`` T, ``--hidden`` h, ``--ffn-ratio`` r, ``--heads`` H
and ``--seq`` S:

- strong: the global problem is the same at every P: ffn = r * h, H heads of head_dim h / H
  (attention width H * head_dim = h). Needs P to divide ffn and H.
- weak: each rank's share is the P = 1 problem: ffn = r * h * P and H * P heads of
  head_dim h / H (attention width h * P), with T, h and S fixed. Every rank then holds
  weights and runs GEMMs and attention of exactly the P = 1 shapes (ffn / P = r * h columns,
  H local heads), so per-rank FLOPs are constant; what grows with P is the communication (the
  same (T, h) all-reduces, now over P ranks).

Measured per workload, after one checked step and ``--warmup`` steps:

- ``step_ms``: a forward + backward step (``torch.autograd.grad`` of the output with respect
  to the input and every parameter, upstream gradient random), by ``bench.timing
  .seconds_per_call``: mean over ``--iters`` back-to-back steps, the slowest rank's.
- ``comm_ms``: the step's communication alone. During the checked step every collective the
  layers call on the TP communicator is recorded (operation, shape, dtype, stream and async
  arguments: the row-parallel forward's chunk all-reduces and the column-parallel backward's
  dX all-reduces); the same calls are then replayed back to back on random buffers of the same
  shapes, in the same order, on the same communicator, waiting for all at the end, and timed
  the same way. ``comm_share`` = comm_ms / step_ms: the size of the communication relative to
  the step. With ``--overlap`` part of it is hidden behind GEMMs, so it is an upper bound on
  the exposed share. 0 at P = 1 (the layers call no collective).
- ``tflops_per_gpu``: model FLOPs per rank / step time: 2 m n k per GEMM, the backward twice
  the forward (dX and dW); the layer adds Q K^T and A V over the full S x S scores, as in
  Narayanan et al. 2021 (arXiv:2104.04473, sec. 5.1: 72 B S h^2 + 12 B S^2 h for r = 4).
  LayerNorm, softmax, ReLU and bias adds are not counted.

Check before timing: the first step's output, input gradient and every parameter's
gradient (each rank's shard against the same part of the dense one, ``shard`` of the TP
layers) are compared (relative Frobenius error, for a parameter's gradient over the larger of
its norm and the typical size of them all, ``_parameter_errors``; ``bench.tp_bench.TOLERANCES``;
NaN or inf fails) with the same workload built at TP = 1 on ``MPI.COMM_SELF`` from the same seed in
fp32, with its weights rounded to the run's dtype, so both see the same values. The
reference runs on all the tokens (a weight's gradient sums over every one of them): one
dense step in fp32 per rank, once. A workload that fails is reported FAIL and not timed
(exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

MODES = ("strong", "weak")
WORKLOADS = ("mlp", "layer")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
CANNOT_RUN = 3  # exit status: more ranks on a node than GPUs (bench.scale_series skips that P)
RULES = {"strong": "global sizes fixed: ffn = r*h, heads H, head_dim h/H",
         "weak": "per-rank sizes fixed: ffn = r*h*P, heads H*P, head_dim h/H; tokens, "
                 "hidden, seq fixed"}


@dataclass(frozen=True)
class Problem:
    """The global sizes of one workload at TP degree ``p`` (``heads``, ``head_dim`` and
    ``seq`` are None for the MLP)."""

    workload: str
    p: int
    tokens: int
    hidden: int
    ffn: int
    heads: int | None = None
    head_dim: int | None = None
    seq: int | None = None

    def flops_per_rank(self) -> float:
        """Model FLOPs of one forward + backward step on one rank (see the module doc)."""
        t, h = self.tokens, self.hidden
        forward = 4 * t * h * self.ffn  # fc1 and fc2
        if self.workload == "layer":
            width = self.heads * self.head_dim
            forward += 8 * t * h * width + 4 * t * self.seq * width  # q, k, v, o; QK^T, AV
        return 3 * forward / self.p


def problem(workload: str, mode: str, p: int, tokens: int, hidden: int, ffn_ratio: int,
            heads: int, seq: int) -> Problem:
    """The sizes of ``workload`` at TP degree ``p`` under ``mode``'s rule (module doc).

    Raises:
        ValueError: a size that P does not divide (ffn or heads), heads that do not divide
            hidden, tokens not a multiple of seq, a size < 1.
    """
    if min(p, tokens, hidden, ffn_ratio, heads, seq) < 1:
        raise ValueError("sizes, --ffn-ratio and the number of ranks must be >= 1")
    grow = p if mode == "weak" else 1
    ffn = ffn_ratio * hidden * grow
    if ffn % p:
        raise ValueError(f"FFN width {ffn} (--ffn-ratio {ffn_ratio} x --hidden {hidden}) is "
                         f"not a multiple of the TP size {p}")
    if workload == "mlp":
        return Problem(workload, p, tokens, hidden, ffn)
    if hidden % heads:
        raise ValueError(f"--hidden {hidden} is not a multiple of --heads {heads}")
    if heads * grow % p:
        raise ValueError(f"--heads {heads} is not a multiple of the TP size {p}")
    head_dim = hidden // heads
    if tokens % seq:
        raise ValueError(f"--tokens {tokens} is not a multiple of --seq {seq}")
    return Problem(workload, p, tokens, hidden, ffn, heads * grow, head_dim, seq)


def build(prob: Problem, comm, *, backend: str, overlap: bool, chunks: int, sm_margin: int,
          device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The workload as a module over the TP communicator ``comm`` (any size: the TP = 1
    reference passes a one-rank one), weights from torch's global RNG: seed it first to get
    the same function at every TP degree. Input and output (tokens, hidden) for the MLP,
    (tokens / seq, seq, hidden) for the layer, in ``dtype``. NVTX ranges: ``mlp.fc1``,
    ``mlp.fc2``; the layer's are TransformerLayer's (``layer.fc_q`` ... ``layer.fc2``).

    Raises:
        ValueError: from the TP layers (e.g. overlap without asynchronous communication).
    """
    from tp.layers import ColumnParallelLinear, RowParallelLinear
    from tp.transformer import TransformerLayer

    common = {"backend": backend, "overlap": overlap, "device": device, "dtype": dtype}
    h = prob.hidden
    if prob.workload == "mlp":
        return nn.Sequential(
            ColumnParallelLinear(h, prob.ffn, comm, activation="relu", sm_margin=sm_margin,
                                 master=nn.Linear(h, prob.ffn, device=device), name="mlp.fc1",
                                 **common),
            RowParallelLinear(prob.ffn, h, comm, chunks=chunks, sm_margin=sm_margin,
                              master=nn.Linear(prob.ffn, h, device=device), name="mlp.fc2",
                              **common))
    return TransformerLayer(h, prob.heads, comm, mlp_ratio=prob.ffn // h,
                            head_dim=prob.head_dim, chunks=chunks, sm_margin=sm_margin, **common)


@contextlib.contextmanager
def recording(comm, calls: list):
    """Inside, every collective called on ``comm`` is also appended to ``calls`` as
    (operation, shape, dtype, positional args, keyword args); instance attributes shadow the
    methods for the duration, so the timed steps run the communicator untouched."""
    def recorder(op, method):
        def call(tensor, *args, **kwargs):
            calls.append((op, tuple(tensor.shape), tensor.dtype, args, kwargs))
            return method(tensor, *args, **kwargs)
        return call

    for op in COLLECTIVES:
        setattr(comm, op, recorder(op, getattr(comm, op)))
    try:
        yield calls
    finally:
        for op in COLLECTIVES:
            delattr(comm, op)


def replay(comm, calls: list, device: torch.device):
    """A function issuing ``calls`` (from ``recording``) again, in order, on random buffers
    of the same shapes (outputs given as ``out=`` get buffers of their own), then waiting for
    the asynchronous ones. In-place sums grow P-fold per call and may reach inf: collectives
    do not branch on values, so the time does not change."""
    from tp.comm import Work

    def fresh(shape, dtype):
        return torch.randn(shape, device=device).to(dtype)

    jobs = [(getattr(comm, op), fresh(shape, dtype), args,
             {k: torch.empty_like(v) if isinstance(v, torch.Tensor) else v
              for k, v in kwargs.items()})
            for op, shape, dtype, args, kwargs in calls]

    def run():
        started = [method(buf, *args, **kwargs) for method, buf, args, kwargs in jobs]
        for work in started:
            if isinstance(work, Work):
                work.wait()
    return run


def _parameter_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[float]:
    """Each parameter gradient's RMS error over the larger of its own reference RMS and the
    RMS of all the reference parameter gradients together (inf for NaN or inf). The floor
    matters where a gradient is zero in exact arithmetic and both sides hold rounding noise:
    the bias of the keys (softmax does not change when every key of a query moves alike)."""
    def rms(t):
        return float(t.double().pow(2).mean().sqrt())

    floor = math.sqrt(sum(float(w.double().pow(2).sum()) for w in want)
                      / sum(w.numel() for w in want))
    return [rms(g.double() - w.double()) / max(rms(w), floor) if torch.isfinite(g).all()
            else math.inf for g, w in zip(got, want)]


def _part_of(model: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """The part of dense gradient ``full`` that ``model``'s parameter ``name`` holds: the
    TP layer's shard, or all of it for a replicated parameter (a LayerNorm's)."""
    owner, _, kind = name.rpartition(".")
    module = model.get_submodule(owner)
    shard = getattr(module, "shard", None)
    return full if shard is None else shard(full, bias=kind == "bias")


def measure(prob: Problem, mode: str, world, comm, self_comm, device: torch.device,
            dtype_name: str, settings: dict, iters: int, warmup: int, seed: int = 0) -> dict:
    """One row: check the workload against its TP = 1 fp32 reference, then time the step
    and its communication alone (module doc). Collective over ``world`` (= the TP group
    ``comm``); ``self_comm`` is a one-rank communicator. ``settings``: the keyword arguments
    of ``build`` other than sizes, device and dtype.

    Raises:
        ValueError: from ``build``.
    """
    from mpi4py import MPI

    import backends

    from .tp_bench import DTYPES, TOLERANCES, _ms

    dtype = DTYPES[dtype_name]
    torch.manual_seed(seed)
    model = build(prob, comm, device=device, dtype=dtype, **settings)
    torch.manual_seed(seed)
    reference = build(prob, self_comm, device=device, dtype=torch.float32,
                      **{**settings, "backend": "cublas", "overlap": False, "sm_margin": 0})
    with torch.no_grad():
        for param in reference.parameters():
            param.copy_(param.to(dtype))  # the values the run's shards hold
    shape = ((prob.tokens, prob.hidden) if prob.seq is None
             else (prob.tokens // prob.seq, prob.seq, prob.hidden))
    torch.manual_seed(seed + 1)  # the same input and upstream gradient on every rank
    x, grad_y = (torch.randn(shape, device=device).to(dtype) for _ in range(2))

    def stepper(module, x, grad_y, every=False):
        params = list(module.parameters())

        def step():
            xg = x.detach().requires_grad_(True)
            y = module(xg)
            grads = torch.autograd.grad(y, [xg, *params], grad_y)
            return (y, *grads) if every else (y, grads[0])
        return step

    step = stepper(model, x, grad_y)
    calls = []
    with recording(comm, calls):
        y, *grads = stepper(model, x, grad_y, every=True)()
    ref_y, *ref_grads = stepper(reference, x.float(), grad_y.float(), every=True)()
    wants = [_part_of(model, name, ref) for (name, _), ref
             in zip(model.named_parameters(), ref_grads[1:])]
    err = max([backends.relative_error(got.float(), want) if torch.isfinite(got).all()
               else math.inf for got, want in ((y, ref_y), (grads[0], ref_grads[0]))]
              + _parameter_errors(grads[1:], wants))
    err = world.allreduce(err, op=MPI.MAX)
    del reference, ref_y, ref_grads, wants, y, grads
    row = {"workload": prob.workload, "mode": mode, "P": prob.p, "tokens": prob.tokens,
           "seq": prob.seq, "hidden": prob.hidden, "ffn": prob.ffn, "heads": prob.heads,
           "head_dim": prob.head_dim, "dtype": dtype_name, "rule": RULES[mode],
           "max_rel_err": err, "ok": err <= TOLERANCES[dtype_name]}
    if row["ok"]:
        step_ms = _ms(step, iters, warmup, device, world)
        comm_ms = _ms(replay(comm, calls, device), iters, warmup, device, world) if calls else 0.0
        row |= {"step_ms": step_ms, "comm_ms": comm_ms, "comm_share": comm_ms / step_ms,
                "tflops_per_gpu": prob.flops_per_rank() / (step_ms * 1e-3) / 1e12}
    row |= {"collectives": len(calls),
            "comm_bytes": sum(math.prod(c[1]) * c[2].itemsize for c in calls),
            "flops_per_gpu": prob.flops_per_rank(), **settings, "comm": comm.name,
            "device": device.type, "iters": iters, "warmup": warmup}
    return row


def cmd_scale(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab scale``: 0 when every workload passed its check, 1 when one failed, 2 for
    bad arguments or sizes, ``CANNOT_RUN`` when a node has more ranks than GPUs."""
    from .cli import _csv, _launch_in_order, _mpi_setup

    _launch_in_order()  # before MPI_Init, which may already initialise CUDA
    from mpi4py import MPI

    import backends
    import tp.comm
    from tp.mpi import local_rank

    from .results import collect_meta, write_results
    from .tp_bench import DTYPES

    world, device, say = _mpi_setup(args, console)
    p = world.Get_size()
    if device.type == "cuda" and world.allreduce(
            local_rank(world) >= torch.cuda.device_count(), op=MPI.MAX):
        say(f"cannot run: {p} ranks but {torch.cuda.device_count()} GPUs per node "
            f"(ranks would share GPUs)")
        return CANNOT_RUN
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    comm_name = args.comm or ("nccl" if device.type == "cuda" else "mpi")
    try:
        workloads = _csv(args.workload)
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


def plot(rows: list[dict], path: Path) -> None:
    """One bar per workload: the step time, split into its communication alone and the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if "step_ms" in r]
    fig, ax = plt.subplots(figsize=(6, 1.2 + 0.6 * max(len(timed), 1)))
    labels = [r["workload"] for r in timed]
    comm = [r["comm_ms"] for r in timed]
    ax.barh(labels, comm, label="communication alone")
    ax.barh(labels, [r["step_ms"] - c for r, c in zip(timed, comm)], left=comm,
            label="rest of the step")
    ax.set_xlabel("ms per forward + backward step")
    if timed:
        ax.set_title(f"{timed[0]['mode']} scaling, P = {timed[0]['P']}, {timed[0]['dtype']}",
                     fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    scale.set_defaults(func=cmd_scale)
    return scale
