"""Where the ladder's ``.cu`` sources are and how every launcher compiles them (a leaf of
``backends.cuda``: the CuPy path in ``__init__`` and the PyCUDA path both import it)."""

from __future__ import annotations

from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent


def compile_options(arch: str, defines: tuple[str, ...]) -> tuple[str, ...]:
    """NVRTC/nvcc options for ``arch`` (e.g. ``"sm_90"``) and a kernel's ``-D`` defines."""
    return (f"-arch={arch}", "-std=c++17", f"-I{SOURCE_DIR}", *defines)
