"""The float64 reference every backend is checked against (tolerances: ``backends.dtypes``)."""

from __future__ import annotations

import torch


def reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None,
              activation: str | None = None) -> torch.Tensor:
    """act(A @ B + C) in float64 on the inputs' device, from the inputs as given.

    Args:
        a: (M, K), b: (K, N); c: None, (M, N) or a length-N bias; any floating dtype.
        activation: None or ``"relu"``.

    Returns:
        float64 tensor (M, N).
    """
    d = a.double() @ b.double()
    if c is not None:
        d = d + c.double()
    return torch.relu(d) if activation == "relu" else d


def relative_error(d: torch.Tensor, ref: torch.Tensor) -> float:
    """||D - ref||_F / ||ref||_F, computed in float64; inf when D holds a NaN or an inf.

    When ref is all zeros the absolute error ||D||_F is returned instead.
    """
    d = d.double()
    if not torch.isfinite(d).all():
        return float("inf")
    err = torch.linalg.norm(d - ref).item()
    norm = torch.linalg.norm(ref).item()
    return err / norm if norm > 0 else err
