"""The GEMM kernel ladder behind one interface: ``gemm(a, b, c, activation=..., backend=...)``.

D = act(A @ B + C) with A (M, K), B (K, N), C (M, N) or a length-N bias, on torch tensors.
Backends, in registry order: the baselines ``cublas``, ``cublaslt``, ``torch_compile``,
``torch_unfused``; the raw CUDA C ladder ``cuda_naive`` ... ``cuda_wgmma``; ``triton_fused``
(``BACKENDS`` lists them all).
``available()`` says which run on this machine and why the others don't;
``reference()`` is the float64 result every backend is checked against.
"""

from .api import Availability, BackendUnavailableError, available, gemm, get_backend
from .reference import TOLERANCES, reference, relative_error
from .registry import BACKENDS, LADDER, Backend

__all__ = [
    "BACKENDS", "LADDER", "TOLERANCES", "Availability", "Backend", "BackendUnavailableError",
    "available", "gemm", "get_backend", "reference", "relative_error",
]
