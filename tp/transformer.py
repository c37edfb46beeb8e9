"""A GPT-style decoder built from the tensor-parallel layers (Megatron-LM's partitioning,
Shoeybi et al. 2019, arXiv:1909.08053, fig. 3).

Per layer, pre-LayerNorm: x + attention(LN(x)), then x + MLP(LN(x)).

- attention: ``fc_q``, ``fc_k``, ``fc_v`` column-parallel, so each TP rank owns heads / P whole
  heads and runs causal scaled-dot-product attention on them alone; ``fc_o`` row-parallel
  (``input_is_parallel``), whose all-reduce brings the heads back together.
- MLP: ``fc1`` column-parallel with the fused bias + ReLU epilogue (or, with
  ``activation="gelu"``, GPT-2's tanh-approximated GELU after the bias-fused GEMM),
  ``fc2`` row-parallel.
- LayerNorms, embeddings and the LM head are replicated on every TP rank.
- With ``sequence_parallel`` (Korthikanti et al. 2022, arXiv:2205.05198, sec. 4.2.2) the
  tokens between the TP regions are split over the TP ranks: each holds a block of the
  flattened (B * T) tokens, runs the LayerNorms and residual adds on it alone, and the
  column layers all-gather it while the row layers reduce-scatter back to it (in place of
  the all-reduce). The LayerNorms' gradients are summed over the ranks (``replicated``).
  ``GPT`` runs its final LayerNorm, LM head and loss on the block as well.

Every weight is cut from one dense master built from ``seed`` in the same order on every
rank, so models with any TP degree start from the same function and, trained on the same
data, follow the same loss curve up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from profiling.nvtx import annotate

from .functional import replicated
from .layers import ColumnParallelLinear, RowParallelLinear

ACTIVATIONS = ("relu", "gelu")
"""The MLP's activations: ReLU (fused into ``fc1``'s GEMM) or GELU, tanh approximation (GPT-2)."""


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the model and its MLP's activation (one of ``ACTIVATIONS``). ``vocab`` 256:
    byte-level tokens.

    Raises:
        ValueError: an activation not in ``ACTIVATIONS``.
    """

    vocab: int = 256
    seq_len: int = 64
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    activation: str = "relu"

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}; got {self.activation!r}")


