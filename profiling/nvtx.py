"""NVTX ranges in gemmlab's one domain, and names for CUDA streams.

Every measured call runs inside a push/pop range in the domain ``gemmlab`` (``push``/``pop``,
or ``with annotate(name)``) named after what it is, so a profiler can select exactly it:

- a backend call: the backend's name (``cuda_regblock``);
- a collective: ``<communicator> <operation>`` (``nccl all_reduce``, ``ring/mpi all_gather``);
- a TP phase: ``<layer> forward|backward`` around ``compute ...`` and ``comm ...`` ranges
  (``fc1 backward`` > ``compute dX``, ``comm all_reduce dX``, ``compute dW``);
- a training step: ``train step`` with the step number as payload.

    ncu --nvtx --nvtx-include "gemmlab@cuda_regblock/" ...
    nsys stats -r nvtx_sum,nvtx_gpu_proj_sum report.nsys-rep

(the trailing slash selects push/pop ranges). Without a profiler attached a range is a call
into NVTX's no-op stubs: ``profiling.overhead`` measures what it costs; ``gemm()``, the
hottest path, skips it then (``NO_PROFILER``).

``name_stream`` labels a CUDA stream in Nsight Systems' timeline (``nvtxNameCudaStreamA``).
NVTX 3 is header-only and the ``nvtx`` package does not wrap that call, so a five-line C shim
is compiled against the CUDA toolkit's ``nvtx3`` headers once per machine; without a compiler
or the headers, streams keep their numbers and ``stream_naming_unavailable_reason`` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import nvtx

from .cuda_toolkit import toolkit_include_dirs

DOMAIN = "gemmlab"
_SHIM = """#include <nvtx3/nvToolsExtCudaRt.h>
void gemmlab_name_stream(void* stream, const char* name) {
    nvtxNameCudaStreamA((cudaStream_t)stream, name);
}
"""


# The nvtx package's handle of the domain: a no-op stand-in when no profiler is attached.
# Tests and the overhead probe replace it to record or silence every range.
domain = nvtx.get_domain(DOMAIN)
# That stand-in when no profiler was attached at start-up (NVTX injects a tool only then),
# else None: a hot path may skip its range while ``domain is NO_PROFILER`` (``gemm()`` does).
NO_PROFILER = None if isinstance(domain, nvtx.Domain) else domain


@functools.lru_cache(maxsize=4096)
def _attributes(handle, name: str, payload: int | None):
    return handle.get_event_attributes(message=name, payload=payload)


def push(name: str, payload: int | None = None) -> None:
    """Open range ``name`` in domain ``gemmlab`` (with an integer ``payload`` shown beside
    it, e.g. a step number); ``pop`` closes it. The event attributes of a name are built
    once, so a push costs a cache look-up and NVTX's call (``gemm()``'s hot path)."""
    domain.push_range(_attributes(domain, name, payload))


def pop() -> None:
    """Close the innermost range ``push`` opened."""
    domain.pop_range()


class annotate:
    """``with annotate(name, payload=None):`` a ``push`` on entry and a ``pop`` on exit."""

    __slots__ = ("name", "payload")

    def __init__(self, name: str, payload: int | None = None):
        self.name, self.payload = name, payload

    def __enter__(self):
        push(self.name, self.payload)
        return self

    def __exit__(self, *exc) -> None:
        pop()


@functools.cache
def _shim() -> tuple[ctypes.CDLL | None, str | None]:
    """The compiled stream-naming shim, or None and why not."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    headers = [d for d in toolkit_include_dirs() if (d / "nvtx3" / "nvToolsExtCudaRt.h").is_file()]
    if compiler is None or not headers:
        return None, ("no C compiler on PATH" if compiler is None
                      else "no CUDA toolkit with nvtx3/nvToolsExtCudaRt.h found")
    key = hashlib.sha256((_SHIM + str(headers[0])).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gemmlab"
    library = cache / f"nvtx_name_stream_{key}.so"
    if not library.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "shim.c"
            source.write_text(_SHIM)
            built = Path(tmp) / library.name
            result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", f"-I{headers[0]}",
                                     str(source), "-o", str(built), "-ldl"],
                                    capture_output=True, text=True, timeout=120)
            if result.returncode != 0:
                return None, f"compiling the NVTX stream-naming shim failed: {result.stderr}"
            os.replace(built, library)  # atomic: concurrent ranks never load a partial file
    lib = ctypes.CDLL(str(library))
    lib.gemmlab_name_stream.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gemmlab_name_stream.restype = None
    return lib, None


def stream_naming_unavailable_reason() -> str | None:
    """Why ``name_stream`` cannot label streams here, or None when it can."""
    return _shim()[1]


def name_stream(stream, name: str) -> bool:
    """Label CUDA ``stream`` (a ``torch.cuda.Stream`` or a raw ``cudaStream_t`` as int) as
    ``name`` in Nsight Systems. Returns False, changing nothing, where naming is unavailable."""
    lib, _ = _shim()
    if lib is None:
        return False
    handle = getattr(stream, "cuda_stream", stream)
    lib.gemmlab_name_stream(ctypes.c_void_p(handle), name.encode())
    return True
