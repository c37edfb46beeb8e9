"""MPI plumbing for every multi-rank gemmlab program: abort on the first exception, local
ranks and GPU binding, and detection of a CUDA-aware MPI library."""

from __future__ import annotations

import ctypes
import functools
import sys
import traceback

import torch
from mpi4py import MPI


def abort_on_exception(comm: MPI.Comm = MPI.COMM_WORLD) -> None:
    """Make an uncaught exception on any rank abort the whole job instead of hanging it.

    Without this, the failing rank exits while the others wait forever in their next
    collective (and mpi4py's MPI_Finalize at exit waits too). The hook prints the traceback
    prefixed with the rank, then calls ``MPI_Abort``, which makes ``mpiexec`` kill every rank
    and exit non-zero (what ``python -m mpi4py`` does for scripts).
    """
    def hook(exc_type, exc, tb):
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        rank = comm.Get_rank()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stderr.flush()
        comm.Abort(1)

    sys.excepthook = hook


def local_rank(comm: MPI.Comm = MPI.COMM_WORLD) -> int:
    """This process's rank among the ranks of ``comm`` on the same node."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    rank = node.Get_rank()
    node.Free()
    return rank


def bind_device(comm: MPI.Comm = MPI.COMM_WORLD) -> torch.device:
    """Make GPU ``local_rank % device_count`` this process's current CUDA device.

    Raises:
        RuntimeError: no CUDA device is visible.
    """
    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError("no CUDA device visible to torch on this rank")
    device = torch.device("cuda", local_rank(comm) % count)
    torch.cuda.set_device(device)
    return device


@functools.cache
def cuda_aware() -> bool:
    """Whether the MPI library can take CUDA device buffers, asked of the library itself.

    Open MPI answers ``MPIX_Query_cuda_support()``; MPICH 4+ answers
    ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA = 0, &flag)``. A library with neither is
    treated as not CUDA-aware, so GPU tensors are staged through host memory (always correct).
    The symbols are looked up through mpi4py's own extension module, whose dependencies
    include the MPI library it was loaded with.
    """
    lib = ctypes.CDLL(MPI.__file__)
    if hasattr(lib, "MPIX_Query_cuda_support"):
        return lib.MPIX_Query_cuda_support() == 1
    if hasattr(lib, "MPIX_GPU_query_support"):
        flag = ctypes.c_int(0)
        return lib.MPIX_GPU_query_support(0, ctypes.byref(flag)) == 0 and flag.value == 1
    return False
