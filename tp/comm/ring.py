"""Collectives written from scratch on point-to-point messages, over any transport.

All-reduce is ring reduce-scatter followed by ring all-gather (Patarasuk and Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009; the
schedule NCCL's ring all-reduce follows): the buffer is cut into P chunks and each of the
2(P-1) steps moves one chunk to the right neighbour, so every rank sends 2(P-1)/P of the
buffer, which is optimal. Chunks follow ``numpy.array_split`` (the first n % P chunks one
element longer), so any element count and any number of ranks work. All-to-all is the
pairwise exchange (at step s, rank r sends to r + s and receives from r - s); broadcast is a
binomial tree rooted at ``root`` (log2 P rounds).
"""

from __future__ import annotations

import torch

from .base import Communicator
from .transport import P2P_TAG


def chunk_bounds(n: int, parts: int) -> list[int]:
    """Offsets of ``parts`` chunks of ``n`` elements: chunk i is ``[b[i], b[i + 1])``."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


class RingCommunicator(Communicator):
    """The ring algorithms over ``transport`` (``MpiTransport`` or ``NcclTransport``).

    Sums are computed by torch in the tensor's own dtype (as NCCL does), so every dtype works.
    Over MPI, CUDA tensors are staged once per call: the per-step sums run on the host.
    """

    def __init__(self, transport):
        super().__init__(transport.rank, transport.size)
        self.transport = transport
        self.name = f"ring/{transport.name}"
        self.stream_ordered = transport.stream_ordered
        self.devices = transport.devices

    def close(self) -> None:
        """As ``Communicator.close``, then close the transport (collective)."""
        super().close()
        self.transport.close()

    def _all_reduce(self, src, dst):
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
        bounds = chunk_bounds(dst.numel(), self.size)
        self._reduce_scatter_in_place(dst, bounds)
        self._all_gather_in_place(dst, bounds)

    def _reduce_scatter(self, src, dst):
        work = src.clone()  # the ring sums in place; the caller's input stays as it was
        bounds = chunk_bounds(src.numel(), self.size)
        self._reduce_scatter_in_place(work, bounds)
        dst.copy_(work[bounds[self.rank]:bounds[self.rank + 1]])

    def _all_gather(self, src, dst):
        bounds = chunk_bounds(dst.numel(), self.size)
        dst[bounds[self.rank]:bounds[self.rank + 1]].copy_(src)
        self._all_gather_in_place(dst, bounds)

    def _all_to_all(self, src, dst):
        bounds = chunk_bounds(src.numel(), self.size)

        def block(t, i):
            return t[bounds[i]:bounds[i + 1]]

        block(dst, self.rank).copy_(block(src, self.rank))
        for step in range(1, self.size):
            to, frm = (self.rank + step) % self.size, (self.rank - step) % self.size
            self.transport.sendrecv(block(src, to), to, block(dst, frm), frm)

    def _broadcast(self, buf, root):
        virtual = (self.rank - root) % self.size  # the root is virtual rank 0
        mask = 1
        while mask < self.size:
            if virtual < mask and virtual + mask < self.size:
                self.transport.send(buf, (virtual + mask + root) % self.size)
            elif mask <= virtual < 2 * mask:
                self.transport.recv(buf, (virtual - mask + root) % self.size)
            mask *= 2

    def _send(self, buf, dst):
        self.transport.send(buf, dst, P2P_TAG)

    def _recv(self, buf, src):
        self.transport.recv(buf, src, P2P_TAG)

    def _reduce_scatter_in_place(self, x: torch.Tensor, bounds: list[int]) -> None:
        """P-1 steps; at step s rank r passes chunk r-s-1 right and adds chunk r-s-2 from the
        left, so afterwards chunk r of x on rank r holds the sum over all ranks."""
        p, r = self.size, self.rank
        right, left = (r + 1) % p, (r - 1) % p
        scratch = torch.empty(max(bounds[i + 1] - bounds[i] for i in range(p)),
                              dtype=x.dtype, device=x.device)
        for step in range(p - 1):
            out_c, in_c = (r - step - 1) % p, (r - step - 2) % p
            incoming = scratch[:bounds[in_c + 1] - bounds[in_c]]
            self.transport.sendrecv(x[bounds[out_c]:bounds[out_c + 1]], right, incoming, left)
            x[bounds[in_c]:bounds[in_c + 1]].add_(incoming)

    def _all_gather_in_place(self, x: torch.Tensor, bounds: list[int]) -> None:
        """P-1 steps; at step s rank r passes chunk r-s right and receives chunk r-s-1 from
        the left into place, so every chunk reaches every rank."""
        p, r = self.size, self.rank
        right, left = (r + 1) % p, (r - 1) % p
        for step in range(p - 1):
            out_c, in_c = (r - step) % p, (r - step - 1) % p
            self.transport.sendrecv(x[bounds[out_c]:bounds[out_c + 1]], right,
                                    x[bounds[in_c]:bounds[in_c + 1]], left)
