"""``gemmlab tp``: the tensor-parallel layers checked against the dense layers, then timed,
with the compute/communication overlap report.

The layers are an MLP block's: ``fc1`` column-parallel (hidden -> ratio * hidden, fused bias +
ReLU) and ``fc2`` row-parallel (back to hidden), cut from seeded dense masters identical on
every rank. Rows:

Every row is checked before it is timed (the GEMM bench's rule): ``max_rel_err`` is the
largest relative Frobenius error of its outputs and of every gradient it computes against the
dense layers in fp32, and a row above the dtype's tolerance is FAIL (``ok`` False) and never
timed (``ms`` None).

- ``column`` / ``row``, ``forward`` and ``backward``: time per call.
- ``mlp`` ``forward+backward`` at TP = P and at TP = 1 (every rank runs the whole block alone,
  on its own GPU, in the same run), so their ratio is the TP speedup; checked on the block's
  output, dX and every weight and bias gradient.
- overlap rows: for the row-parallel forward (chunk all-reduces against the next chunks'
  GEMMs) and the column-parallel backward (the dX all-reduce against the dW GEMM): compute
  alone (every GEMM of the phase as the layer runs it, with its SM margin: the row forward's
  chunk GEMMs, the column backward's dX and dW GEMMs), communication alone, the layer with
  overlap off (serial) and on (overlapped), each checked (the compute alone against its
  partial product, the communication alone against the all-reduced sum, the layers against
  the dense ones). From the three measured in the run: ``comm_hidden`` = (compute +
  communication - overlapped) / communication, the share of the communication time hidden,
  and ``overlap_efficiency`` = (compute + communication - overlapped) / min(compute,
  communication), the share of the smaller of the two. (Result files before this rule used
  the serial layer's time in place of compute + communication.)
- with ``sequence_parallel``: ``sp mlp`` forward+backward, the block on this rank's token
  block (checked on its block of the output and of dX, and every gradient), and the
  overlap rows ``sp column`` (AG+GEMM) and ``sp row`` (GEMM+RS), see
  ``sequence_parallel_rows``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import backends
from backends import dtypes
from tp.comm.ring import chunk_bounds
from tp.functional import comm_stream
from tp.layers import ColumnParallelLinear, RowParallelLinear, reserve_sms
from tp.overlap import pieces

from .timing import seconds_per_call


def _agreed(error: float, world) -> float:
    """The largest of every rank's ``error`` (NaN counts as infinite): each rank checks its
    own shards, and all must take the same verdict, or one rank would time collectives the
    others skip."""
    from mpi4py import MPI

    return world.allreduce(error if error == error else float("inf"), op=MPI.MAX)


def _ms(fn, iters, warmup, device, world) -> float:
    for _ in range(warmup):
        fn()
    return seconds_per_call(fn, iters, device, world) * 1e3


def _grads(y, inputs, grad_out):
    return torch.autograd.grad(y, inputs, grad_out, retain_graph=True)


def run(world, comm, self_comm, device: torch.device, dtype_name: str, tokens: int,
        hidden: int, ratio: float, backend: str, chunks: int, iters: int, warmup: int,
        seed: int = 0, sm_margin: int = 0, sequence_parallel: bool = False,
        cuda_graph: bool = False, record: Callable[[dict], None] | None = None) -> list[dict]:
    """All rows; collective over ``world`` (= the TP group ``comm``). ``self_comm`` is a
    one-rank communicator for the TP = 1 runs; ``sm_margin`` is the TP layers' (the TP = 1
    block has nothing to overlap and uses none). ``dtype_name``: one of
    ``backends.dtypes.TP``, whose tolerance the checks use. ``sequence_parallel`` adds the
    sequence-parallel rows (``sequence_parallel_rows`` and the SP block). ``cuda_graph`` adds
    the MLP block (and the SP block) at TP = P once more, captured into one CUDA graph and
    replayed (``graph_row``; needs a stream-ordered communicator on CUDA). ``record``, when
    given, is called with each row as soon as it is finished.

    Raises:
        ValueError: ratio * hidden not a whole number, or not a multiple of the TP size; with
            ``sequence_parallel``, tokens not a multiple of the TP size; a dtype outside
            ``backends.dtypes.TP``.
    """
    p, r = comm.size, comm.rank
    inner = hidden * ratio
    if inner != int(inner) or int(inner) % p:
        raise ValueError(f"ratio * hidden = {inner} must be a whole multiple of the TP size {p}")
    inner = int(inner)
    if sequence_parallel and tokens % p:
        raise ValueError(f"sequence parallelism needs the tokens ({tokens}) divisible by the "
                         f"TP size {p}")
    spec = dtypes.parse(dtype_name, dtypes.TP)
    dtype, tol = spec.torch, spec.tolerance
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

    # The dense reference in fp32 (TF32 off), with every gradient: each layer alone, and the
    # block (fc2 after fc1, its upstream gradient g2).
    params = [fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    with torch.enable_grad():
        xr = x.clone().requires_grad_(True)
        h = torch.relu(fc1(xr))
        ref_dx1, ref_dw1, ref_db1 = torch.autograd.grad(h, [xr, fc1.weight, fc1.bias], g1)
        hr = h.detach().to(dtype).float().requires_grad_(True)  # what fc2's layer receives
        out = fc2(hr)
        ref_dx2, ref_dw2, ref_db2 = torch.autograd.grad(out, [hr, fc2.weight, fc2.bias], g2)
        xb = x.clone().requires_grad_(True)
        ref_block = torch.autograd.grad(fc2(torch.relu(fc1(xb))), [xb, *params], g2)
    n, k = inner // p, inner // p
    cols, rows_ = slice(r * n, (r + 1) * n), slice(r * k, (r + 1) * k)

    def layers(group, overlap, sp=False):
        kw = {"backend": backend, "overlap": overlap, "device": device, "dtype": dtype,
              "sm_margin": sm_margin if group.size > 1 else 0, "chunks": chunks,
              "sequence_parallel": sp}
        return (ColumnParallelLinear(hidden, inner, group, activation="relu", master=fc1, **kw),
                RowParallelLinear(inner, hidden, group, master=fc2, **kw))

    col, row = layers(comm, overlap=True)
    col_serial, row_serial = layers(comm, overlap=False)
    result = []

    def _keep(row: dict) -> None:
        result.append(row)
        if record is not None:
            record(row)

    def add(layer, phase, m, nn_, kk, error, fn, tp=p):
        """A row: timed only when its check (``error``, already measured) passed."""
        error = _agreed(error, world)
        ok = error <= tol
        _keep({"layer": layer, "phase": phase, "tp": tp, "M": m, "N": nn_, "K": kk,
               "dtype": dtype_name, "cuda_graph": False, "max_rel_err": error, "ok": ok,
               "ms": _ms(fn, iters, warmup, device, world) if ok else None})

    # Inputs and upstream gradients in the layers' dtype, made once: outside every timed region.
    grad1 = g1[:, cols].to(dtype).contiguous()  # fc1's shard of dL/dY
    grad2 = g2.to(dtype)

    # Column-parallel fc1.
    xd = x.to(dtype).requires_grad_(True)
    col_check = _column_check(col, xd, grad1, h[:, cols], (ref_dx1, ref_dw1.t()[:, cols],
                                                           ref_db1[cols]))
    with torch.no_grad():
        add("column", "forward", tokens, n, hidden, col_check[0], lambda: col(xd))
    y1 = col(xd)
    add("column", "backward", tokens, n, hidden, col_check[1],
        lambda y1=y1: _grads(y1, [xd, col.weight, col.bias], grad1))

    # Row-parallel fc2 on this rank's block of h (input_is_parallel).
    hd = hr.detach()[:, rows_].to(dtype).contiguous().requires_grad_(True)
    y2 = row(hd)
    dx2, dw2, db2 = _grads(y2, [hd, row.weight, row.bias], grad2)
    with torch.no_grad():
        add("row", "forward", tokens, hidden, k, _err((y2, out)), lambda: row(hd))
    add("row", "backward", tokens, hidden, k,
        _err((dx2, ref_dx2[:, rows_]), (dw2, ref_dw2.t()[rows_]), (db2, ref_db2)),
        lambda y2=y2: _grads(y2, [hd, row.weight, row.bias], grad2))
    # The autograd graphs the backward rows kept alive hold each weight's gradient
    # accumulator, bound to the stream it was made on; a CUDA graph capture must make its own.
    del y1, y2

    # The MLP block forward + backward, TP = P and TP = 1 (each rank alone): checked on its
    # output, dX and every parameter's gradient (this rank's shards at TP = P).
    with torch.no_grad():
        ref_out = fc2(torch.relu(fc1(x)))
    for group, (c, rw) in ((comm, (col, row)), (self_comm, layers(self_comm, overlap=False))):
        def block(c=c, rw=rw):
            xb = xd.detach().requires_grad_(True)
            y = rw(c(xb))
            y.backward(grad2)
            return y, xb.grad

        shard = slice(r * n, (r + 1) * n) if group.size > 1 else slice(None)
        block_params = (c.weight, c.bias, rw.weight, rw.bias)

        def block_error(y, dx, c=c, rw=rw, shard=shard):
            return _err((y, ref_out), (dx, ref_block[0]),
                        (c.weight.grad, ref_block[1].t()[:, shard]),
                        (c.bias.grad, ref_block[2][shard]),
                        (rw.weight.grad, ref_block[3].t()[shard]), (rw.bias.grad, ref_block[4]))

        for param in block_params:
            param.grad = None
        add("mlp", "forward+backward", tokens, inner, hidden, block_error(*block()), block,
            tp=group.size)
        if cuda_graph and group.size > 1:
            _keep(graph_row(world, device, tol, iters, warmup, result[-1], block, block_params,
                            block_error))
    if sequence_parallel and p > 1:
        # The block on this rank's token block: SP column (AG+GEMM) then SP row (GEMM+RS).
        col_sp, row_sp = layers(comm, overlap=True, sp=True)
        t = tokens // p
        mine = slice(r * t, (r + 1) * t)

        def sp_block():
            xb = xd.detach()[mine].requires_grad_(True)
            y = row_sp(col_sp(xb))
            y.backward(grad2[mine])
            return y, xb.grad

        sp_params = (col_sp.weight, col_sp.bias, row_sp.weight, row_sp.bias)

        def sp_error(y, dx):
            return _err((y, ref_out[mine]), (dx, ref_block[0][mine]),
                        (col_sp.weight.grad, ref_block[1].t()[:, cols]),
                        (col_sp.bias.grad, ref_block[2][cols]),
                        (row_sp.weight.grad, ref_block[3].t()[rows_]),
                        (row_sp.bias.grad, ref_block[4]))

        for param in sp_params:
            param.grad = None
        add("sp mlp", "forward+backward", tokens, inner, hidden, sp_error(*sp_block()),
            sp_block)
        if cuda_graph:
            _keep(graph_row(world, device, tol, iters, warmup, result[-1], sp_block, sp_params,
                            sp_error))
        result += sequence_parallel_rows(
            world, comm, device, dtype_name, tol, iters, warmup,
            ((col_sp, row_sp), layers(comm, overlap=False, sp=True)), xd.detach(),
            hr.detach()[:, rows_].to(dtype), (h[:, cols], out, fc2.bias), on_row=record)
    if p > 1:
        result += overlap_rows(world, comm, device, dtype_name, tol, xd.detach(), hd.detach(),
                               grad1, (col, col_serial, row, row_serial), iters, warmup,
                               refs=(fc1, fc2, hr.detach()[:, rows_], out, col_check,
                                     (ref_dx1, ref_dw1.t()[:, cols], ref_db1[cols])),
                               on_row=record)
    return result


def graph_row(world, device, tol, iters, warmup, eager: dict, block, params, error_of) -> dict:
    """The row ``eager`` (a block's forward+backward) again with ``block`` captured into one
    CUDA graph and replayed (``replayed``): its outputs, dX and the ``params``' gradients are
    poisoned, and ``error_of(y, dx)`` checks one replay before the row is timed by replays.

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    def captured():
        for param in params:  # the capture allocates the gradients it writes (no +=)
            param.grad = None
        y, dx = block()
        return (y, dx, *(param.grad for param in params))

    checked = replayed(world, device, captured, lambda y, dx, *grads: error_of(y, dx), tol,
                       iters, warmup)
    row = {**eager, "cuda_graph": True, "ms": checked["ms"], "max_rel_err": checked["error"],
           "ok": checked["ok"]}
    if "reason" in checked:
        row["error"] = checked["reason"]
    return row


def replayed(world, device, fn, error_of, tol, iters, warmup) -> dict:
    """``fn`` (returning a tuple of tensors) captured into one CUDA graph (``timing.capture``:
    a warm-up call on a side stream, then the capture; every rank captures at once, so the
    collectives in it pair up), checked, then timed by replays: the tensors the capture
    returned (allocated by it, rewritten by every replay) are poisoned with NaN, one replay
    runs, and ``error_of(*tensors)`` checks them, agreed over the ranks; the replays are
    timed (``ms``, mean ms per replay, the slowest rank's) only when every rank passed
    (``error_of``'s value, the largest over the ranks, <= ``tol``). Returns ``{"error" (that
    value), "ok", "ms"}``, and ``"reason"`` saying why when CUDA refused the capture (then
    the error is inf and nothing is timed).

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device; got {device}")
    from .timing import capture

    result = {"ms": None}
    try:
        graph, outputs = capture(fn)
        with torch.no_grad():
            for t in outputs:
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(device)
        error = error_of(*outputs)
    except RuntimeError as exc:  # a capture CUDA refuses: say why, on every rank
        error, result["reason"] = float("inf"), f"{type(exc).__name__}: {exc}"
    result["error"] = _agreed(error, world)
    result["ok"] = result["error"] <= tol
    if result["ok"]:
        result["ms"] = _ms(graph.replay, iters, warmup, device, world)
    return result


def _overlap_row(world, comm, device, dtype_name, tol, iters, warmup, row: dict, checks,
                 timed) -> dict:
    """An overlap row: ``checks``, the error of each piece, agreed over the ranks; when all
    pass, ``timed`` (compute alone, communication alone, serial, overlapped) are timed and
    the shares computed (module doc)."""
    error = _agreed(max(checks), world)
    row = {**row, "tp": comm.size, "dtype": dtype_name, "max_rel_err": error,
           "ok": error <= tol, "compute_ms": None, "comm_ms": None, "serial_ms": None,
           "overlapped_ms": None, "overlap_efficiency": None, "comm_hidden": None}
    if row["ok"]:
        compute, comm_ms, serial, overlapped = (_ms(fn, iters, warmup, device, world)
                                                for fn in timed)
        comm_hidden, efficiency = shares(compute, comm_ms, overlapped)
        row.update(compute_ms=compute, comm_ms=comm_ms, serial_ms=serial,
                   overlapped_ms=overlapped, comm_hidden=comm_hidden,
                   overlap_efficiency=efficiency)
    return row


def shares(compute: float, comm: float, overlapped: float) -> tuple[float, float]:
    """(comm_hidden, overlap_efficiency) from compute alone, communication alone and the
    overlapped run, all in ms: the time hidden, compute + comm - overlapped, as a share of
    the communication and of the smaller of the two."""
    hidden = compute + comm - overlapped
    return hidden / comm, hidden / min(compute, comm)


def _err(*pairs) -> float:
    """The largest relative Frobenius error of (got, want) pairs, in fp32."""
    return max(backends.relative_error(got.float(), want.float()) for got, want in pairs)


def _column_check(col, xd, grad_y, ref_y, ref_grads, forward=True) -> tuple[float, float]:
    """Forward (0.0 unless ``forward``) and backward errors of column-parallel layer ``col``
    on ``xd``."""
    with torch.enable_grad():
        xs = xd.detach().requires_grad_(True)
        y = col(xs)
        dx, dw, db = _grads(y, [xs, col.weight, col.bias], grad_y)
    return (_err((y, ref_y)) if forward else 0.0), _err(*zip((dx, dw, db), ref_grads))


def sequence_parallel_rows(world, comm, device, dtype_name, tol, iters, warmup, layers_, xd,
                           hd, refs, on_row: Callable[[dict], None] | None = None
                           ) -> list[dict]:
    """The two decomposed overlaps of sequence parallelism (``tp.overlap``), each as compute
    alone, communication alone, serial and overlapped, checked before timed:

    - ``sp column`` forward, AG+GEMM: the chunk GEMMs on the already gathered input, the
      chunk all-gathers of this rank's token block, the layer with overlap off and on;
    - ``sp row`` forward, GEMM+RS: the chunk GEMMs of every token's partial product, the
      chunk reduce-scatters of those, the layer with overlap off and on.

    ``layers_``: ((column, row) with overlap on, the same with it off), all sequence
    parallel. ``xd``: fc1's input for every token; ``hd``: fc2's input, every token, this
    rank's block of columns, both in the layers' dtype. ``refs``: fc1's fp32 output (this
    rank's columns), fc2's fp32 output, fc2's bias.
    """
    (col, row), (col_serial, row_serial) = layers_
    ref_h, ref_out, bias = refs
    p, r = comm.size, comm.rank
    t = xd.shape[0] // p
    mine = slice(r * t, (r + 1) * t)
    block = xd[mine].contiguous()
    spans = pieces(t, row.chunks)  # the layers' chunks
    stream = comm_stream(device) if device.type == "cuda" else None
    out = []

    def record(layer, m, n, k, checks, timed):
        out.append(_overlap_row(world, comm, device, dtype_name, tol, iters, warmup,
                                {"layer": layer, "phase": "forward", "M": m, "N": n, "K": k,
                                 "chunks": row.chunks, "sm_margin": row.sm_margin},
                                checks, timed))
        if on_row is not None:
            on_row(out[-1])

    def each_rank_rows():  # (rank q's rows lo..hi of every token block, piece i)
        return ((i, q, lo, hi) for i, (lo, hi) in enumerate(spans) for q in range(p))

    # AG+GEMM: the GEMMs as the layer runs them, on the gathered input; the all-gathers.
    y = torch.empty(xd.shape[0], col.weight.shape[1], dtype=xd.dtype, device=device)
    gathered: list = []

    @torch.no_grad()
    def ag_gemms():
        for _, q, lo, hi in each_rank_rows():
            rows = slice(q * t + lo, q * t + hi)
            backends.gemm(xd[rows], col.weight, col.bias, activation="relu",
                          backend=col.backend, out=y[rows])

    def ag_comm():
        gathered[:] = [comm.all_gather(block[lo:hi].contiguous(), stream=stream)
                       for lo, hi in spans]

    with torch.no_grad():
        ag_gemms()
        ag_comm()
        checks = [_err((y, ref_h))]
        checks += [_err((gathered[i][q * (hi - lo):(q + 1) * (hi - lo)],
                         xd[q * t + lo:q * t + hi])) for i, q, lo, hi in each_rank_rows()]
        checks += [_err((col_serial(block), ref_h)), _err((col(block), ref_h))]
    record("sp column", xd.shape[0], col.weight.shape[1], xd.shape[1], checks,
           (ag_gemms, ag_comm, torch.no_grad()(lambda: col_serial(block)),
            torch.no_grad()(lambda: col(block))))

    # GEMM+RS: every token's partial product chunk by chunk; the reduce-scatters.
    parts = [torch.empty(p * (hi - lo), row.out_features, dtype=hd.dtype, device=device)
             for lo, hi in spans]
    reduced = torch.empty(t, row.out_features, dtype=hd.dtype, device=device)

    @torch.no_grad()
    def rs_gemms():
        for i, q, lo, hi in each_rank_rows():
            backends.gemm(hd[q * t + lo:q * t + hi], row.weight, backend=row.backend,
                          out=parts[i][q * (hi - lo):(q + 1) * (hi - lo)])

    def rs_comm():
        for (lo, hi), part in zip(spans, parts):
            comm.reduce_scatter(part, out=reduced[lo:hi], stream=stream)

    with torch.no_grad():
        rs_gemms()
        partial = hd.float() @ row.weight.float()
        checks = [_err((parts[i][q * (hi - lo):(q + 1) * (hi - lo)],
                        partial[q * t + lo:q * t + hi])) for i, q, lo, hi in each_rank_rows()]
        rs_comm()
        checks += [_err((reduced, ref_out[mine] - bias)), _err((row_serial(hd), ref_out[mine])),
                   _err((row(hd), ref_out[mine]))]
    record("sp row", xd.shape[0], row.out_features, hd.shape[1], checks,
           (rs_gemms, rs_comm, torch.no_grad()(lambda: row_serial(hd)),
            torch.no_grad()(lambda: row(hd))))
    return out


def overlap_rows(world, comm, device, dtype_name, tol, xd, hd, grad_y, layers_, iters,
                 warmup, refs, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Compute alone, communication alone, serial and overlapped, for both overlaps, each
    checked before it is timed (module doc).

    ``xd`` is fc1's input, ``hd`` this rank's block of fc2's input and ``grad_y`` fc1's shard
    of the upstream gradient, all in the layers' dtype. ``refs`` holds the fp32 references:
    the dense ``fc1`` and ``fc2``, this rank's block of fc2's input in fp32, fc2's dense
    output, the column layers' (forward, backward) errors already measured, and fc1's
    reference gradients (dX, this rank's dW and db). ``on_row``, when given, is called with
    each row as soon as it is finished.
    """
    col, col_serial, row, row_serial = layers_
    fc1, fc2, h_block, ref_out, col_errors, col_ref_grads = refs
    out = []

    def record(layer, phase, m, n, k, chunks, checks, timed):
        out.append(_overlap_row(world, comm, device, dtype_name, tol, iters, warmup,
                                {"layer": layer, "phase": phase, "M": m, "N": n, "K": k,
                                 "chunks": chunks, "sm_margin": row.sm_margin}, checks, timed))
        if on_row is not None:
            on_row(out[-1])

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
        gemms()  # this rank's partial product, then its sum over the ranks: fc2 less its bias
        partial = h_block @ row.weight.float()
        checks = [_err((y, partial))]
        reduces()
        checks += [_err((y, ref_out - fc2.bias)), _err((row_serial(hd), ref_out)),
                   _err((row(hd), ref_out))]
        record("row", "forward", hd.shape[0], row.out_features, hd.shape[1], row.chunks, checks,
               (gemms, reduces, lambda: row_serial(hd), lambda: row(hd)))

    # Column-parallel backward: its GEMMs alone (dX, whose all-reduce then overlaps dW), the dX
    # all-reduce alone.
    with torch.no_grad():
        dx = backends.gemm(grad_y, col.weight.t(), backend=col.backend)
        dx_sum = comm.all_reduce(dx.clone())
        dw_alone = backends.gemm(xd.t(), grad_y, backend=col.backend)
    # dX summed over the ranks is grad_y's full width through fc1 (no ReLU mask here: the
    # pieces time the layer's GEMM and all-reduce, not its activation).
    grad_full = comm.all_gather(grad_y.float().t().contiguous()).t()
    checks = [_err((dw_alone, xd.float().t() @ grad_y.float())),
              _err((dx_sum, grad_full @ fc1.weight)), col_errors[1],
              _column_check(col_serial, xd, grad_y, None, col_ref_grads, forward=False)[1]]
    xs = xd.detach().requires_grad_(True)
    ys = col_serial(xs)
    xo = xd.detach().requires_grad_(True)
    yo = col(xo)

    @torch.no_grad()  # as in the layer's backward, where autograd records nothing
    def gemms_backward():
        backends.gemm(grad_y, col.weight.t(), backend=col.backend)
        with reserve_sms(col.sm_margin, device):
            backends.gemm(xd.t(), grad_y, backend=col.backend)

    record("column", "backward", xd.shape[0], grad_y.shape[1], xd.shape[1], 1, checks,
           (gemms_backward, lambda: comm.all_reduce(dx, stream=stream),
            lambda: _grads(ys, [xs, col_serial.weight, col_serial.bias], grad_y),
            lambda: _grads(yo, [xo, col.weight, col.bias], grad_y)))
    return out


def plot(rows: list[dict], path: Path) -> None:
    """Left: ms per layer and phase. Right: the overlap report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("ms") is not None]  # FAIL rows have no time
    lapped = [r for r in rows if r.get("overlap_efficiency") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), squeeze=False)
    ax = axes[0, 0]
    ax.barh([f"{r['layer']} {r['phase']}, TP={r['tp']}" for r in timed], [r["ms"] for r in timed])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.tick_params(axis="y", labelsize=8)
    if timed:
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
