"""Where the CUDA toolkit's headers are: a leaf module (standard library only), so the NVTX
layer and the CUDA C backends can both use it without importing each other."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def toolkit_include_dirs() -> tuple[Path, ...]:
    """Include directories of the CUDA toolkits on this machine, most specific first:
    ``$CUDA_HOME``, ``$CUDA_PATH``, the toolkit of the ``nvcc`` on PATH, ``/usr/local/cuda``
    (those that exist and hold ``cuda_runtime_api.h``, without repeats)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if (nvcc := shutil.which("nvcc")) is not None:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    dirs = [Path(root) / "include" for root in roots if root]
    return tuple(dict.fromkeys(d for d in dirs if (d / "cuda_runtime_api.h").is_file()))
