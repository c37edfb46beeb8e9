"""The GEMM kernel ladder behind one interface: ``gemm(a, b, c, activation=..., backend=...)``.

D = act(A @ B + C) with A (M, K), B (K, N), C (M, N) or a length-N bias, on torch tensors.
``BACKENDS`` holds every backend by name and ``LADDER`` in registry order, the baselines first
(``gemmlab info`` prints them);
``available()`` says which run on this machine and why the others don't;
``reference()`` is the float64 result every backend is checked against, within
``TOLERANCES`` (``backends.dtypes``, the dtype vocabulary of every command).

Importing the package (or ``backends.dtypes``) loads no backend: ``gemm``, ``BACKENDS`` and
the rest of the API load the registry, and with it the Triton kernel, when first used, so a
command can still choose the Triton interpreter (``TRITON_INTERPRET``) after importing it.
"""

import importlib

from .dtypes import TOLERANCES
from .reference import reference, relative_error

# Names of the API loaded on first use: name -> the submodule that defines it.
_LAZY = {"Availability": "api", "BackendUnavailableError": "api", "available": "api",
         "gemm": "api", "get_backend": "api", "BACKENDS": "registry", "LADDER": "registry",
         "Backend": "registry"}

__all__ = [
    "BACKENDS", "LADDER", "TOLERANCES", "Availability", "Backend", "BackendUnavailableError",
    "available", "gemm", "get_backend", "reference", "relative_error",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:  # a submodule that an eager import used to load as a side effect (backends.tuning)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
