"""``symm``: collectives over a symmetric heap, written once for host and GPU memory.

Every rank owns one buffer of the same size and sees every peer's (``symm_heap.py``: an MPI-3
shared-memory window on the CPU, CUDA IPC on the GPU), so data move by plain tensor copies
from peers' buffers (pull model) and the ranks synchronise only with the heap's barrier:

- all_gather: each rank copies its input into its own buffer; barrier; each copies every
  peer's buffer into its block of the output; barrier. On GPUs the copies are
  ``cudaMemcpyAsync`` calls by address (``IpcHeap.copy_engine_all_gather``): copy engines,
  no SMs, no tensor views.
- reduce_scatter: each rank copies its whole input into its own buffer; barrier; rank r sums
  block r of every peer's buffer into its output; barrier. On GPUs in fp32, fp16 and bf16,
  one kernel per piece, as the one-shot all_reduce below (``IpcHeap.one_shot_reduce_scatter``).
- all_reduce, one-shot (at every size on 2 ranks, up to ``ONE_SHOT_MAX_BYTES`` on more:
  ``crossover``): each rank copies its input into its own buffer; barrier; each sums every
  peer's whole buffer; barrier. Two-shot (above): the same first step; barrier; rank r sums
  chunk r of every buffer (a reduce-scatter) and writes the sum into chunk r of its own
  buffer; barrier; each copies chunk q from rank q (an all-gather); barrier. Per rank,
  one-shot reads (P-1) x S bytes of peers' memory and two-shot 2(P-1)/P x S, but one-shot has
  one barrier less, so it wins on small messages, and at every size on 2 ranks, where the
  bytes are the same.
  These are the one-shot and two-shot all-reduces of PyTorch's
  SymmetricMemory (``torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu``) and
  vLLM's custom all-reduce (``csrc/custom_all_reduce.cuh``, its 1-stage and 2-stage kernels).
  On GPUs, one-shot in fp32, fp16 and bf16 is one kernel per piece
  (``IpcHeap.one_shot_all_reduce``, ``symm_reduce.cu``: the copy, both barriers and the
  sum), so its host cost is one launch; the other paths issue several operations per piece.
- all_to_all: each rank copies its whole input into its own buffer; barrier; rank r copies
  block r of peer q's buffer into its block q; barrier.
- broadcast: the root copies its tensor into its buffer; barrier; the others copy it;
  barrier.

Semantics are NCCL's (NCCL user guide, "Collective Operations") as in ``base.py``; the
trailing barrier keeps a rank from overwriting its buffer while a peer still reads it. A
message larger than the heap's capacity goes in pieces of at most the capacity, each piece
the whole algorithm, so any size works. Sums add the ranks' values in rank order 0..P-1 on
every rank, fp16 and bf16 in an fp32 accumulator rounded once (as vLLM's kernels do; the
ring rounds to the dtype after every step instead): one-shot and two-shot compute every element with
the same operations, so all ranks get the same bits whichever path a size takes. Without call
checks (``check=False``), ranks that disagree on the size are not detected: there is no
message whose length could be counted.

send/recv do not use the heap: a synchronous send may run while an asynchronous collective
uses it. They go over ``MpiTransport`` on a private duplicate of the communicator, as
``ring/mpi``'s do; on the GPU the tensor is staged through host memory and the host waits
for the current stream (blocking even with ``async_op=True``).
"""

from __future__ import annotations

import functools

import torch

from .base import Communicator
from .ring import chunk_bounds
from .transport import P2P_TAG, MpiTransport

# all_reduce's crossover from one-shot to two-shot, by the number of ranks P (``crossover``).
# At P = 2 both read the same bytes of peer memory, (P - 1) S = 2 (P - 1) / P S = S, and
# two-shot adds a barrier and a copy, so one-shot is the faster at every size: on 2 H200s it took
# 0.10-0.63x two-shot's time eagerly and 0.25-0.66x as CUDA graphs at each size from 8 B to 256
# MiB (bench/results/comm-2xh200-symm-crossover/). Above two ranks two-shot reads less, and
# ONE_SHOT_MAX_BYTES is a default, not measured (for scale, vLLM's CustomAllreduce::allreduce
# stays 1-stage below 512 KiB on up to 4 fully connected GPUs and below 256 KiB on up to 8).
ONE_SHOT_MAX_BYTES = 256 << 10
_ALWAYS = 1 << 62  # a crossover no message reaches
# The communicator names of symm, each with its all_reduce crossover: ``symm`` takes
# ``crossover(P)``; the other two hold one algorithm at every size (-1: even an empty tensor
# goes two-shot), so one ``gemmlab comm`` sweep of both measures where they cross.
VARIANTS = {"symm": None, "symm/one-shot": _ALWAYS, "symm/two-shot": -1}
_WIDENED = (torch.float16, torch.bfloat16)  # summed in fp32, rounded once
_MAX_ITEMSIZE = 16  # complex128: every piece holds at least one element per rank


