"""The ladder's ``.cu`` sources launched through PyCUDA instead of CuPy.

Same sources, same ``-D`` tile sizes, same launch geometry and arguments as the CuPy path
(the launch ``CudaKernel.bind`` returns); only the compiler (nvcc through
``pycuda.compiler.SourceModule`` instead of NVRTC) and the launch call differ, so the two can
be compared result for result and time for time. PyCUDA works in the device's primary
context, the one PyTorch and CuPy use, so the three share memory pointers.

PyCUDA launches on its own ``Stream`` objects and cannot wrap another library's stream, so
this launcher runs only on the default stream (torch's current stream unless a side stream is
selected); anything else is an error rather than a silent reordering.

PyCUDA hands the driver one parameter buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``), which must
hold each parameter at the offset the compiler gave it. Those offsets are not the C struct
rule: ptxas aligns a by-value parameter's address in the constant bank, not in the buffer,
so the 64-byte aligned tensor maps of steps 10 and 11 sit at 0x70 and 0xF0 on sm_90, not at
0x80 and 0x100 (PyCUDA's own packing put them there, and the driver refused the launch as
"too many resources requested"). The buffer is therefore laid out here from the driver's
answer, ``cuFuncGetParamInfo`` (CUDA 12.4+, through cuda-bindings), asked of the CuPy build
of the same kernel (PyCUDA does not expose its function handle; one ptxas ABI places both).
"""

from __future__ import annotations

import functools

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
    ``device`` with the launcher-neutral ``args`` (four pointers, M, N, K, ldc, relu, then
    the tensor-map buffer of a ``tma`` kernel, and the stream-K workspace's address and
    launch token of a persistent one) and ``blobs``, the by-value tensor maps of an
    ``epilogue_maps`` kernel (``KernelArgs.set_blobs``'s bytes), on the default stream.

    Raises:
        RuntimeError: torch's current stream is not the default stream; the driver's
            parameter layout does not match ``args`` and ``blobs``.
    """
    if torch.cuda.current_stream(device).cuda_stream != 0:
        raise RuntimeError("the PyCUDA launcher runs on the default stream only; torch's "
                           "current stream is a side stream")
    layout = parameter_layout(kernel, dtype, device)
    values = (*args, *(blobs[i:i + MAP_BYTES] for i in range(0, len(blobs), MAP_BYTES)))
    buffer = parameter_buffer(values, layout)
    context = _context(device)
    context.push()
    try:
        function, smem = _compiled(kernel.source, kernel.name, kernel.defines(dtype), device,
                                   kernel.arch_suffix)
        function(np.void(buffer), block=(*kernel.threads, 1), grid=grid, shared=smem)
    finally:
        context.pop()


def parameter_layout(kernel, dtype: torch.dtype, device: int) -> tuple[tuple[int, int], ...]:
    """(offset, size) in bytes of each parameter of ``kernel``'s build for ``dtype`` on
    ``device``, as the driver reads a parameter buffer (``cuFuncGetParamInfo``)."""
    function, _ = kernel.compiled(dtype, device)
    return _layout(function.kernel.ptr)


@functools.cache
def _layout(handle: int) -> tuple[tuple[int, int], ...]:
    from cuda.bindings import driver as cu

    function = cu.CUfunction(handle)
    layout = []
    while True:
        err, offset, size = cu.cuFuncGetParamInfo(function, len(layout))
        if err != cu.CUresult.CUDA_SUCCESS:
            break  # CUDA_ERROR_INVALID_VALUE: past the last parameter
        layout.append((offset, size))
    return tuple(layout)


def parameter_buffer(values: tuple, layout: tuple[tuple[int, int], ...]) -> bytes:
    """The parameter buffer of ``values`` (ints, written little-endian in their parameter's
    size, two's complement; bytes, copied whole) at ``layout``'s offsets, zeros between.

    Raises:
        RuntimeError: a different number of values and parameters, or bytes of another size.
    """
    if len(values) != len(layout):
        raise RuntimeError(f"the kernel takes {len(layout)} parameters; got {len(values)}")
    buffer = bytearray(max((offset + size for offset, size in layout), default=0))
    for value, (offset, size) in zip(values, layout):
        if isinstance(value, bytes):
            if len(value) != size:
                raise RuntimeError(f"a {size}-byte parameter got {len(value)} bytes")
        else:
            value = (int(value) % (1 << 8 * size)).to_bytes(size, "little")
        buffer[offset:offset + size] = value
    return bytes(buffer)
