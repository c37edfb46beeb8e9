"""MPI plumbing for every multi-rank gemmlab program: the whole job aborts when one rank
leaves early, local ranks and GPU binding, and detection of a CUDA-aware MPI library."""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import sys
import time
import traceback

import torch
from mpi4py import MPI

# Seconds a rank that reaches the end waits for the others there (GEMMLAB_EXIT_TIMEOUT).
EXIT_TIMEOUT = 10.0
_job: MPI.Comm | None = None  # the communicator abort() aborts, once installed


def abort_on_exception(comm: MPI.Comm = MPI.COMM_WORLD, exit_timeout: float | None = None) -> None:
    """Make any rank that leaves early abort the whole job instead of hanging it.

    Without this, a rank that stops while the others wait in a collective leaves them
    waiting forever (and mpi4py's MPI_Finalize at exit waits too). Installed here:

    - an uncaught exception: the hook prints the traceback prefixed with the rank, then
      calls ``MPI_Abort``, which makes ``mpiexec`` kill every rank and exit non-zero (what
      ``python -m mpi4py`` does for scripts);
    - an asynchronous communication op that fails on a worker thread: ``abort`` (the same),
      even if its handle is never waited on (``tp.comm``'s host-driven backends call it);
    - any exit, ``sys.exit`` with any code included: at exit each rank enters a barrier on a
      private duplicate of ``comm`` and polls it; if the other ranks have not all arrived
      within ``exit_timeout`` seconds (default ``GEMMLAB_EXIT_TIMEOUT`` or 10), they are
      waiting for this one in an operation it will never join, and it aborts the job. Ranks
      that legitimately finish further apart than that need a larger timeout.

    Collective over ``comm``.
    """
    global _job
    _job = comm
    timeout = (float(os.environ.get("GEMMLAB_EXIT_TIMEOUT", EXIT_TIMEOUT))
               if exit_timeout is None else exit_timeout)
    exits = comm.Dup()

    def hook(exc_type, exc, tb):
        abort("".join(traceback.format_exception(exc_type, exc, tb)))

    def at_exit():
        request, deadline = exits.Ibarrier(), time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                abort(f"this rank is exiting, but not every rank has reached the end within "
                      f"{timeout:g} s (GEMMLAB_EXIT_TIMEOUT): the others would wait for it "
                      f"forever, so the job is aborted")
            time.sleep(0.001)

    sys.excepthook = hook
    atexit.register(at_exit)  # runs before mpi4py's MPI_Finalize (registered earlier)


def abort(text: str) -> None:
    """Print ``text`` prefixed with the rank on stderr and abort the job installed by
    ``abort_on_exception`` (``MPI_Abort``: ``mpiexec`` kills every rank); without one,
    return and let the caller raise."""
    if _job is None:
        return
    rank = _job.Get_rank()
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
    sys.stderr.flush()
    # mpiexec forwards a rank's output through a pipe; the kill that MPI_Abort starts can
    # outrun it on a loaded machine (seen in CI: the job aborted, the message lost).
    time.sleep(0.5)
    _job.Abort(1)


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
