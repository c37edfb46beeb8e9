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

With ``--sequence-parallel`` both workloads run Megatron-LM's sequence parallelism
(``tp.layers``, Korthikanti et al. 2022, arXiv:2205.05198): each rank holds its block of the
flattened tokens, (tokens / P, hidden), the column-parallel inputs are all-gathered into the
GEMM (AG+GEMM) and the row-parallel outputs reduce-scattered (GEMM+RS), chunk by chunk with
``--overlap``; the layer's LayerNorms run on the block. The model FLOPs are the same; the
recorded collectives are the all-gathers and reduce-scatters. Needs P to divide the tokens.

With ``--cuda-graph`` (CUDA, a stream-ordered communicator) the checked step is also
captured into one CUDA graph (``bench.tp_bench.replayed``): its output and every gradient
are poisoned, one replay is checked like the eager step, and ``graph_step_ms`` is the mean of
``--iters`` replays, the slowest rank's, beside the eager ``step_ms``.

Check before timing: the first step's output, input gradient and every parameter's
gradient (each rank's shard against the same part of the dense one, ``shard`` of the TP
layers; with sequence parallelism the output and input gradient against the rank's token
block of the dense ones) are compared (relative Frobenius error, for a parameter's gradient
over the larger of its norm and the typical size of them all, ``_parameter_errors``; NaN or
inf fails) with the same workload built at TP = 1 on ``MPI.COMM_SELF`` from the same seed in
fp32, with its weights rounded to the run's dtype, so both see the same values. The reference
runs on all the tokens (a weight's gradient sums over every one of them): one dense step in
fp32 per rank, once. Each tensor passes when its error is within the dtype's tolerance
(``backends.dtypes``) or within ``DENSE_FACTOR`` (2) times the error of the same tensor from
the dense workload run in the run's dtype and GEMM backend at TP = 1: in bf16 a gradient
summed over thousands of tokens that largely cancel (a LayerNorm's bias) is off the fp32
reference by more than the tolerance with no TP at all (0.26 on CPU at hidden 1024, 4096
tokens), and TP is judged by what it adds to that. ``max_rel_err`` is the TP run's largest
error, ``dense_max_rel_err`` the dense run's, ``check_ratio`` the largest of each tensor's
error over what it is allowed (the row passes at <= 1). A workload that fails is reported
FAIL and not timed (exit status 1).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MODES = ("strong", "weak")
WORKLOADS = ("mlp", "layer")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
# A TP run passes when each tensor's error is within the dtype's tolerance or within this
# factor of the same tensor's error in the dense workload run in the same dtype (module doc).
DENSE_FACTOR = 2.0
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
            heads: int, seq: int, sequence_parallel: bool = False) -> Problem:
    """The sizes of ``workload`` at TP degree ``p`` under ``mode``'s rule (module doc).

    Raises:
        ValueError: a size that P does not divide (ffn or heads; the tokens with
            ``sequence_parallel``), heads that do not divide hidden, tokens not a multiple of
            seq, a size < 1.
    """
    if min(p, tokens, hidden, ffn_ratio, heads, seq) < 1:
        raise ValueError("sizes, --ffn-ratio and the number of ranks must be >= 1")
    if sequence_parallel and tokens % p:
        raise ValueError(f"sequence parallelism needs --tokens ({tokens}) divisible by the "
                         f"TP size {p}")
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
          device: torch.device, dtype: torch.dtype, sequence_parallel: bool = False
          ) -> nn.Module:
    """The workload as a module over the TP communicator ``comm`` (any size: the TP = 1
    reference passes a one-rank one), weights from torch's global RNG: seed it first to get
    the same function at every TP degree. Input and output (tokens, hidden) for the MLP,
    (tokens / seq, seq, hidden) for the layer, in ``dtype``; with ``sequence_parallel`` each
    rank's block of the flattened tokens, (tokens / P, hidden), for both (the layer is then
    called as ``layer(x, seq_len=seq)``). NVTX ranges: ``mlp.fc1``, ``mlp.fc2``; the layer's
    are TransformerLayer's (``layer.fc_q`` ... ``layer.fc2``).

    Raises:
        ValueError: from the TP layers (e.g. overlap without asynchronous communication).
    """
    from tp.layers import ColumnParallelLinear, RowParallelLinear
    from tp.transformer import TransformerLayer

    common = {"backend": backend, "overlap": overlap, "device": device, "dtype": dtype,
              "sequence_parallel": sequence_parallel}
    h = prob.hidden
    if prob.workload == "mlp":
        return nn.Sequential(
            ColumnParallelLinear(h, prob.ffn, comm, activation="relu", sm_margin=sm_margin,
                                 master=nn.Linear(h, prob.ffn, device=device), name="mlp.fc1",
                                 chunks=chunks, **common),
            RowParallelLinear(prob.ffn, h, comm, chunks=chunks, sm_margin=sm_margin,
                              master=nn.Linear(prob.ffn, h, device=device), name="mlp.fc2",
                              **common))
    return TransformerLayer(h, prob.heads, comm, mlp_ratio=prob.ffn // h,
                            head_dim=prob.head_dim, chunks=chunks, sm_margin=sm_margin, **common)


