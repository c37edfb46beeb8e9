"""What a backend binds a launch to: a ``gemm()`` call's signature without its data."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

# A backend's launch for one Problem: (a, b, c, out) -> D, with ``out`` None (the launch
# allocates D) or the tensor D is written into. Called with checked tensors only.
Launch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
                  torch.Tensor]


@dataclass(frozen=True)
class Problem:
    """D = act(A @ B + C) for one shape, dtype, device and epilogue.

    Attributes:
        m, n, k: D is M x N, the inner dimension is K (all >= 1).
        dtype: the operands' dtype (A, B, C and D share it).
        device: the operands' device.
        c: None (no C), ``"full"`` (an (M, N) C) or ``"bias"`` (a length-N C added to every
            row).
        relu: ReLU after the add.
        allow_tf32: fp32 operands on the TF32 tensor cores.
    """

    m: int
    n: int
    k: int
    dtype: torch.dtype
    device: torch.device
    c: str | None
    relu: bool
    allow_tf32: bool

    @classmethod
    def of(cls, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, relu: bool,
           allow_tf32: bool = False) -> Problem:
        """The Problem of checked operands A (M, K), B (K, N) and C (None, (M, N) or (N,))."""
        kind = None if c is None else ("bias" if c.dim() == 1 else "full")
        return cls(a.shape[0], b.shape[1], a.shape[1], a.dtype, a.device, kind, relu,
                   allow_tf32)

    @functools.cached_property
    def d_template(self) -> torch.Tensor:
        """One element of D's dtype and device seen as (M, N): ``torch.empty_like`` of it is
        a new uninitialised contiguous D for a kernel to write into."""
        # empty_like of a view that overlaps itself allocates a contiguous tensor
        # (torch.preserve_format's rule) and skips torch.empty's keyword parsing, a third of
        # an allocation's host time.
        return torch.empty(1, dtype=self.dtype, device=self.device).expand(self.m, self.n)
