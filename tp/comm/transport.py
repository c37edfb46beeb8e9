"""Point-to-point transports for the from-scratch ring algorithms: bytes between two ranks.

A transport moves the bytes of flat contiguous tensors; the algorithms in ``ring.py`` never
see which one they run over. ``MpiTransport`` sends host memory through mpi4py (CUDA
tensors are staged by the communicator); ``NcclTransport`` sends device memory through
``ncclSend``/``ncclRecv`` on the current CUDA stream, with no host copies.
"""

from __future__ import annotations

import torch

from backends.dtypes import DTYPES

from .base import raw_stream

# MpiTransport owns a duplicated MPI communicator; within it, the ring's own messages and the
# user's send/recv (which may run concurrently on another thread) never match each other.
# NcclTransport has no tags (NCCL has none): between two ranks, its messages match in the
# order they are issued.
RING_TAG, P2P_TAG = 7, 8


class MpiTransport:
    """Host-memory messages over an mpi4py communicator (duplicated, so private)."""

    name = "mpi"
    stream_ordered = False
    devices = ("cpu", "cuda")

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def close(self) -> None:
        """Free the private duplicate (collective over its ranks; a second call does nothing:
        a freed communicator is ``MPI.COMM_NULL``, which is false)."""
        if self.comm:
            self.comm.Free()

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """Send ``send`` to ``dst`` while receiving ``recv`` from ``src`` (no deadlock)."""
        from mpi4py import MPI

        if send.numel() == 0 or recv.numel() == 0:  # both peers know the sizes: skip alike
            if send.numel():
                self.send(send, dst)
            if recv.numel():
                self.recv(recv, src)
            return
        status = MPI.Status()
        self.comm.Sendrecv(_bytes(send), dst, RING_TAG, _bytes(recv), src, RING_TAG, status)
        _check_count(status, recv, src, self.rank)

    def send(self, buf: torch.Tensor, dst: int, tag: int = RING_TAG) -> None:
        if buf.numel():
            self.comm.Send(_bytes(buf), dst, tag)

    def recv(self, buf: torch.Tensor, src: int, tag: int = RING_TAG) -> None:
        from mpi4py import MPI

        if buf.numel():
            status = MPI.Status()
            self.comm.Recv(_bytes(buf), src, tag, status)
            _check_count(status, buf, src, self.rank)


class NcclTransport:
    """Device-memory messages through NCCL point-to-point calls on the current stream."""

    name = "nccl"
    stream_ordered = True
    devices = ("cuda",)

    def __init__(self, nccl_comm, rank: int, size: int):
        self.comm, self.rank, self.size = nccl_comm, rank, size

    def close(self) -> None:
        """Destroy the NCCL communicator (``destroy_nccl_comm``; collective, once)."""
        self.comm = destroy_nccl_comm(self.comm)

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """One NCCL group, so the matching send and receive of neighbours cannot deadlock."""
        from cupy.cuda import nccl

        nccl.groupStart()
        self.send(send, dst)
        self.recv(recv, src)
        nccl.groupEnd()

    def send(self, buf: torch.Tensor, dst: int, tag: int = RING_TAG) -> None:
        if buf.numel():  # NCCL orders messages by stream; the tag is not needed
            self.comm.send(buf.data_ptr(), buf.numel() * buf.element_size(), _NCCL_UINT8, dst,
                           raw_stream())

    def recv(self, buf: torch.Tensor, src: int, tag: int = RING_TAG) -> None:
        if buf.numel():
            self.comm.recv(buf.data_ptr(), buf.numel() * buf.element_size(), _NCCL_UINT8, src,
                           raw_stream())


_NCCL_UINT8 = DTYPES["uint8"].nccl  # transports move bytes


def destroy_nccl_comm(nccl_comm):
    """``ncclCommDestroy`` of a ``cupy.cuda.nccl.NcclCommunicator`` (None: nothing to do);
    returns None, the closed state. Collective: every rank destroys its communicators in the
    same order. Left to garbage collection, the destroy runs whenever each process happens to
    free the object, and it finalizes the communicator, waiting for the other ranks: vLLM
    met that deadlock (vllm-project/vllm#4508), and on 2 H200s one rank of ``gemmlab comm``
    waited in it while the other stood at its exit, until the exit guard aborted the job.
    NCCL's destroy also waits until every CUDA graph that captured the communicator's calls
    is destroyed: destroy those graphs first."""
    if nccl_comm is not None:
        nccl_comm.destroy()


def _bytes(t: torch.Tensor):
    """The tensor's memory as an mpi4py byte message (numpy view on the host)."""
    from mpi4py import MPI

    raw = t.detach().view(torch.uint8)
    return [raw if raw.is_cuda else raw.numpy(), MPI.BYTE]


def _check_count(status, buf: torch.Tensor, src: int, rank: int) -> None:
    """A shorter message than expected means the ranks disagree on the size: say so.
    (A longer one already fails inside MPI as a truncation error.)"""
    from mpi4py import MPI

    got, want = status.Get_count(MPI.BYTE), buf.numel() * buf.element_size()
    if got != want:
        raise RuntimeError(f"rank {rank} expected {want} bytes from rank {src} and got {got}: "
                           f"the ranks called the operation with different sizes")