@contextlib.contextmanager
def recording(comm, calls: list):
    """Inside, every collective called on ``comm`` is also appended to ``calls`` as
    (operation, shape, dtype, positional args, keyword args), each tensor among the arguments
    kept as a meta tensor of its shape and dtype (``_shape_of``); instance attributes shadow
    the methods for the duration, so the timed steps run the communicator untouched."""
    def recorder(op, method):
        def call(tensor, *args, **kwargs):
            calls.append((op, tuple(tensor.shape), tensor.dtype,
                          tuple(_shape_of(a) for a in args),
                          {k: _shape_of(v) for k, v in kwargs.items()}))
            return method(tensor, *args, **kwargs)
        return call

    for op in COLLECTIVES:
        setattr(comm, op, recorder(op, getattr(comm, op)))
    try:
        yield calls
    finally:
        for op in COLLECTIVES:
            delattr(comm, op)


def _shape_of(value):
    """A tensor as a meta tensor of its shape and dtype, anything else as it is. Keeping the
    tensor itself would keep what it views: an ``out=`` chunk of a sequence-parallel layer's
    output kept that output, its autograd graph and every parameter's AccumulateGrad node
    alive, bound to the stream of the step that made them, and the step's CUDA-graph capture
    on its own stream then failed (on 2 H200s)."""
    return torch.empty_like(value, device="meta") if isinstance(value, torch.Tensor) else value


