"""A collective and the GEMM that consumes or produces it, decomposed into chunks so they
overlap: all-gather -> GEMM (AG+GEMM) and GEMM -> reduce-scatter (GEMM+RS), the two halves of
sequence-parallel tensor parallelism.

The decomposition is Wang et al.'s ("Overlap Communication with Dependent Computation via
Decomposition in Large Deep Learning Models", ASPLOS 2023), as PyTorch's async TP
(``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``) and ByteDance's Flux do it.
Each rank holds T / P tokens (rows). A chunk is the same ``chunks``-th of every rank's block:

- AG+GEMM: chunk i of every block is all-gathered while chunk i-1's rows are multiplied, and
  each gathered piece lands in its natural place in the full (T, K) input (kept: the
  backward's dW needs it);
- GEMM+RS: chunk i's rows of every block are multiplied into one buffer, and its
  reduce-scatter (each rank gets the sum of its own rows) runs while chunk i+1 computes.

The communication goes through the communicator on its own stream (``comm_stream``): on the
``symm`` communicator that is the copy engine pulling from peers' buffers, so no SM is taken
from the GEMM. With ``overlap`` off the same chunks run one after another: the results are
bit-identical either way.
"""

from __future__ import annotations

import torch

from backends import BACKENDS, gemm
from profiling.nvtx import annotate

from .comm.base import Work
from .comm.ring import chunk_bounds
from .functional import comm_stream


def pieces(n: int, chunks: int) -> list[tuple[int, int]]:
    """The ``chunks`` row ranges (lo, hi) of a token block of ``n`` rows (``chunk_bounds``'s
    split; the last ones empty when n < chunks): the chunks both decompositions run, in
    order. Empty ones too: every rank then issues ``chunks`` collectives, so ranks whose
    blocks differ meet a shape the call check refuses instead of pairing unrelated calls."""
    bounds = chunk_bounds(n, chunks)
    return list(zip(bounds, bounds[1:]))


def all_gather_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, comm, *,
                    activation: str | None = None, backend: str = "cublas", chunks: int = 4,
                    overlap: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Y = act(X W + b) with X all-gathered from every rank's token block, chunk by chunk.

    Args:
        x: this rank's block of the tokens, (n, K); every rank holds the same n.
        weight: (K, N); bias: None or (N,).
        comm: the TP group's communicator (P ranks).
        activation, backend: as for ``backends.gemm``.
        chunks: pieces each block is cut into (the last ones empty when n < chunks).
        overlap: all-gather chunk i+1 while chunk i's GEMMs run.

    Returns:
        (Y, X): Y (P n, N) and the gathered X (P n, K), both in token order (rank 0's block,
        then rank 1's, ...).
    """
    p, n = comm.size, x.shape[0]
    weight = _for(backend, weight)
    gathered = x.new_empty(p * n, x.shape[1])
    y = x.new_empty(p * n, weight.shape[1])
    stream = comm_stream(x.device) if overlap and x.is_cuda else None
    spans = pieces(n, chunks)

    def start(i: int):
        lo, hi = spans[i]
        return comm.all_gather(x[lo:hi].contiguous(), stream=stream, async_op=overlap)

    pending = start(0)
    for i, (lo, hi) in enumerate(spans):
        current = pending
        if i + 1 < len(spans):
            pending = start(i + 1)  # in flight during this chunk's GEMMs
        piece = current.wait() if overlap else current
        with annotate("compute chunk", payload=i):
            for q in range(p):  # rank q's rows lo..hi land at q n + lo
                rows = slice(q * n + lo, q * n + hi)
                gathered[rows].copy_(piece[q * (hi - lo):(q + 1) * (hi - lo)])
                gemm(gathered[rows], weight, bias, activation=activation, backend=backend,
                     out=y[rows])
    return y, gathered


def gemm_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, comm, *,
                        backend: str = "cublas", chunks: int = 4,
                        overlap: bool = True) -> Work:
    """This rank's token block of sum over ranks of X W, chunk by chunk.

    Args:
        x: every token's row of this rank's partial product input, (P n, K).
        weight: (K, N).
        comm, backend, chunks: as for ``all_gather_gemm``.
        overlap: reduce-scatter chunk i while chunk i+1's GEMMs run.

    Returns:
        A ``Work`` whose ``wait()`` gives the (n, N) sum of this rank's rows (rows r n ..
        (r + 1) n of every rank's X W): the caller can queue more work (the dW GEMM) before
        waiting.

    Raises:
        ValueError: the tokens are not a multiple of the TP size.
    """
    p, t = comm.size, x.shape[0]
    if t % p:
        raise ValueError(f"GEMM+RS needs the tokens ({t}) divisible by the TP size {p}")
    n = t // p
    weight = _for(backend, weight)
    out = x.new_empty(n, weight.shape[1])
    stream = comm_stream(x.device) if overlap and x.is_cuda else None
    pending = []
    for i, (lo, hi) in enumerate(pieces(n, chunks)):
        part = x.new_empty(p * (hi - lo), weight.shape[1])  # rank q's rows at q (hi - lo)
        with annotate("compute chunk", payload=i):
            for q in range(p):
                gemm(x[q * n + lo:q * n + hi], weight, backend=backend,
                     out=part[q * (hi - lo):(q + 1) * (hi - lo)])
        work = comm.reduce_scatter(part, out=out[lo:hi], stream=stream, async_op=overlap)
        pending.append((work, part))  # part stays alive until its reduce-scatter is done

    def wait() -> torch.Tensor:
        if overlap:
            for work, _ in pending:
                work.wait()
        return out

    return Work(wait)


def _for(backend: str, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as the chunk GEMMs read it: a backend that takes contiguous operands only
    would copy a transposed weight at every one of them, so it is copied once here."""
    return weight if BACKENDS[backend].strided else weight.contiguous()
