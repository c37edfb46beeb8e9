"""One communicator interface, five implementations (see ``base.py`` for the semantics).

=============  =====================================================================
``mpi``        mpi4py's built-in collectives; CUDA tensors direct if MPI is CUDA-aware,
               else staged through pinned host memory
``ring/mpi``   the from-scratch ring algorithms over MPI point-to-point (host memory)
``ring/nccl``  the same algorithms over NCCL send/recv (GPU memory, no host copies)
``nccl``       NCCL's own collectives through ``cupy.cuda.nccl``
``symm``       one-shot/two-shot collectives over a symmetric heap (``symm.py``): an MPI-3
               shared-memory window on the CPU, CUDA IPC buffers on the GPU (one node)
=============  =====================================================================

``symm/one-shot`` and ``symm/two-shot`` are ``symm`` with its all_reduce held to one algorithm
at every size, to measure the crossover (``symm.ONE_SHOT_MAX_BYTES``) with ``gemmlab comm``.

``ring`` picks ``ring/nccl`` for a CUDA device and ``ring/mpi`` otherwise; ``symm`` picks its
heap by the device the same way.
"""

from __future__ import annotations

import torch

from .base import Communicator, Work
from .symm import VARIANTS

SYMM = tuple(VARIANTS)  # symm and its fixed-algorithm variants
BACKENDS = ("mpi", "ring", "ring/mpi", "ring/nccl", "nccl", *SYMM)


def create(name: str, comm=None, device: torch.device | str = "cpu", *,
           check: bool = True) -> Communicator:
    """A communicator ``name`` over the ranks of mpi4py ``comm`` (default COMM_WORLD).

    Collective: every rank of ``comm`` must call it with the same arguments. ``device`` is
    where its tensors live; NCCL-based backends need a CUDA device (bind it first with
    ``tp.mpi.bind_device``). With ``check`` (the default) every call is checked against the
    other ranks' before data moves: a different operation, dtype, shape or root on any rank
    raises ValueError on every rank (``base.py``'s "Call checks"; its cost is what
    ``gemmlab comm --call-check on,off`` measures).

    Raises:
        ValueError: unknown name (the message lists the known ones), an NCCL backend
            asked for a CPU device, or a ``symm`` communicator over ranks on more than one
            node.
        RuntimeError: NCCL (or, for ``symm`` on a GPU, CuPy) cannot be used on this machine
            (the reason is given).
    """
    from mpi4py import MPI

    from .mpi_backend import MpiCommunicator
    from .nccl_backend import NcclCommunicator, create_nccl_comm
    from .ring import RingCommunicator
    from .symm import SymmCommunicator
    from .symm_heap import ipc_unavailable_reason, open_heap
    from .transport import MpiTransport, NcclTransport

    comm = MPI.COMM_WORLD if comm is None else comm
    device = torch.device(device)
    if name == "ring":
        name = "ring/nccl" if device.type == "cuda" else "ring/mpi"
    if name in ("nccl", "ring/nccl") and device.type != "cuda":
        raise ValueError(f"{name} needs a CUDA device; got {device}")
    if name in SYMM and device.type == "cuda" and (why := ipc_unavailable_reason()):
        raise RuntimeError(f"{name}: {why}")  # before asking torch for the current device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if name == "mpi":
        communicator = MpiCommunicator(comm)
    elif name == "ring/mpi":
        communicator = RingCommunicator(MpiTransport(comm))
    elif name == "ring/nccl":
        communicator = RingCommunicator(NcclTransport(create_nccl_comm(comm, device),
                                                      comm.Get_rank(), comm.Get_size()))
    elif name == "nccl":
        communicator = NcclCommunicator(comm, device)
    elif name in SYMM:
        communicator = SymmCommunicator(comm, open_heap(comm, device), VARIANTS[name], name)
    else:
        raise ValueError(f"unknown communicator {name!r}; known: {', '.join(BACKENDS)}")
    if check:
        communicator.check_calls(comm)
    return communicator


def reduce_dtypes(name: str, device_type: str = "cpu") -> tuple[torch.dtype, ...] | None:
    """The dtypes communicator ``name`` can sum (all_reduce, reduce_scatter) on devices of
    ``device_type``, without creating it: its ``reduce_dtypes``; None for every floating and
    integer dtype (the ring and symm algorithms add with torch).

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name == "ring":
        name = "ring/nccl" if device_type == "cuda" else "ring/mpi"
    if name == "mpi":
        from .mpi_backend import MpiCommunicator

        return MpiCommunicator.reduce_dtypes
    if name == "nccl":
        from .nccl_backend import NcclCommunicator

        return NcclCommunicator.reduce_dtypes
    if name in ("ring/mpi", "ring/nccl"):
        from .ring import RingCommunicator

        return RingCommunicator.reduce_dtypes
    if name in SYMM:
        from .symm import SymmCommunicator

        return SymmCommunicator.reduce_dtypes
    raise ValueError(f"unknown communicator {name!r}; known: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Communicator", "Work", "create", "reduce_dtypes"]
