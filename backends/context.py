"""The CUDA context of a host thread, for launches made through the driver API."""

from __future__ import annotations


def bind_primary_context(device: int) -> None:
    """Make ``device``'s primary context current on the calling host thread, when ``device``
    is the thread's current device (a launch on another device switches to it first, which
    binds that device's context).

    A host thread starts with no current context. The CUDA runtime binds one at the thread's
    first runtime call that needs it, but the driver API (``cuLaunchKernel``,
    ``cuTensorMapEncodeTiled``) and cuBLASLt fail with CUDA_ERROR_INVALID_CONTEXT until then,
    so a thread whose first CUDA work is a ``gemm()`` call would fail. ``cudaSetDevice``
    binds it (CUDA 12 and later: CUDA Runtime API, "cudaSetDevice"); torch's and CuPy's device
    switches skip that call when the device is already current, so it is made here directly.
    Launches call this once per thread and binding.
    """
    from cupy.cuda import runtime

    if runtime.getDevice() == device:
        runtime.setDevice(device)
