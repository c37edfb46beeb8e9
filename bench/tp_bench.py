"""``gemmlab tp``: the tensor-parallel layers checked against the dense layers, then timed,
with the compute/communication overlap report.

The layers are an MLP block's: ``fc1`` column-parallel (hidden -> ratio * hidden, fused bias +
ReLU) and ``fc2`` row-parallel (back to hidden), cut from seeded dense masters identical on
every rank. Rows:

- ``column`` / ``row``, ``forward`` and ``backward``: time per call, and the largest relative
  Frobenius error of the outputs and of every gradient against the dense layers in fp32.
- ``mlp`` ``forward+backward`` at TP = P and at TP = 1 (every rank runs the whole block alone,
  on its own GPU, in the same run), so their ratio is the TP speedup.
- overlap rows: for the row-parallel forward (chunk all-reduces against the next chunks'
  GEMMs) and the column-parallel backward (the dX all-reduce against the dW GEMM): compute
  alone (as the layer runs it, with its SM margin), communication alone, both serially
  (overlap off), overlapped, and the overlap efficiency = (serial - overlapped) /
  min(compute, communication): the share of the smaller of the two that the overlap hid;
  ``comm_hidden`` = (serial - overlapped) / communication is the share of the communication
  time hidden.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import backends
from tp.comm.ring import chunk_bounds
from tp.functional import comm_stream
from tp.layers import ColumnParallelLinear, RowParallelLinear, reserve_sms

from .timing import seconds_per_call

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCES = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 5e-3}


def _ms(fn, iters, warmup, device, world) -> float:
    for _ in range(warmup):
        fn()
    return seconds_per_call(fn, iters, device, world) * 1e3


def _grads(y, inputs, grad_out):
    return torch.autograd.grad(y, inputs, grad_out, retain_graph=True)


def run(world, comm, self_comm, device: torch.device, dtype_name: str, tokens: int,
        hidden: int, ratio: float, backend: str, chunks: int, iters: int, warmup: int,
        seed: int = 0, sm_margin: int = 0) -> list[dict]:
    """All rows; collective over ``world`` (= the TP group ``comm``). ``self_comm`` is a
    one-rank communicator for the TP = 1 runs; ``sm_margin`` is the TP layers' (the TP = 1
    block has nothing to overlap and uses none).

    Raises:
        ValueError: ratio * hidden not a whole number, or not a multiple of the TP size.
    """
    p, r = comm.size, comm.rank
    inner = hidden * ratio
    if inner != int(inner) or int(inner) % p:
        raise ValueError(f"ratio * hidden = {inner} must be a whole multiple of the TP size {p}")
    inner = int(inner)
    dtype = DTYPES[dtype_name]
    torch.manual_seed(seed)  # the same masters and data on every rank (CPU and CUDA RNGs)
    fc1 = nn.Linear(hidden, inner, device=device)
    fc2 = nn.Linear(inner, hidden, device=device)
    # Everything rounded to the layers' dtype first, so the fp32 reference sees the very
    # values the layers see (a ReLU at a value that rounding moves across 0 would otherwise
    # pass a different gradient).
    with torch.no_grad():
        for t in (fc1.weight, fc1.bias, fc2.weight, fc2.bias):
            t.copy_(t.to(dtype))

    def randn(*shape):
        return torch.randn(shape, device=device).to(dtype).float()

    x, g1, g2 = randn(tokens, hidden), randn(tokens, inner), randn(tokens, hidden)

    # The dense reference in fp32 (TF32 off), with every gradient.
    with torch.enable_grad():
        xr = x.clone().requires_grad_(True)
        h = torch.relu(fc1(xr))
        ref_dx1, ref_dw1, ref_db1 = torch.autograd.grad(h, [xr, fc1.weight, fc1.bias], g1)
        hr = h.detach().to(dtype).float().requires_grad_(True)  # what fc2's layer receives
        out = fc2(hr)
        ref_dx2, ref_dw2, ref_db2 = torch.autograd.grad(out, [hr, fc2.weight, fc2.bias], g2)
    n, k = inner // p, inner // p
    cols, rows_ = slice(r * n, (r + 1) * n), slice(r * k, (r + 1) * k)

    def layers(group, overlap):
        kw = {"backend": backend, "overlap": overlap, "device": device, "dtype": dtype,
              "sm_margin": sm_margin if group.size > 1 else 0}
        return (ColumnParallelLinear(hidden, inner, group, activation="relu", master=fc1, **kw),
                RowParallelLinear(inner, hidden, group, master=fc2, chunks=chunks, **kw))

    col, row = layers(comm, overlap=True)
    col_serial, row_serial = layers(comm, overlap=False)
    tol = TOLERANCES[dtype_name]
    result = []

    def add(layer, phase, m, nn_, kk, ms, err):
        result.append({"layer": layer, "phase": phase, "tp": p, "M": m, "N": nn_, "K": kk,
                       "dtype": dtype_name, "ms": ms, "max_rel_err": err,
                       "ok": err is None or err <= tol})

    def err(*pairs):
        return max(backends.relative_error(got.float(), want.float()) for got, want in pairs)

    # Inputs and upstream gradients in the layers' dtype, made once: outside every timed region.
    grad1 = g1[:, cols].to(dtype).contiguous()  # fc1's shard of dL/dY
    grad2 = g2.to(dtype)

    # Column-parallel fc1.
    xd = x.to(dtype).requires_grad_(True)
    y1 = col(xd)
    dx1, dw1, db1 = _grads(y1, [xd, col.weight, col.bias], grad1)
    with torch.no_grad():
        fwd = _ms(lambda: col(xd), iters, warmup, device, world)
    add("column", "forward", tokens, n, hidden, fwd, err((y1, h[:, cols])))
    bwd = _ms(lambda: _grads(y1, [xd, col.weight, col.bias], grad1), iters, warmup, device,
              world)
    add("column", "backward", tokens, n, hidden, bwd,
        err((dx1, ref_dx1), (dw1, ref_dw1.t()[:, cols]), (db1, ref_db1[cols])))

    # Row-parallel fc2 on this rank's block of h (input_is_parallel).
    hd = hr.detach()[:, rows_].to(dtype).contiguous().requires_grad_(True)
    y2 = row(hd)
    dx2, dw2, db2 = _grads(y2, [hd, row.weight, row.bias], grad2)
    with torch.no_grad():
        fwd = _ms(lambda: row(hd), iters, warmup, device, world)
    add("row", "forward", tokens, hidden, k, fwd, err((y2, out)))
    bwd = _ms(lambda: _grads(y2, [hd, row.weight, row.bias], grad2), iters, warmup, device,
              world)
    add("row", "backward", tokens, hidden, k, bwd,
        err((dx2, ref_dx2[:, rows_]), (dw2, ref_dw2.t()[rows_]), (db2, ref_db2)))

    # The MLP block forward + backward, TP = P and TP = 1 (each rank alone).
    for group, (c, rw) in ((comm, (col, row)), (self_comm, layers(self_comm, overlap=False))):
        def block(c=c, rw=rw):
            xb = xd.detach().requires_grad_(True)
            rw(c(xb)).backward(grad2)
        add("mlp", "forward+backward", tokens, inner, hidden,
            _ms(block, iters, warmup, device, world), None)
        result[-1]["tp"] = group.size
    if p > 1:
        result += overlap_rows(world, comm, device, dtype_name, xd.detach(), hd.detach(), grad1,
                               (col, col_serial, row, row_serial), iters, warmup)
    return result


def overlap_rows(world, comm, device, dtype_name, xd, hd, grad_y, layers_, iters,
                 warmup) -> list[dict]:
    """Compute alone, communication alone, serial and overlapped, for both overlaps.

    ``xd`` is fc1's input, ``hd`` this rank's block of fc2's input and ``grad_y`` fc1's shard
    of the upstream gradient, all in the layers' dtype.
    """
    col, col_serial, row, row_serial = layers_
    out = []

    def record(layer, phase, m, n, k, compute, comm_ms, serial, overlapped, chunks=1):
        out.append({"layer": layer, "phase": phase, "tp": comm.size, "M": m, "N": n, "K": k,
                    "dtype": dtype_name, "chunks": chunks, "sm_margin": row.sm_margin,
                    "compute_ms": compute, "comm_ms": comm_ms, "serial_ms": serial,
                    "overlapped_ms": overlapped,
                    "overlap_efficiency": (serial - overlapped) / min(compute, comm_ms),
                    "comm_hidden": (serial - overlapped) / comm_ms})

    stream = comm_stream(device) if device.type == "cuda" else None

    # Row-parallel forward: the chunk GEMMs alone, the chunk all-reduces alone, then the layer.
    y = torch.empty(hd.shape[0], row.out_features, dtype=hd.dtype, device=device)
    bounds = chunk_bounds(hd.shape[0], row.chunks)
    spans = [slice(bounds[i], bounds[i + 1]) for i in range(row.chunks)]

    def gemms():
        for s in spans:
            with reserve_sms(row.sm_margin, device):
                backends.gemm(hd[s], row.weight, backend=row.backend, out=y[s])

    def reduces():
        for s in spans:
            comm.all_reduce(y[s], stream=stream)

    with torch.no_grad():
        record("row", "forward", hd.shape[0], row.out_features, hd.shape[1],
               _ms(gemms, iters, warmup, device, world), _ms(reduces, iters, warmup, device, world),
               _ms(lambda: row_serial(hd), iters, warmup, device, world),
               _ms(lambda: row(hd), iters, warmup, device, world), row.chunks)

    # Column-parallel backward: the dW GEMM (what can overlap) alone, the dX all-reduce alone.
    with torch.no_grad():
        dx = backends.gemm(grad_y, col.weight.t(), backend=col.backend)
    xs = xd.detach().requires_grad_(True)
    ys = col_serial(xs)
    xo = xd.detach().requires_grad_(True)
    yo = col(xo)
    def dw():
        with reserve_sms(col.sm_margin, device):
            backends.gemm(xd.t(), grad_y, backend=col.backend)

    with torch.no_grad():
        compute = _ms(dw, iters, warmup, device, world)
    record("column", "backward", xd.shape[0], grad_y.shape[1], xd.shape[1], compute,
           _ms(lambda: comm.all_reduce(dx, stream=stream), iters, warmup, device, world),
           _ms(lambda: _grads(ys, [xs, col_serial.weight, col_serial.bias], grad_y), iters,
               warmup, device, world),
           _ms(lambda: _grads(yo, [xo, col.weight, col.bias], grad_y), iters, warmup, device,
               world))
    return out


def plot(rows: list[dict], path: Path) -> None:
    """Left: ms per layer and phase. Right: the overlap report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("ms") is not None]
    lapped = [r for r in rows if "overlap_efficiency" in r]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), squeeze=False)
    ax = axes[0, 0]
    ax.barh([f"{r['layer']} {r['phase']}, TP={r['tp']}" for r in timed], [r["ms"] for r in timed])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(f"TP layers, {timed[0]['dtype']}, M = {timed[0]['M']}", fontsize=10)
    ax = axes[0, 1]
    keys = ["compute_ms", "comm_ms", "serial_ms", "overlapped_ms"]
    for i, r in enumerate(lapped):
        ax.bar([j + 0.4 * i for j in range(4)], [r[k] for k in keys], 0.4,
               label=f"{r['layer']} {r['phase']}: efficiency {r['overlap_efficiency']:.0%}")
    ax.set_xticks([j + 0.2 for j in range(4)], ["compute", "comm", "serial", "overlapped"])
    ax.set_ylabel("ms")
    ax.set_title("overlap", fontsize=10)
    if lapped:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
