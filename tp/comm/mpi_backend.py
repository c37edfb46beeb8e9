"""``mpi``: mpi4py's built-in buffer collectives (whatever algorithms the MPI library picks).

CPU tensors are passed as zero-copy numpy views. CUDA tensors go straight to MPI when the
library is CUDA-aware (``tp.mpi.cuda_aware()`` asks it); otherwise they are staged through
pinned host memory by the base class: a device-to-host copy, the host collective, a
host-to-device copy. Open MPI builds without CUDA support crash on device pointers, so this
choice is never a guess.
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from backends.dtypes import DTYPES

from ..mpi import cuda_aware
from .base import Communicator
from .transport import P2P_TAG, MpiTransport, _bytes

# torch dtype -> the MPI datatype it is summed as (``backends.dtypes``' ``mpi``). MPI has no
# standard datatype for fp16 or bf16, so native MPI cannot sum them.
_MPI_TYPES = {d.torch: getattr(MPI, d.mpi) for d in DTYPES.values() if d.mpi is not None}


def _typed(t: torch.Tensor):
    return [t if t.is_cuda else t.detach().numpy(), _MPI_TYPES[t.dtype]]


class MpiCommunicator(Communicator):
    """Native MPI collectives on a private duplicate of ``comm``."""

    name = "mpi"
    reduce_dtypes = tuple(_MPI_TYPES)

    def __init__(self, comm: MPI.Comm):
        self.p2p = MpiTransport(comm)  # owns the private duplicate of comm
        self.comm = self.p2p.comm
        super().__init__(self.p2p.rank, self.p2p.size)
        self.device_buffers = cuda_aware()

    def close(self) -> None:
        """As ``Communicator.close``, then free the private duplicate (collective)."""
        super().close()
        self.p2p.close()

    def _all_reduce(self, src, dst):
        send = MPI.IN_PLACE if src.data_ptr() == dst.data_ptr() else _typed(src)
        self.comm.Allreduce(send, _typed(dst), op=MPI.SUM)

    def _all_gather(self, src, dst):
        self.comm.Allgather(_bytes(src), _bytes(dst))

    def _reduce_scatter(self, src, dst):
        self.comm.Reduce_scatter_block(_typed(src), _typed(dst), op=MPI.SUM)

    def _all_to_all(self, src, dst):
        self.comm.Alltoall(_bytes(src), _bytes(dst))

    def _broadcast(self, buf, root):
        self.comm.Bcast(_bytes(buf), root=root)

    def _send(self, buf, dst):
        self.p2p.send(buf, dst, P2P_TAG)

    def _recv(self, buf, src):
        self.p2p.recv(buf, src, P2P_TAG)