def replay(comm, calls: list, device: torch.device):
    """A function issuing ``calls`` (from ``recording``) again, in order, on random buffers
    of the same shapes (tensors given as arguments, ``out=`` included, get buffers of their
    own), then waiting for the asynchronous ones. In-place sums grow P-fold per call and may
    reach inf: collectives do not branch on values, so the time does not change."""
    from tp.comm import Work

    def fresh(shape, dtype):
        return torch.randn(shape, device=device).to(dtype)

    def buffer(value):  # a recorded meta tensor becomes a buffer of its own on the device
        return (torch.empty_like(value, device=device) if isinstance(value, torch.Tensor)
                else value)

    jobs = [(getattr(comm, op), fresh(shape, dtype), tuple(buffer(a) for a in args),
             {k: buffer(v) for k, v in kwargs.items()})
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


def _errors(y, dx, param_grads, want_y, want_dx, wants) -> list[float]:
    """The relative errors of the output, dX (inf for NaN or inf) and each parameter
    gradient (``_parameter_errors``) against theirs."""
    import backends

    return ([backends.relative_error(got.float(), want.float()) if torch.isfinite(got).all()
             else math.inf for got, want in ((y, want_y), (dx, want_dx))]
            + _parameter_errors(param_grads, wants))


def _part_of(model: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """The part of dense gradient ``full`` that ``model``'s parameter ``name`` holds: the
    TP layer's shard, or all of it for a replicated parameter (a LayerNorm's)."""
    owner, _, kind = name.rpartition(".")
    module = model.get_submodule(owner)
    shard = getattr(module, "shard", None)
    return full if shard is None else shard(full, bias=kind == "bias")


def measure(prob: Problem, mode: str, world, comm, self_comm, device: torch.device,
            dtype_name: str, settings: dict, iters: int, warmup: int, seed: int = 0,
            cuda_graph: bool = False) -> dict:
    """One row: check the workload against its TP = 1 fp32 reference, then time the step
    and its communication alone (module doc); with ``cuda_graph``, the step once more
    captured into one CUDA graph, checked and timed by replays. Collective over ``world``
    (= the TP group ``comm``); ``self_comm`` is a one-rank communicator. ``settings``: the
    keyword arguments of ``build`` other than sizes, device and dtype.

    Raises:
        ValueError: from ``build``; ``cuda_graph`` on a device that is not CUDA.
    """
    from mpi4py import MPI

    from backends import dtypes

    from .tp_bench import _ms, replayed

    spec = dtypes.parse(dtype_name, dtypes.TP)
    dtype = spec.torch
    torch.manual_seed(seed)
    model = build(prob, comm, device=device, dtype=dtype, **settings)
    torch.manual_seed(seed)
    reference = build(prob, self_comm, device=device, dtype=torch.float32,
                      **{**settings, "backend": "cublas", "overlap": False, "sm_margin": 0,
                         "sequence_parallel": False})
    with torch.no_grad():
        for param in reference.parameters():
            param.copy_(param.to(dtype))  # the values the run's shards hold
    shape = ((prob.tokens, prob.hidden) if prob.seq is None
             else (prob.tokens // prob.seq, prob.seq, prob.hidden))
    torch.manual_seed(seed + 1)  # the same input and upstream gradient on every rank
    x, grad_y = (torch.randn(shape, device=device).to(dtype) for _ in range(2))
    forward, mine = model, (lambda t: t)
    if settings.get("sequence_parallel"):  # this rank's block of the flattened tokens
        block = prob.tokens // prob.p
        rows = slice(comm.rank * block, (comm.rank + 1) * block)

        def mine(t):
            return t.reshape(prob.tokens, prob.hidden)[rows]
        if prob.seq is not None:
            def forward(x):
                return model(x, seq_len=prob.seq)

    params = list(model.parameters())

    def step(every=False):
        xg = mine(x).detach().requires_grad_(True)
        y = forward(xg)
        grads = torch.autograd.grad(y, [xg, *params], mine(grad_y))
        return (y, *grads) if every else (y, grads[0])

    calls = []
    with recording(comm, calls):
        y, *grads = step(every=True)
    xr = x.float().requires_grad_(True)
    ref_y = reference(xr)
    ref_grads = torch.autograd.grad(ref_y, [xr, *reference.parameters()], grad_y.float())
    del reference
    # The dense workload in the run's dtype and backend (TP = 1): its own errors are what
    # this dtype costs without TP, the yardstick of the TP run's (module doc).
    torch.manual_seed(seed)
    dense = build(prob, self_comm, device=device, dtype=dtype,
                  **{**settings, "overlap": False, "sm_margin": 0, "sequence_parallel": False})
    xd = x.detach().requires_grad_(True)
    yd = dense(xd)
    dense_grads = torch.autograd.grad(yd, [xd, *dense.parameters()], grad_y)
    dense_errors = _errors(yd, dense_grads[0], dense_grads[1:], ref_y, ref_grads[0],
                           ref_grads[1:])
    # A dense run that overflows loosens nothing: the tolerance alone then applies.
    allowed = [max(spec.tolerance, DENSE_FACTOR * e) if math.isfinite(e) else spec.tolerance
               for e in dense_errors]
    del dense, xd, yd, dense_grads
    # What this rank's output, dX and parameter gradients must be (copies: the full
    # reference is freed before timing).
    want_y, want_dx = (mine(t).detach().clone() for t in (ref_y, ref_grads[0]))
    wants = [_part_of(model, name, ref).clone() for (name, _), ref
             in zip(model.named_parameters(), ref_grads[1:])]
    del xr, ref_y, ref_grads

    def ratio_of(errors):
        """The largest of each tensor's error over what it is allowed (<= 1 passes)."""
        return max(e / a for e, a in zip(errors, allowed))

    def excess(y, dx, *param_grads):
        return ratio_of(_errors(y, dx, param_grads, want_y, want_dx, wants))

    errors = _errors(y, grads[0], grads[1:], want_y, want_dx, wants)
    err = world.allreduce(max(errors), op=MPI.MAX)
    ratio = world.allreduce(ratio_of(errors), op=MPI.MAX)
    del y, grads
    row = {"workload": prob.workload, "mode": mode, "P": prob.p, "tokens": prob.tokens,
           "seq": prob.seq, "hidden": prob.hidden, "ffn": prob.ffn, "heads": prob.heads,
           "head_dim": prob.head_dim, "dtype": dtype_name, "rule": RULES[mode],
           "max_rel_err": err, "dense_max_rel_err": max(dense_errors), "check_ratio": ratio,
           "ok": ratio <= 1.0}
    if row["ok"]:
        step_ms = _ms(step, iters, warmup, device, world)
        comm_ms = _ms(replay(comm, calls, device), iters, warmup, device, world) if calls else 0.0
        row |= {"step_ms": step_ms, "comm_ms": comm_ms, "comm_share": comm_ms / step_ms,
                "tflops_per_gpu": prob.flops_per_rank() / (step_ms * 1e-3) / 1e12}
    if cuda_graph:
        graphed = (replayed(world, device, lambda: step(every=True), excess, 1.0, iters,
                            warmup) if row["ok"] else {"ms": None, "error": None, "ok": False})
        row |= {"graph_step_ms": graphed["ms"], "graph_check_ratio": graphed["error"],
                "ok": row["ok"] and graphed["ok"]}
        if "reason" in graphed:
            row["graph_error"] = graphed["reason"]
    row |= {"collectives": len(calls),
            "comm_bytes": sum(math.prod(c[1]) * c[2].itemsize for c in calls),
            "flops_per_gpu": prob.flops_per_rank(), **settings, "comm": comm.name,
            "device": device.type, "iters": iters, "warmup": warmup, "cuda_graph": cuda_graph}
    return row


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
