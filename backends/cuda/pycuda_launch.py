"""The ladder's ``.cu`` sources launched through PyCUDA instead of CuPy.

Same sources, same ``-D`` tile sizes, same launch geometry and arguments as the CuPy path
(``CudaKernel.__call__``); only the compiler (nvcc through ``pycuda.compiler.SourceModule``
instead of NVRTC) and the launch call differ, so the two can be compared result for result
and time for time. PyCUDA works in the device's primary context, the one PyTorch and CuPy
use, so the three share memory pointers.

PyCUDA launches on its own ``Stream`` objects and cannot wrap another library's stream, so
this launcher runs only on the default stream (torch's current stream unless a side stream is
selected); anything else is an error rather than a silent reordering.
"""

from __future__ import annotations

import functools
import struct

import numpy as np
import torch

from .sources import SOURCE_DIR, compile_options, declares_dynamic_smem
from .tma import MAP_BYTES


@functools.cache
def _context(device: int):
    """The primary context of ``device``, retained once (PyCUDA's handle on it)."""
    import pycuda.driver as drv

    drv.init()
    return drv.Device(device).retain_primary_context()


@functools.cache
def _compiled(source: str, name: str, defines: tuple[str, ...], device: int, arch_suffix: str):
    """(function, dynamic shared memory bytes), compiled by nvcc for ``device``'s arch (with
    ``arch_suffix``, e.g. ``"a"`` for sm_90a)."""
    import pycuda.driver as drv
    from pycuda.compiler import SourceModule

    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}{arch_suffix}"
    options = [o for o in compile_options(arch, defines) if not o.startswith("-arch=")]
    code = (SOURCE_DIR / source).read_text()
    # no_extern_c: the sources declare their kernels extern "C" themselves.
    module = SourceModule(code, options=options, arch=arch, no_extern_c=True)
    function = module.get_function(name)
    smem = 0
    if declares_dynamic_smem(source):
        pointer, _ = module.get_global("gemm_dynamic_smem")
        value = np.zeros(1, np.int32)
        drv.memcpy_dtoh(value, pointer)
        smem = int(value[0])
        function.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    return function, smem


def launch(kernel, dtype: torch.dtype, device: int, grid: tuple[int, int], args: tuple,
           blobs: bytes = b"") -> None:
    """Launch ``kernel`` (a ``backends.cuda.CudaKernel``) for ``dtype`` operands on
    ``device`` with the launcher-neutral ``args`` (four pointers, M, N, K, ldc, relu, and the
    tensor-map buffer of a ``tma`` kernel) and ``blobs``, the by-value tensor maps of an
    ``epilogue_maps`` kernel (``KernelArgs.set_blobs``'s bytes), on the default stream.

    Raises:
        RuntimeError: torch's current stream is not the default stream.
    """
    if torch.cuda.current_stream(device).cuda_stream != 0:
        raise RuntimeError("the PyCUDA launcher runs on the default stream only; torch's "
                           "current stream is a side stream")
    context = _context(device)
    context.push()
    try:
        function, smem = _compiled(kernel.source, kernel.name, kernel.defines(dtype), device,
                                   kernel.arch_suffix)
        a, b, c, d, m, n, k, ldc, relu, *extra = args  # extra: the tensor-map buffer
        values = [np.uintp(a), np.uintp(b), np.uintp(c), np.uintp(d), np.int32(m),
                  np.int32(n), np.int32(k), np.int64(ldc), np.int32(relu),
                  *map(np.uintp, extra)]
        function(*values, *_blob_arguments(values, blobs), block=(*kernel.threads, 1),
                 grid=grid, shared=smem)
    finally:
        context.pop()


def _blob_arguments(values: list, blobs: bytes) -> list:
    """``blobs`` as PyCUDA arguments placed where the kernel expects them: PyCUDA packs its
    parameter buffer with native alignment, which a byte string (``np.void``) does not have,
    so the 64-byte alignment of a by-value ``CUtensorMap`` is padding written out here."""
    if not blobs:
        return []
    offset = struct.calcsize("".join(v.dtype.char for v in values))
    padding = -offset % 64
    out = [np.void(bytes(padding))] if padding else []
    return out + [np.void(blobs[i:i + MAP_BYTES]) for i in range(0, len(blobs), MAP_BYTES)]
