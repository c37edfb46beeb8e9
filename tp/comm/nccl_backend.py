"""``nccl``: NCCL's collectives through ``cupy.cuda.nccl``, bootstrapped over mpi4py.

Rank 0 creates NCCL's unique id and broadcasts it over MPI; every rank then joins the NCCL
communicator on its own GPU (``tp.mpi.bind_device``: local rank modulo device count).
Operations are enqueued on the stream given (default: the current one). NCCL has no
all-to-all; it is the grouped send/recv pattern from NCCL's user guide ("Point-to-point
communication", all-to-all example). NCCL failures raise ``cupy.cuda.nccl.NcclError``
carrying NCCL's own message.
"""

from __future__ import annotations

import torch

from backends.dtypes import DTYPES

from .base import Communicator, raw_stream
from .transport import destroy_nccl_comm

NCCL_SUM = 0  # ncclRedOp_t's ncclSum in nccl.h (the ncclDataType_t values: backends.dtypes)
# torch dtype -> ncclDataType_t, every dtype that has one.
_CODES = {d.torch: d.nccl for d in DTYPES.values() if d.nccl is not None}


def nccl_code(dtype: torch.dtype) -> int:
    """The ``ncclDataType_t`` of torch ``dtype`` (``backends.dtypes``).

    Raises:
        TypeError: NCCL has no type for it.
    """
    try:
        return _CODES[dtype]
    except KeyError:
        raise TypeError(f"nccl has no data type for {dtype}; it takes "
                        f"{', '.join(str(d) for d in _CODES)}") from None


def nccl_unavailable_reason() -> str | None:
    """Why NCCL cannot be used here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        return f"cupy.cuda.nccl is not importable ({exc})"
    return None if nccl.available else "CuPy was built without NCCL"


def create_nccl_comm(comm, device: torch.device):
    """A ``cupy.cuda.nccl.NcclCommunicator`` over the ranks of mpi4py ``comm`` on ``device``.

    Collective over ``comm``. Raises RuntimeError when NCCL cannot be used here.
    """
    if (why := nccl_unavailable_reason()) is not None:
        raise RuntimeError(f"nccl: {why}")
    import cupy
    from cupy.cuda import nccl

    rank, size = comm.Get_rank(), comm.Get_size()
    unique_id = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    with cupy.cuda.Device(device.index):
        return nccl.NcclCommunicator(size, unique_id, rank)


class NcclCommunicator(Communicator):
    """NCCL collectives on the ranks of mpi4py ``comm``, one GPU per rank."""

    name = "nccl"
    stream_ordered = True
    devices = ("cuda",)
    reduce_dtypes = tuple(_CODES)

    def __init__(self, comm, device: torch.device):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.device = device
        self.comm = create_nccl_comm(comm, device)

    def close(self) -> None:
        """As ``Communicator.close``, then destroy the NCCL communicator
        (``transport.destroy_nccl_comm``: collective; a second call does nothing)."""
        super().close()
        self.comm = destroy_nccl_comm(self.comm)

    def _all_reduce(self, src, dst):
        self.comm.allReduce(src.data_ptr(), dst.data_ptr(), src.numel(),
                            nccl_code(src.dtype), NCCL_SUM, raw_stream())

    def _all_gather(self, src, dst):
        self.comm.allGather(src.data_ptr(), dst.data_ptr(), src.numel(),
                            nccl_code(src.dtype), raw_stream())

    def _reduce_scatter(self, src, dst):
        self.comm.reduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel(),
                                nccl_code(src.dtype), NCCL_SUM, raw_stream())

    def _all_to_all(self, src, dst):
        from cupy.cuda import nccl

        n = src.numel() // self.size
        dtype, step, stream = nccl_code(src.dtype), n * src.element_size(), raw_stream()
        nccl.groupStart()
        for peer in range(self.size):
            self.comm.send(src.data_ptr() + peer * step, n, dtype, peer, stream)
            self.comm.recv(dst.data_ptr() + peer * step, n, dtype, peer, stream)
        nccl.groupEnd()

    def _broadcast(self, buf, root):
        self.comm.broadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                            nccl_code(buf.dtype), root, raw_stream())

    def _send(self, buf, dst):
        self.comm.send(buf.data_ptr(), buf.numel(), nccl_code(buf.dtype), dst, raw_stream())

    def _recv(self, buf, src):
        self.comm.recv(buf.data_ptr(), buf.numel(), nccl_code(buf.dtype), src, raw_stream())