def crossover(ranks: int) -> int:
    """Bytes up to which ``symm``'s all_reduce is one-shot on ``ranks`` ranks (above: two-shot):
    every size at 2 ranks, ``ONE_SHOT_MAX_BYTES`` above."""
    return _ALWAYS if ranks <= 2 else ONE_SHOT_MAX_BYTES


def _pieces(n: int, step: int):
    """(start, stop) of consecutive blocks of at most ``step`` of ``n`` elements."""
    return ((a, min(n, a + step)) for a in range(0, n, step))


def _sum_into(out: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """``out = parts[0] + parts[1] + ...``, added in this order (fp16/bf16 in fp32)."""
    if out.dtype in _WIDENED:
        acc = parts[0].float()
        for part in parts[1:]:
            acc.add_(part)
        out.copy_(acc)
    else:
        out.copy_(parts[0])
        for part in parts[1:]:
            out.add_(part)


def _on_heap(method):
    """Run a collective between the heap's ``begin()`` and ``end()``."""
    @functools.wraps(method)
    def run(self, *args):
        self.heap.begin()
        method(self, *args)
        self.heap.end()

    return run


class SymmCommunicator(Communicator):
    """The collectives above over ``heap`` (``SharedWindowHeap`` or ``IpcHeap``), whose ranks
    are those of mpi4py ``comm`` in the same order.

    Host-driven on a ``SharedWindowHeap`` (CPU tensors), stream-ordered on an ``IpcHeap``
    (CUDA tensors on the heap's device). Sums are torch additions, so every floating and
    integer dtype works (``reduce_dtypes`` None).
    """

    def __init__(self, comm, heap, one_shot_max_bytes: int | None = None,
                 name: str = "symm"):
        """Collective over ``comm`` (duplicated for send/recv); the heap is closed with the
        communicator. ``one_shot_max_bytes``: all_reduce's crossover (None: ``crossover(P)``);
        ``name``: what it is called (``VARIANTS`` names the fixed-algorithm ones).

        Raises:
            ValueError: a heap too small to hold one 16-byte element per rank in a piece
                (the heap is closed first).
        """
        if heap.capacity < _MAX_ITEMSIZE * heap.size:  # alike on every rank: all close, raise
            heap.close()
            raise ValueError(f"symm: a heap of {heap.capacity} bytes per rank is too small "
                             f"for {heap.size} ranks; it needs {_MAX_ITEMSIZE * heap.size}")
        super().__init__(heap.rank, heap.size)
        self.heap = heap
        self.p2p = MpiTransport(comm)
        self.stream_ordered = heap.stream_ordered
        self.devices = heap.devices
        self.one_shot_max_bytes = (crossover(heap.size) if one_shot_max_bytes is None
                                   else one_shot_max_bytes)
        self.name = name

    def close(self) -> None:
        """As ``Communicator.close``, then free the heap and the send/recv communicator
        (collective: every rank must call it)."""
        super().close()
        if self.p2p.comm:  # once: MpiTransport.close empties it
            self.heap.close()
            self.p2p.close()

    def _view(self, r: int, dtype: torch.dtype, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of rank r's buffer as ``dtype``."""
        size = dtype.itemsize
        return self.heap.peer(r)[start * size:stop * size].view(dtype)

    def _piece(self, dtype: torch.dtype, parts: int = 1) -> int:
        """Elements per piece when ``parts`` blocks of it must fit in the buffer together."""
        return self.heap.capacity // (dtype.itemsize * parts)

    @_on_heap
    def _all_gather(self, src, dst):
        if self.heap.copy_engine_all_gather(src, dst):
            return
        n, dt, r = src.numel(), src.dtype, self.rank
        step = self._piece(dt)
        for a, b in _pieces(n, step):
            self._view(r, dt, 0, b - a).copy_(src[a:b])
            self.heap.barrier()
            for q in range(self.size):
                dst[q * n + a:q * n + b].copy_(src[a:b] if q == r else
                                               self._view(q, dt, 0, b - a))
            self.heap.barrier()

    @_on_heap
    def _reduce_scatter(self, src, dst):
        if self.heap.one_shot_reduce_scatter(src, dst):
            return
        n, dt, r, p = dst.numel(), src.dtype, self.rank, self.size
        step = self._piece(dt, p)
        for a, b in _pieces(n, step):
            m = b - a
            self._view(r, dt, 0, p * m).view(p, m).copy_(src.view(p, n)[:, a:b])
            self.heap.barrier()
            _sum_into(dst[a:b], [self._view(q, dt, r * m, (r + 1) * m) for q in range(p)])
            self.heap.barrier()

    @_on_heap
    def _all_reduce(self, src, dst):
        if src.numel() * src.element_size() <= self.one_shot_max_bytes:
            self._one_shot(src, dst)
        else:
            self._two_shot(src, dst)

    def _one_shot(self, src, dst):
        if self.heap.one_shot_all_reduce(src, dst):
            return
        n, dt, r = src.numel(), src.dtype, self.rank
        step = self._piece(dt)
        for a, b in _pieces(n, step):
            # dst may be src: the piece is read into the buffer before dst[a:b] is written
            self._view(r, dt, 0, b - a).copy_(src[a:b])
            self.heap.barrier()
            _sum_into(dst[a:b], [self._view(q, dt, 0, b - a) for q in range(self.size)])
            self.heap.barrier()

    def _two_shot(self, src, dst):
        n, dt, r, p = src.numel(), src.dtype, self.rank, self.size
        step = self._piece(dt)
        for a, b in _pieces(n, step):
            bounds = chunk_bounds(b - a, p)
            lo, hi = bounds[r], bounds[r + 1]
            self._view(r, dt, 0, b - a).copy_(src[a:b])
            self.heap.barrier()
            # Only this rank reads chunk r of any buffer in this phase, so it may overwrite its
            # own chunk r with the sum.
            _sum_into(dst[a + lo:a + hi], [self._view(q, dt, lo, hi) for q in range(p)])
            self._view(r, dt, lo, hi).copy_(dst[a + lo:a + hi])
            self.heap.barrier()
            for q in range(p):
                if q != r:
                    dst[a + bounds[q]:a + bounds[q + 1]].copy_(
                        self._view(q, dt, bounds[q], bounds[q + 1]))
            self.heap.barrier()

    @_on_heap
    def _all_to_all(self, src, dst):
        n, dt, r, p = src.numel() // self.size, src.dtype, self.rank, self.size
        step = self._piece(dt, p)
        for a, b in _pieces(n, step):
            m = b - a
            self._view(r, dt, 0, p * m).view(p, m).copy_(src.view(p, n)[:, a:b])
            self.heap.barrier()
            for q in range(p):
                dst[q * n + a:q * n + b].copy_(src[r * n + a:r * n + b] if q == r else
                                               self._view(q, dt, r * m, (r + 1) * m))
            self.heap.barrier()

    @_on_heap
    def _broadcast(self, buf, root):
        n, dt = buf.numel(), buf.dtype
        step = self._piece(dt)
        for a, b in _pieces(n, step):
            if self.rank == root:
                self._view(root, dt, 0, b - a).copy_(buf[a:b])
            self.heap.barrier()
            if self.rank != root:
                buf[a:b].copy_(self._view(root, dt, 0, b - a))
            self.heap.barrier()

    def _send(self, buf, dst):
        if buf.is_cuda:  # stream-ordered, so staged here: waits for the current stream
            buf = buf.cpu()
        self.p2p.send(buf, dst, P2P_TAG)

    def _recv(self, buf, src):
        if not buf.is_cuda:
            self.p2p.recv(buf, src, P2P_TAG)
            return
        host = torch.empty(buf.shape, dtype=buf.dtype)
        self.p2p.recv(host, src, P2P_TAG)
        buf.copy_(host)  # from pageable memory: ordered on the current stream, host waits
