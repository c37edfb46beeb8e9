"""Tensor-parallel communication as autograd functions, after Megatron-LM (Shoeybi et al.
2019, arXiv:1909.08053, sec. 3) and huggingface/picotron ``tensor_parallel``:

=====================  ===========================  ===================================
operator               forward                      backward
=====================  ===========================  ===================================
``gather_from_tp``     all-gather, last dimension   keep this rank's slice
``scatter_to_tp``      keep this rank's slice       all-gather, last dimension
``replicated``         identity                     all-reduce (sum over the TP group)
=====================  ===========================  ===================================

``replicated`` wraps a parameter that every TP rank holds whole but applies to its own block
of the tokens (sequence parallelism: a row-parallel layer's bias, LayerNorm), so each rank's
gradient is partial; summing it keeps the copies equal and equal to the dense gradient
(Megatron-LM sums them likewise, Korthikanti et al. 2022, arXiv:2205.05198).

Megatron's f (identity forward, all-reduce backward) and g (all-reduce forward, identity
backward) live inside the column- and row-parallel layers' own autograd functions
(``tp.layers``), fused with their GEMMs so that the communication can overlap them.
Each operator takes the TP group's ``tp.comm.Communicator``.
"""

from __future__ import annotations

import torch

from profiling.nvtx import name_stream

_COMM_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def comm_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream communication runs on while GEMMs run on the current stream. It has
    high priority, so the block scheduler starts a communication kernel's blocks as soon as
    SMs free up instead of after every pending block of a long GEMM. Named in Nsight Systems
    ``gemmlab comm``, and the current stream ``gemmlab compute``, where naming is available."""
    if device not in _COMM_STREAMS:
        _COMM_STREAMS[device] = torch.cuda.Stream(device, priority=-1)
        name_stream(_COMM_STREAMS[device], "gemmlab comm")
        name_stream(torch.cuda.current_stream(device), "gemmlab compute")
    return _COMM_STREAMS[device]


def all_gather_last_dim(x: torch.Tensor, comm) -> torch.Tensor:
    """(..., n) on each of P ranks -> (..., P * n), rank order along the last dimension."""
    if comm.size == 1:
        return x
    parts = comm.all_gather(x.contiguous())  # (P * d0, ...) stacked along dim 0
    parts = parts.view(comm.size, *x.shape)
    return torch.cat(parts.unbind(0), dim=-1)


def local_slice(x: torch.Tensor, comm) -> torch.Tensor:
    """This rank's block of the last dimension.

    Raises:
        ValueError: the last dimension is not a multiple of the TP size.
    """
    n = x.shape[-1]
    if n % comm.size:
        raise ValueError(f"last dimension {n} is not a multiple of the TP size {comm.size}")
    step = n // comm.size
    return x[..., comm.rank * step:(comm.rank + 1) * step].contiguous()


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return all_gather_last_dim(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return local_slice(grad, ctx.comm), None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return local_slice(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_last_dim(grad, ctx.comm), None


def gather_from_tp(x: torch.Tensor, comm) -> torch.Tensor:
    """All-gather along the last dimension forward; this rank's slice backward."""
    return _GatherFromTP.apply(x, comm)


def scatter_to_tp(x: torch.Tensor, comm) -> torch.Tensor:
    """This rank's slice of the last dimension forward; all-gather backward."""
    return _ScatterToTP.apply(x, comm)


class _Replicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, param, comm):
        ctx.comm = comm
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad):
        if ctx.comm.size > 1:
            grad = ctx.comm.all_reduce(grad.clone(memory_format=torch.contiguous_format))
        return grad, None


def replicated(param: torch.Tensor, comm) -> torch.Tensor:
    """``param`` itself forward; its gradient summed over the TP group backward."""
    return _Replicated.apply(param, comm)
