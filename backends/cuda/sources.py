"""Where the ladder's ``.cu`` sources are and how every launcher compiles them (a leaf of
``backends.cuda``: the CuPy path in ``__init__`` and the PyCUDA path both import it)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent


def compile_options(arch: str, defines: tuple[str, ...]) -> tuple[str, ...]:
    """NVRTC/nvcc options for ``arch`` (e.g. ``"sm_90"``) and a kernel's ``-D`` defines."""
    return (f"-arch={arch}", "-std=c++17", f"-I{SOURCE_DIR}", *defines)


@functools.cache
def declares_dynamic_smem(source: str) -> bool:
    """Whether ``source`` (a file in ``SOURCE_DIR``), or a file of ``SOURCE_DIR`` it includes,
    declares ``gemm_dynamic_smem``, the dynamic shared memory the launchers must request
    (``11_wgmma_cluster.cu`` is ``10_wgmma_persistent.cu`` included with other macros)."""
    code = (SOURCE_DIR / source).read_text()
    return "gemm_dynamic_smem" in code or any(
        declares_dynamic_smem(name) for name in re.findall(r'#include "([^"]+)"', code))
