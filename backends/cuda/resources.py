"""What a compiled CUDA C kernel of the ladder asks of an SM, from the CUDA driver.

The numbers Nsight Compute's "Launch Statistics" and "Occupancy" sections start from, read
without a profiler: ``cuFuncGetAttribute`` (registers per thread, static shared memory, local
memory per thread: spills and stack) and ``cuOccupancyMaxActiveBlocksPerMultiprocessor``
(blocks that fit on one SM at once, limited by registers, shared memory, threads or the
block-slot limit). Theoretical occupancy = resident warps / the SM's maximum warps.
"""

from __future__ import annotations

import math

import torch

from . import CudaKernel


def resources(kernel: CudaKernel, dtype: torch.dtype, device: int) -> dict:
    """Resource use of ``kernel`` built for ``dtype`` on CUDA ``device``.

    Returns:
        ``registers`` (per thread), ``static_smem`` and ``dynamic_smem`` (bytes per block),
        ``local_bytes`` (local memory per thread; > 0 means spills or a stack frame),
        ``threads`` (per block), ``blocks_per_sm`` (resident at once) and ``occupancy``
        (theoretical, 0..1).

    Raises:
        cupy.cuda.driver.CUDADriverError / cupy.cuda.compiler.CompileException: the kernel
            does not compile or its attributes cannot be read.
    """
    import cupy

    function, smem = kernel.compiled(dtype, device)
    threads = math.prod(kernel.threads)
    with cupy.cuda.Device(device):
        blocks = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            function.kernel.ptr, threads, smem)
        max_threads = cupy.cuda.Device(device).attributes["MaxThreadsPerMultiProcessor"]
    return {"registers": function.num_regs, "static_smem": function.shared_size_bytes,
            "dynamic_smem": smem, "local_bytes": function.local_size_bytes, "threads": threads,
            "blocks_per_sm": blocks, "occupancy": blocks * threads / max_threads}
