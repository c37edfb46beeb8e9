"""Raw CUDA C kernels of the ladder, compiled at run time by NVRTC through CuPy.

Each ``NN_name.cu`` file beside this module holds one kernel of the ladder with a header
comment saying what technique it adds. Tile sizes are compile-time macros (``BLOCK_M``,
``BLOCK_N``, ``BLOCK_K``, ``TM``, ``TN``) whose defaults in the file are the ones the
registry uses, so ``nvcc -arch=sm_90 -cubin NN_name.cu`` builds the same kernel.

Every kernel has the signature::

    (const float* A, const float* B, const float* C, float* D,
     int M, int N, int K, long long ldc, int relu)

with row-major contiguous A (M, K), B (K, N) and D (M, N); C is NULL, a full (M, N) matrix
(``ldc = N``) or a length-N bias (``ldc = 0``). A thread block of
``(BLOCK_N // TN, BLOCK_M // TM)`` threads computes a ``BLOCK_M x BLOCK_N`` tile of D, on a
grid of ``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))`` blocks.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).resolve().parent
_MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, which runs over the tiles along M


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """Why the CuPy-launched CUDA kernels cannot run here, or None when they can (asked once
    per process: gemm() checks it on every call)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import cupy  # noqa: F401  (the import is the check)
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); install gemmlab[cuda12] or gemmlab[cuda13]"
    return None


@dataclass(frozen=True)
class CudaKernel:
    """One ``.cu`` file of the ladder and the compile-time tile sizes it is built with.

    Args:
        source: file name in ``backends/cuda/``, e.g. ``"03_regblock.cu"``.
        name: the ``extern "C"`` kernel in it.
        params: macros passed as ``-DNAME=value``; must hold ``BLOCK_M`` and ``BLOCK_N``,
            may hold ``TM`` and ``TN`` (rows and columns of D per thread, default 1).
    """

    source: str
    name: str
    params: dict[str, int] = field(default_factory=dict)

    @property
    def threads(self) -> tuple[int, int]:
        """Thread block shape (x along N, y along M)."""
        p = self.params
        return p["BLOCK_N"] // p.get("TN", 1), p["BLOCK_M"] // p.get("TM", 1)

    def grid(self, m: int, n: int) -> tuple[int, int]:
        """Grid shape for an M x N output: one block per BLOCK_M x BLOCK_N tile."""
        p = self.params
        return -(-n // p["BLOCK_N"]), -(-m // p["BLOCK_M"])

    def defines(self) -> tuple[str, ...]:
        """The ``-D`` compiler options that fix the tile sizes."""
        return tuple(f"-D{k}={v}" for k, v in sorted(self.params.items()))

    def __call__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
                 relu: bool, out: torch.Tensor) -> torch.Tensor:
        """Launch D = act(A @ B + C) into ``out`` on torch's current stream.

        ``a`` (M, K), ``b`` (K, N) and ``out`` (M, N) are contiguous float32 CUDA tensors on one
        device, ``c`` is None, contiguous (M, N) or (N,); ``gemm()`` has checked all of that.
        Pointers are passed as integers: no copy, CuPy never owns the memory.

        Raises:
            ValueError: M needs more than 65535 thread blocks along gridDim.y.
        """
        import cupy

        m, k = a.shape
        n = b.shape[1]
        grid = self.grid(m, n)
        if grid[1] > _MAX_GRID_Y:
            raise ValueError(f"{self.name}: M={m} needs {grid[1]} blocks along gridDim.y "
                             f"(limit {_MAX_GRID_Y}) at BLOCK_M={self.params['BLOCK_M']}")
        device = a.device.index if a.device.index is not None else torch.cuda.current_device()
        kernel = _compiled(self.source, self.name, self.defines(), device)
        ldc = 0 if c is None or c.dim() == 1 else n
        args = (a.data_ptr(), b.data_ptr(), 0 if c is None else c.data_ptr(), out.data_ptr(),
                cupy.int32(m), cupy.int32(n), cupy.int32(k), cupy.int64(ldc), cupy.int32(relu))
        stream = _stream(torch.cuda.current_stream(device).cuda_stream, device)
        with cupy.cuda.Device(device), stream:
            kernel(grid, self.threads, args)
        return out


def compile_options(arch: str, defines: tuple[str, ...]) -> tuple[str, ...]:
    """NVRTC/nvcc options for ``arch`` (e.g. ``"sm_90"``) and a kernel's ``-D`` defines."""
    return (f"-arch={arch}", "-std=c++17", f"-I{SOURCE_DIR}", *defines)


@functools.cache
def _compiled(source: str, name: str, defines: tuple[str, ...], device: int):
    """Compile once per (source, tile sizes, device) for the device's own architecture
    (sm_90 on H200). CuPy also caches the binary on disk, so a second process skips NVRTC.
    """
    import cupy

    major, minor = torch.cuda.get_device_capability(device)
    with cupy.cuda.Device(device):
        module = cupy.RawModule(code=(SOURCE_DIR / source).read_text(),
                                options=compile_options(f"sm_{major}{minor}", defines))
        return module.get_function(name)


@functools.cache
def _stream(ptr: int, device: int):
    """CuPy's view of a torch stream, so CuPy launches stay in torch's stream order."""
    import cupy

    # CuPy 14 deprecates ExternalStream for Stream.from_external; CuPy 13 (the cuda12
    # extra) has only ExternalStream, which both accept.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(ptr, device)
