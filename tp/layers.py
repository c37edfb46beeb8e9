"""Column- and row-parallel linear layers (Megatron-LM, Shoeybi et al. 2019,
arXiv:1909.08053, sec. 3; structure after huggingface/picotron ``tensor_parallel``).

With P TP ranks and Y = X W + b (W of shape (in, out), the transpose of ``nn.Linear``'s):

- ``ColumnParallelLinear``: W = [W_1 ... W_P] split by columns; rank r computes
  Y_r = act(X W_r + b_r) from the full X. Forward needs no communication (Megatron's f is the
  identity); backward all-reduces dX = sum_r dY_r W_r^T (f's backward). With ``overlap``
  that all-reduce runs on a communication stream while dW = X^T dY_r is computed, the order
  Megatron-LM uses. ``gather_output`` all-gathers Y along the last dimension.
- ``RowParallelLinear``: W = [W_1; ...; W_P] split by rows, X split by columns; rank r computes
  X_r W_r and the partial products are summed by an all-reduce (Megatron's g), then the bias
  is added once. With ``overlap`` the rows of X are processed in ``chunks``: the all-reduce of
  chunk i runs while the GEMM of chunk i+1 computes. The chunking is the same with overlap
  off, so both give identical results.
- With ``sequence_parallel`` (Korthikanti et al. 2022) activations between the layers hold
  each rank's block of the tokens: the column layer all-gathers its input into its GEMM
  and the row layer reduce-scatters its output, both decomposed into chunks that overlap
  (AG+GEMM and GEMM+RS, ``tp.overlap``), forward and backward.

The local GEMMs go through ``backends.gemm`` (the backend is a constructor argument; a
column-parallel layer with ``activation="relu"`` uses the fused bias + ReLU epilogue; with
``"gelu"`` the bias is fused and GELU, which no backend's epilogue has, runs after). Both
layers cut their shard from one full master ``nn.Linear`` (given, or created from torch's
global RNG, identically on every rank), so a TP layer can be compared with the dense layer.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from backends import gemm
from profiling.nvtx import annotate

from .comm.ring import chunk_bounds
from .functional import comm_stream, gather_from_tp, replicated, scatter_to_tp
from .overlap import all_gather_gemm, gemm_reduce_scatter


@contextlib.contextmanager
def reserve_sms(sms: int, device: torch.device):
    """cuBLAS GEMMs started inside leave ``sms`` SMs free for the communication kernels that
    run beside them.

    cuBLAS's Hopper GEMMs are persistent (one block per SM loops over the output tiles): next
    to a running NCCL kernel some of those blocks can only start when it ends, and the GEMM
    takes up to twice as long (PyTorch's note on ``_SMCarveout_EXPERIMENTAL`` in
    ATen/Context.h). Inside, GEMMs go through cuBLASLt with ``CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET``
    = SMs - ``sms`` (PyTorch's experimental SM carveout), as Transformer Engine's ``sm_margin``
    does. A no-op for ``sms=0`` and off CUDA; the other backends launch one block per tile,
    which the scheduler interleaves with communication blocks by itself.
    """
    if not sms or device.type != "cuda":
        yield
        return
    library = torch.backends.cuda.preferred_blas_library()
    carveout = torch._C._get_sm_carveout_experimental()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(carveout)
        torch.backends.cuda.preferred_blas_library(library)


def _async_all_reduce(x: torch.Tensor, comm):
    """Start an all-reduce of ``x`` in place, on the communication stream for CUDA tensors."""
    stream = comm_stream(x.device) if x.is_cuda else None
    return comm.all_reduce(x, stream=stream, async_op=True)


class _TPLinear(nn.Module):
    """What both layers share: the shard, its checks, and the communication switches."""

    def __init__(self, in_features, out_features, comm, split: str, bias, backend, overlap,
                 sm_margin, master, device, dtype, name, sequence_parallel, chunks):
        super().__init__()
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1; got {chunks}")
        self.sequence_parallel, self.chunks = sequence_parallel, chunks
        self.name = name or type(self).__name__
        p = comm.size
        if sm_margin < 0:
            raise ValueError(f"sm_margin must be >= 0; got {sm_margin}")
        split_dim = out_features if split == "columns" else in_features
        if split_dim % p:
            raise ValueError(f"{type(self).__name__}: {'out' if split == 'columns' else 'in'}"
                             f"_features={split_dim} is not a multiple of the TP size {p}")
        if overlap and p > 1 and (why := comm.async_unavailable_reason()) is not None:
            raise ValueError(f"overlap needs asynchronous communication: {why}")
        if master is None:
            master = nn.Linear(in_features, out_features, bias=bias)
        elif (master.in_features, master.out_features) != (in_features, out_features):
            raise ValueError(f"master is {master.in_features} -> {master.out_features}; "
                             f"expected {in_features} -> {out_features}")
        elif bias and master.bias is None:
            raise ValueError("bias=True but the master has no bias: pass bias=False, or a "
                             "master with one")
        self._split, self._part = split, slice(comm.rank * (split_dim // p),
                                               (comm.rank + 1) * (split_dim // p))
        shard = self.shard(master.weight.detach().t())  # of the (in, out) weight
        self.weight = nn.Parameter(shard.to(device=device, dtype=dtype).contiguous())
        self.bias = None
        if bias:
            b = self.shard(master.bias.detach(), bias=True)
            self.bias = nn.Parameter(b.to(device=device, dtype=dtype).contiguous())
        self.in_features, self.out_features = in_features, out_features
        self.comm, self.backend, self.overlap = comm, backend, overlap
        self.sm_margin = sm_margin

    def split_dim(self, bias: bool = False) -> int | None:
        """The dimension of the full (in, out) weight, or of the full (out,) bias, that is cut
        into P equal blocks over the TP ranks (rank r holds block r); None when every rank
        holds it whole (a row-parallel layer's bias)."""
        if self._split == "columns":
            return 0 if bias else 1
        return None if bias else 0

    def shard(self, full: torch.Tensor, bias: bool = False) -> torch.Tensor:
        """This rank's part of a full (in, out) weight, or of a full (out,) bias (whole for a
        row-parallel layer), as the layer cuts its own from the master: for comparing
        gradients with a dense layer's, and for loading dense weights (``tp.checkpoint``)."""
        dim = self.split_dim(bias)
        if dim is None:
            return full
        return full.narrow(dim, self._part.start, self._part.stop - self._part.start)

    def _check_tokens(self, rows: int, what: str) -> None:
        """Sequence parallelism splits the tokens (the rows of the flattened input or
        output) into P equal blocks: refuse a count the TP size does not divide."""
        if self.sequence_parallel and rows % self.comm.size:
            raise ValueError(f"{self.name}: sequence parallelism needs {what} divisible by the "
                             f"TP size {self.comm.size}; got {rows}")

    def _check_input(self, x: torch.Tensor, width: int, what: str) -> None:
        """Refuse an input whose last dimension is not ``width``, before any GEMM or
        communication (a wrong width would otherwise fail inside a reshape, or after an
        all-reduce)."""
        if x.dim() < 1 or x.shape[-1] != width:
            raise ValueError(f"{self.name}: the input must be (..., {width}) ({what}); got "
                             f"{tuple(x.shape)}")


class ColumnParallelLinear(_TPLinear):
    """Y = act(X W + b), W split by output columns over the TP group.

    Args:
        in_features, out_features: the dense layer's sizes; ``out_features`` must be a
            multiple of the TP size.
        comm: the TP group's ``tp.comm.Communicator``.
        bias: learn a bias (split with the columns).
        activation: None, ``"relu"`` (fused into the GEMM's epilogue) or ``"gelu"`` (GPT-2's
            tanh approximation, ``F.gelu(approximate="tanh")``, applied to the GEMM's output
            with the bias fused; its backward is autograd's).
        gather_output: all-gather Y to (..., out_features); otherwise each rank returns its
            (..., out_features / P) block.
        backend: ``backends.gemm`` backend of the local GEMMs.
        overlap: overlap the backward all-reduce of dX with the dW GEMM.
        sm_margin: SMs the backward dW GEMM leaves free for the all-reduce beside it (cuBLAS
            only; see ``reserve_sms``); applied with overlap on and off alike.
        master: the dense ``nn.Linear`` to cut from (default: a new one).
        device, dtype: of the shard.
        name: prefix of the layer's NVTX ranges (``<name> forward`` > ``compute Y``; ``<name>
            backward`` > ``compute dX``, the communicator's ``all_reduce``, ``compute dW``);
            default the class name.
        sequence_parallel: Megatron-LM's sequence parallelism (Korthikanti et al. 2022,
            arXiv:2205.05198, sec. 4.2.2): the input is this rank's block of the tokens,
            (T / P, in_features) after flattening, all-gathered into the GEMM (AG+GEMM,
            ``tp.overlap``); in backward the partial dX is reduce-scattered back to the
            rank's block (GEMM+RS) instead of all-reduced. With ``overlap`` each chunk's
            all-gather or reduce-scatter runs while the neighbouring chunk computes, and
            the last reduce-scatters while the dW GEMM does.
        chunks: with ``sequence_parallel``, the chunks each token block is cut into for
            AG+GEMM and GEMM+RS (the same with overlap on or off).

    Input (..., in_features), replicated on every TP rank; with ``sequence_parallel`` this
    rank's block of the tokens.

    Raises:
        ValueError: ``out_features`` not a multiple of the TP size; an unknown activation;
            ``overlap`` without asynchronous communication; a master of other sizes, or
            without a bias where ``bias``; a negative ``sm_margin``; ``chunks`` < 1;
            ``gather_output`` with ``sequence_parallel``; in forward, an input whose last
            dimension is not ``in_features`` (before any GEMM).
    """

    def __init__(self, in_features: int, out_features: int, comm, *, bias: bool = True,
                 activation: str | None = None, gather_output: bool = False,
                 backend: str = "cublas", overlap: bool = True, sm_margin: int = 0,
                 master: nn.Linear | None = None, device=None, dtype=None,
                 name: str | None = None, sequence_parallel: bool = False, chunks: int = 4):
        if activation not in (None, "relu", "gelu"):
            raise ValueError(f"activation must be None, 'relu' or 'gelu'; got {activation!r}")
        if gather_output and sequence_parallel:
            raise ValueError("gather_output and sequence_parallel exclude each other: the "
                             "output of a sequence-parallel column layer has every token")
        super().__init__(in_features, out_features, comm, "columns", bias, backend, overlap,
                         sm_margin, master, device, dtype, name, sequence_parallel, chunks)
        self.activation, self.gather_output = activation, gather_output
        # what the GEMM's epilogue applies: the backends fuse ReLU only
        self.epilogue = "relu" if activation == "relu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features / P) (or (..., out_features) with
        ``gather_output``); with ``sequence_parallel``, (T / P, in_features) -> (T,
        out_features / P) (the tokens flattened)."""
        self._check_input(x, self.in_features, "in_features")
        y = _ColumnParallel.apply(x.reshape(-1, self.in_features), self.weight, self.bias, self)
        if self.activation == "gelu":  # element-wise: on the shard, before any gather
            y = F.gelu(y, approximate="tanh")
        if self.sequence_parallel:
            return y
        y = y.view(*x.shape[:-1], y.shape[-1])
        return gather_from_tp(y, self.comm) if self.gather_output else y


class RowParallelLinear(_TPLinear):
    """Y = X W + b, W split by input rows over the TP group, partial products all-reduced.

    Args:
        in_features, out_features: the dense layer's sizes; ``in_features`` must be a
            multiple of the TP size.
        comm: the TP group's ``tp.comm.Communicator``.
        bias: learn a bias (replicated; added once, after the all-reduce).
        input_is_parallel: the input is already this rank's (..., in_features / P) block (as
            a column-parallel layer produces); otherwise the full input is sliced here.
        backend: ``backends.gemm`` backend of the local GEMMs.
        overlap: overlap each chunk's all-reduce with the next chunk's GEMM.
        chunks: row chunks of the forward GEMM (with ``sequence_parallel``, of each token
            block, in GEMM+RS forward and AG+GEMM backward); the same with overlap on or off.
        sm_margin: SMs the forward chunk GEMMs leave free for the all-reduces beside them
            (cuBLAS only; see ``reserve_sms``); applied with overlap on and off alike.
        master, device, dtype, name: as for ``ColumnParallelLinear`` (forward ranges:
            ``compute chunk i`` and the communicator's ``all_reduce`` per chunk).
        sequence_parallel: Megatron-LM's sequence parallelism (see ``ColumnParallelLinear``):
            the partial products are reduce-scattered over the tokens (each rank gets its
            (T / P, out_features) block, the bias added to it) instead of all-reduced, each
            chunk's while the next computes (GEMM+RS, ``tp.overlap``); in backward the
            gradient is all-gathered into the dX GEMM (AG+GEMM).

    Raises:
        ValueError: ``in_features`` not a multiple of the TP size; ``chunks`` < 1; ``overlap``
            without asynchronous communication; a master of other sizes, or without a bias
            where ``bias``; a negative ``sm_margin``; in forward, an input whose last
            dimension is not the rank's ``in_features / P`` (``input_is_parallel``) or
            ``in_features``, or with ``sequence_parallel`` tokens the TP size does not
            divide, before any GEMM or communication.
    """

    def __init__(self, in_features: int, out_features: int, comm, *, bias: bool = True,
                 input_is_parallel: bool = True, backend: str = "cublas", overlap: bool = True,
                 chunks: int = 4, sm_margin: int = 0, master: nn.Linear | None = None,
                 device=None, dtype=None, name: str | None = None,
                 sequence_parallel: bool = False):
        super().__init__(in_features, out_features, comm, "rows", bias, backend, overlap,
                         sm_margin, master, device, dtype, name, sequence_parallel, chunks)
        self.input_is_parallel = input_is_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features / P) (or (..., in_features) without ``input_is_parallel``) ->
        (..., out_features); with ``sequence_parallel``, -> (T / P, out_features), this rank's
        block of the T flattened tokens."""
        if self.input_is_parallel:
            self._check_input(x, self.weight.shape[0], "this rank's in_features / TP block")
        else:
            self._check_input(x, self.in_features, "in_features")
            x = scatter_to_tp(x, self.comm)
        y = _RowParallel.apply(x.reshape(-1, self.weight.shape[0]), self.weight, self)
        if not self.sequence_parallel:
            y = y.view(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        # the replicated bias meets only this rank's tokens: its gradient is summed over ranks
        return y if self.bias is None else y + replicated(self.bias, self.comm)


class _ColumnParallel(torch.autograd.Function):
    """f fused with the column GEMM: Y_r = epilogue(X W_r + b_r) (the layer's ``epilogue``,
    ReLU or none); dX all-reduced in backward (with sequence parallelism: X all-gathered
    forward, dX reduce-scattered backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        with annotate(f"{layer.name} forward"):
            if layer.sequence_parallel and layer.comm.size > 1:  # (T / P, in) -> (T, out / P)
                y, x = all_gather_gemm(x, weight, bias, layer.comm, activation=layer.epilogue,
                                       backend=layer.backend, chunks=layer.chunks,
                                       overlap=layer.overlap)
            else:
                with annotate("compute Y"):
                    y = gemm(x, weight, bias, activation=layer.epilogue,
                             backend=layer.backend)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, y if layer.epilogue == "relu" else None)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, y = ctx.saved_tensors
        layer = ctx.layer
        with annotate(f"{layer.name} backward"):
            if y is not None:  # through the fused ReLU: its output says where it passed
                grad_y = grad_y.masked_fill(y <= 0, 0)
            grad_y = grad_y.contiguous()
            work = None
            if layer.comm.size > 1 and layer.sequence_parallel:  # partial dX -> own tokens
                work = gemm_reduce_scatter(grad_y, weight.t(), layer.comm,
                                           backend=layer.backend, chunks=layer.chunks,
                                           overlap=layer.overlap)
            else:
                with annotate("compute dX"):
                    grad_x = gemm(grad_y, weight.t(), backend=layer.backend)
            if layer.comm.size > 1 and not layer.sequence_parallel:
                if layer.overlap:
                    work = _async_all_reduce(grad_x, layer.comm)
                else:
                    layer.comm.all_reduce(grad_x)
            with annotate("compute dW"), reserve_sms(layer.sm_margin, x.device):
                grad_w = gemm(x.t(), grad_y, backend=layer.backend)  # overlaps the collective
                grad_b = grad_y.sum(0) if ctx.has_bias else None
            if work is not None:
                grad_x = work.wait()
        return grad_x, grad_w, grad_b, None


class _RowParallel(torch.autograd.Function):
    """The row GEMM fused with g: Y = sum_r X_r W_r, chunk by chunk; identity backward (with
    sequence parallelism: reduce-scatter forward, all-gather backward)."""

    @staticmethod
    def forward(ctx, x, weight, layer):
        layer._check_tokens(x.shape[0], "the tokens")
        ctx.layer = layer
        ctx.save_for_backward(x, weight)
        if layer.sequence_parallel and layer.comm.size > 1:  # (T, in / P) -> own (T / P, out)
            with annotate(f"{layer.name} forward"), reserve_sms(layer.sm_margin, x.device):
                return gemm_reduce_scatter(x, weight, layer.comm, backend=layer.backend,
                                           chunks=layer.chunks, overlap=layer.overlap).wait()
        out = torch.empty(x.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
        bounds = chunk_bounds(x.shape[0], layer.chunks)
        reduce_chunks = layer.comm.size > 1
        pending = []
        with annotate(f"{layer.name} forward"):
            for i in range(layer.chunks):  # empty chunks too: as many collectives on every rank
                rows = slice(bounds[i], bounds[i + 1])
                with annotate("compute chunk", payload=i), reserve_sms(layer.sm_margin, x.device):
                    gemm(x[rows], weight, backend=layer.backend, out=out[rows])
                if not reduce_chunks:
                    continue
                if layer.overlap:  # runs while the next chunk's GEMM computes
                    pending.append(_async_all_reduce(out[rows], layer.comm))
                else:
                    layer.comm.all_reduce(out[rows])
            for work in pending:
                work.wait()
        return out

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        layer = ctx.layer
        with annotate(f"{layer.name} backward"):
            grad_y = grad_y.contiguous()
            if layer.sequence_parallel and layer.comm.size > 1:  # own tokens -> all of them
                grad_x, grad_y = all_gather_gemm(grad_y, weight.t(), None, layer.comm,
                                                 backend=layer.backend, chunks=layer.chunks,
                                                 overlap=layer.overlap)
            else:
                with annotate("compute dX"):
                    grad_x = gemm(grad_y, weight.t(), backend=layer.backend)
            with annotate("compute dW"):
                grad_w = gemm(x.t(), grad_y, backend=ctx.layer.backend)
        return grad_x, grad_w, None