class TransformerLayer(nn.Module):
    """One pre-LN decoder layer, tensor-parallel over ``comm``; input and output (B, T, hidden),
    or with ``sequence_parallel`` this rank's block of the B * T flattened tokens, (B * T / P,
    hidden) (``forward(x, seq_len=T)``).

    Attention has ``heads`` heads of ``head_dim`` (default hidden / heads), so its width
    heads * head_dim may differ from ``hidden`` (weak scaling widens it). ``activation``: the
    MLP's, ``"relu"`` or ``"gelu"`` (``ColumnParallelLinear``'s ``fc1``). ``chunks`` and
    ``sm_margin`` go to every TP layer (see ``tp.layers``: the row-parallel GEMMs' chunks,
    and with ``sequence_parallel`` the column-parallel ones' all-gather + GEMM). ``name``
    prefixes its NVTX ranges (``<name> forward``, ``<name>.attention``) and its TP layers'
    (``<name>.fc_q`` ... ``<name>.fc2``).

    Raises:
        ValueError: ``heads`` not a multiple of the TP size, or, without ``head_dim``,
            ``hidden`` not a multiple of ``heads``; an activation ``ColumnParallelLinear``
            does not have.
    """

    def __init__(self, hidden: int, heads: int, comm, *, mlp_ratio: int = 4,
                 activation: str = "relu",
                 head_dim: int | None = None, chunks: int = 4, sm_margin: int = 0,
                 backend: str = "cublas", overlap: bool = True, device=None, dtype=None,
                 name: str = "layer", sequence_parallel: bool = False):
        super().__init__()
        if heads % comm.size or (head_dim is None and hidden % heads):
            raise ValueError(f"heads={heads} must be a multiple of the TP size {comm.size} and "
                             f"divide hidden={hidden}")
        common = {"backend": backend, "overlap": overlap, "chunks": chunks,
                  "sm_margin": sm_margin, "device": device, "dtype": dtype,
                  "sequence_parallel": sequence_parallel}
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.local_heads, self.head_dim = heads // comm.size, head_dim or hidden // heads
        width = heads * self.head_dim
        self.ln1 = nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.fc_q, self.fc_k, self.fc_v = (
            ColumnParallelLinear(hidden, width, comm, master=nn.Linear(hidden, width),
                                 name=f"{name}.{fc}", **common)
            for fc in ("fc_q", "fc_k", "fc_v"))
        self.fc_o = RowParallelLinear(width, hidden, comm, master=nn.Linear(width, hidden),
                                      name=f"{name}.fc_o", **common)
        self.ln2 = nn.LayerNorm(hidden, device=device, dtype=dtype)
        inner = mlp_ratio * hidden
        self.fc1 = ColumnParallelLinear(hidden, inner, comm, activation=activation,
                                        master=nn.Linear(hidden, inner), name=f"{name}.fc1",
                                        **common)
        self.fc2 = RowParallelLinear(inner, hidden, comm, master=nn.Linear(inner, hidden),
                                     name=f"{name}.fc2", **common)
        self.name = name

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        """(B, T, hidden) -> (B, T, hidden); with ``sequence_parallel``, this rank's (B * T /
        P, hidden) token block -> the same block of the output, ``seq_len`` = T.

        Raises:
            ValueError: with ``sequence_parallel``, no ``seq_len`` or one that does not
                divide the B * T tokens of the P blocks.
        """
        if self.sequence_parallel:
            tokens = x.shape[0] * self.comm.size
            if seq_len is None or tokens % seq_len:
                raise ValueError(f"{self.name}: sequence parallelism needs seq_len dividing "
                                 f"the {tokens} tokens; got {seq_len}")
            b, t = tokens // seq_len, seq_len
        else:
            b, t, _ = x.shape
        with annotate(f"{self.name} forward"):
            h = self._norm(self.ln1, x)
            q, k, v = (fc(h).view(b, t, self.local_heads, self.head_dim).transpose(1, 2)
                       for fc in (self.fc_q, self.fc_k, self.fc_v))
            with annotate(f"{self.name}.attention"):
                attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            attn = attn.transpose(1, 2).reshape(b, t, self.local_heads * self.head_dim)
            if self.sequence_parallel:
                attn = attn.reshape(b * t, -1)
            x = x + self.fc_o(attn)
            return x + self.fc2(self.fc1(self._norm(self.ln2, x)))

    def _norm(self, ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        """``ln(x)``; on a token block (sequence parallelism) with its gradients summed over
        the TP group."""
        return block_layer_norm(ln, x, self.comm) if self.sequence_parallel else ln(x)


def block_layer_norm(ln: nn.LayerNorm, x: torch.Tensor, comm) -> torch.Tensor:
    """``ln(x)`` on this TP rank's block of the tokens (sequence parallelism), (tokens / P,
    hidden) -> the same shape: each rank's weight and bias gradients cover its tokens only,
    so they are summed over the TP group (``replicated``; Korthikanti et al. 2022,
    arXiv:2205.05198, sec. 4.2.2)."""
    return F.layer_norm(x, ln.normalized_shape, replicated(ln.weight, comm),
                        replicated(ln.bias, comm), ln.eps)


class GPT(nn.Module):
    """Byte-level GPT: embeddings, ``layers`` tensor-parallel layers, LayerNorm, LM head.

    ``forward(idx)`` maps token ids (B, T), int64, T <= ``config.seq_len``, to logits (B, T,
    vocab); ``loss(idx, targets)`` is the mean cross-entropy over the B * T tokens, a float32
    scalar. Built from ``seed`` on the CPU RNG (the global RNG is left as it was), then moved
    to ``device`` and ``dtype``.

    With ``sequence_parallel`` (Megatron-LM's sequence parallelism, Korthikanti et al. 2022,
    arXiv:2205.05198, sec. 4.2.2) every TP rank computes the embeddings of all B * T tokens
    and keeps its block of the flattened tokens, rows r * B * T / P .. (r + 1) * B * T / P
    for TP rank r of P (Megatron-LM scatters the embeddings' output the same way); the
    layers (``TransformerLayer(sequence_parallel=True)``), the final LayerNorm and the LM
    head run on that block alone. The embeddings', final LayerNorm's and head's weights are
    whole on every rank but meet only its tokens, so their gradients are summed over the TP
    group (``replicated``). ``forward`` then returns the block's logits, (B * T / P, vocab),
    and ``loss`` this rank's part of the mean: the sum of the block's cross-entropies divided
    by all B * T tokens. The parts sum over the TP group to the mean loss, and the backward
    of each rank's part gives every rank the gradients of the mean.
    """

    def __init__(self, config: GPTConfig, comm, *, seed: int = 0, backend: str = "cublas",
                 overlap: bool = True, device=None, dtype=None, sequence_parallel: bool = False):
        super().__init__()
        self.config, self.comm, self.sequence_parallel = config, comm, sequence_parallel
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok = nn.Embedding(config.vocab, config.hidden)
            self.pos = nn.Embedding(config.seq_len, config.hidden)
            self.layers = nn.ModuleList(
                TransformerLayer(config.hidden, config.heads, comm, mlp_ratio=config.mlp_ratio,
                                 activation=config.activation, backend=backend,
                                 overlap=overlap, device=device, dtype=dtype, name=f"layer{i}",
                                 sequence_parallel=sequence_parallel)
                for i in range(config.layers))
            self.ln_f = nn.LayerNorm(config.hidden)
            self.head = nn.Linear(config.hidden, config.vocab)
        self.to(device=device, dtype=dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T), int64 -> logits (B, T, vocab); with ``sequence_parallel``, this
        rank's block of the flattened tokens' logits, (B * T / P, vocab).

        Raises:
            ValueError: with ``sequence_parallel``, B * T not a multiple of the TP size.
        """
        b, t = idx.shape
        positions = torch.arange(t, device=idx.device)
        if not self.sequence_parallel:
            x = self.tok(idx) + self.pos(positions)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln_f(x))
        rows = self._block(b * t)
        x = (F.embedding(idx, replicated(self.tok.weight, self.comm))
             + F.embedding(positions, replicated(self.pos.weight, self.comm)))
        x = x.reshape(b * t, -1)[rows]
        for layer in self.layers:
            x = layer(x, seq_len=t)
        x = block_layer_norm(self.ln_f, x, self.comm)
        return F.linear(x, replicated(self.head.weight, self.comm),
                        replicated(self.head.bias, self.comm))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``idx``'s next-token predictions against ``targets`` (B, T),
        int64: the mean over the B * T tokens, a float32 scalar; with ``sequence_parallel``,
        this rank's part of it (the class doc: the parts sum over the TP group to the mean).

        Raises:
            ValueError: as ``forward``.
        """
        logits = self(idx)
        if not self.sequence_parallel:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   targets.reshape(-1))
        mine = targets.reshape(-1)[self._block(targets.numel())]
        return F.cross_entropy(logits.float(), mine, reduction="sum") / targets.numel()

    def _block(self, tokens: int) -> slice:
        """This TP rank's rows of the ``tokens`` flattened tokens (sequence parallelism).

        Raises:
            ValueError: ``tokens`` not a multiple of the TP size.
        """
        p = self.comm.size
        if tokens % p:
            raise ValueError(f"sequence parallelism needs the B * T = {tokens} tokens to be a "
                             f"multiple of the TP size {p}")
        n = tokens // p
        return slice(self.comm.rank * n, (self.comm.rank + 1) * n)
