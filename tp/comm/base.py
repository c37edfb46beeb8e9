"""The communicator interface every backend implements, on torch tensors.

A backend supplies the data movement on flat contiguous 1-D tensors (``_all_reduce(src,
dst)`` and friends); this base class does everything else once: argument checks, output
allocation, CUDA streams, host staging and asynchronous handles. Collective semantics
follow ``torch.distributed``:

- ``all_reduce(x)``: every rank gets the element-wise sum of all ranks' x.
- ``all_gather(x)``: every rank gets the ranks' x concatenated along dim 0 (P x the rows).
- ``reduce_scatter(x)``: x's dim 0 is cut into P equal blocks; rank r gets the sum of block r.
- ``all_to_all(x)``: x's dim 0 is cut into P equal blocks; block j goes to rank j, and rank r's
  output holds, at block j, what rank j sent to r.
- ``broadcast(x, root)``: every rank's x becomes root's x (in place).
- ``send(x, dst)`` / ``recv(x, src)``: point to point (``recv`` fills x in place).

Each call takes ``stream=`` (CUDA tensors only; default the current stream) and
``async_op=``. Synchronous calls return the result tensor, ready for use on the current
stream. Asynchronous calls return a ``Work``; ``work.wait()`` returns the result once it is
safe to use on the current stream.

Call checks (``check=True``, the default of ``tp.comm.create``): before any data moves, the
ranks agree on the call. A collective's operation, dtype, shape and root are hashed into one
integer and every rank takes the max and min of it over a private duplicate of the MPI
communicator (one 16-byte ``MPI_Allreduce``); if they differ, every rank gathers the calls
and raises the same ValueError naming each rank's. A ``send`` first sends its dtype and
element count to the receiver, which compares them with its own before the data. The cost is
measured by ``gemmlab comm --call-check on,off``.

Two execution models:
- stream-ordered (NCCL, ring over NCCL, symm on GPUs): the operation is enqueued on the
  stream; completion is a CUDA event, so the host never blocks.
- host-driven (MPI, ring over MPI, symm on the CPU): the host runs the algorithm. CUDA
  tensors are staged through pinned host memory unless the backend takes device buffers (a
  CUDA-aware MPI).
  Asynchronous calls run on one worker thread per communicator, in call order; a synchronous
  collective first waits for the ones still pending (synchronous send/recv do not, so an
  asynchronous send can overlap a receive). That needs ``MPI_THREAD_MULTIPLE``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch

from profiling.nvtx import annotate

# The call header's codes: the same on every rank (dtypes in the order of their names).
_OPS = {op: i for i, op in enumerate(("all_reduce", "all_gather", "reduce_scatter",
                                      "all_to_all", "broadcast", "send", "recv"), 1)}
_DTYPES = {d: i for i, d in enumerate(sorted(
    {v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))}
_HEADER_TAG = 9
_SIGN_BITS = (1 << 62) - 1  # a non-negative int64 whose negation is one too


def raw_stream(device: int | None = None) -> int:
    """torch's current ``cudaStream_t`` on CUDA device ``device`` (default: the current
    device) as an int, for CUDA and NCCL calls; builds no ``torch.cuda.Stream`` (which costs
    microseconds of host time)."""
    if device is None:
        device = torch._C._cuda_getDevice()
    return torch._C._cuda_getCurrentRawStream(device)


class Work:
    """Handle of an asynchronous operation; ``wait()`` returns its result tensor."""

    def __init__(self, wait: Callable[[], torch.Tensor]):
        self._wait = wait

    def wait(self) -> torch.Tensor:
        """Block until the result may be used on the current stream (CUDA: the current stream
        waits on an event, the host does not block), then return it."""
        return self._wait()


class Communicator(ABC):
    """A group of ranks that can run the collectives above.

    Attributes:
        name: backend name (``"mpi"``, ``"ring/mpi"``, ``"ring/nccl"``, ``"nccl"``, or
            ``"symm"`` and its fixed-algorithm variants: ``tp.comm.BACKENDS``).
        rank, size: this rank and the number of ranks.
        stream_ordered: True when operations are enqueued on CUDA streams (see module doc).
        device_buffers: host-driven backends only: True when CUDA tensors are handed to the
            transport directly instead of being staged through host memory.
        devices: torch device types whose tensors it takes.
        reduce_dtypes: dtypes it can sum (None: all floating and integer dtypes).
    """

    name: str
    stream_ordered: bool = False
    device_buffers: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    reduce_dtypes: tuple[torch.dtype, ...] | None = None

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: concurrent.futures.Future | None = None
        self._staging = threading.local()  # pinned buffers per thread (see _stage)
        self._calls = self._p2p_calls = None  # the call checks' communicators

    @property
    def check(self) -> bool:
        """Whether calls are checked across ranks before data moves (see the module doc)."""
        return self._calls is not None

    def check_calls(self, comm) -> None:
        """Check every call against the other ranks' (module doc) over private duplicates of
        mpi4py ``comm``, the group this communicator spans. Collective over ``comm``."""
        self._calls, self._p2p_calls = comm.Dup(), comm.Dup()
        self._header = np.zeros(2, dtype=np.int64)

    # The data movement each backend provides: flat contiguous tensors on one device.
    @abstractmethod
    def _all_reduce(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...
    @abstractmethod
    def _all_gather(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...
    @abstractmethod
    def _reduce_scatter(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...
    @abstractmethod
    def _all_to_all(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...
    @abstractmethod
    def _broadcast(self, buf: torch.Tensor, root: int) -> None: ...
    @abstractmethod
    def _send(self, buf: torch.Tensor, dst: int) -> None: ...
    @abstractmethod
    def _recv(self, buf: torch.Tensor, src: int) -> None: ...

    def async_unavailable_reason(self) -> str | None:
        """Why ``async_op=True`` cannot be used here, or None. Host-driven backends run
        asynchronous calls on a worker thread, which MPI allows only at MPI_THREAD_MULTIPLE."""
        if self.stream_ordered:
            return None
        from mpi4py import MPI

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            return "MPI was initialised without MPI_THREAD_MULTIPLE"
        return None

    # Public operations.
    def all_reduce(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None,
                   stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Sum ``tensor`` over all ranks, in place or into ``out`` (same shape and dtype).

        Raises:
            TypeError: a dtype this backend cannot sum (e.g. fp16 through native MPI).
            ValueError: see ``_check``.
        """
        self._check(tensor, reduce=True)
        out = tensor if out is None else self._check_out(out, tensor, tensor.shape,
                                                         same_allowed=True)
        return self._launch("all_reduce", self._all_reduce, tensor, out, stream, async_op)

    def all_gather(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None,
                   stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Concatenate every rank's ``tensor`` along dim 0: shape (P * n, ...) from (n, ...)."""
        self._check(tensor)
        shape = (self.size * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() else (self.size,)
        out = self._new_or_checked(out, tensor, shape)
        return self._launch("all_gather", self._all_gather, tensor, out, stream, async_op)

    def reduce_scatter(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None,
                       stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Rank r gets the sum over ranks of block r of ``tensor``: (P * n, ...) -> (n, ...).

        Raises:
            ValueError: dim 0 is not a multiple of the number of ranks.
        """
        self._check(tensor, reduce=True, blocks=True)
        out = self._new_or_checked(out, tensor, (tensor.shape[0] // self.size, *tensor.shape[1:]))
        return self._launch("reduce_scatter", self._reduce_scatter, tensor, out, stream,
                            async_op)

    def all_to_all(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None,
                   stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Block j of dim 0 goes to rank j; block j of the result came from rank j.

        Raises:
            ValueError: dim 0 is not a multiple of the number of ranks.
        """
        self._check(tensor, blocks=True)
        out = self._new_or_checked(out, tensor, tensor.shape)
        return self._launch("all_to_all", self._all_to_all, tensor, out, stream, async_op)

    def broadcast(self, tensor: torch.Tensor, root: int = 0, *,
                  stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Overwrite every rank's ``tensor`` with root's, in place."""
        self._check(tensor)
        self._check_peer(root, "root")
        return self._launch("broadcast", _Op(lambda _, buf: self._broadcast(buf, root),
                                             root=root),
                            tensor, tensor, stream, async_op, reads_out=True)

    def send(self, tensor: torch.Tensor, dst: int, *,
             stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Send ``tensor`` to rank ``dst`` (which must post a matching ``recv``)."""
        self._check(tensor)
        self._check_peer(dst, "dst", distinct=True)
        return self._launch("send", _Op(lambda src, _: self._send(src, dst), peer=dst),
                            tensor, tensor, stream, async_op, writes_out=False,
                            collective=False)

    def recv(self, tensor: torch.Tensor, src: int, *,
             stream: torch.cuda.Stream | None = None, async_op: bool = False):
        """Fill ``tensor`` in place with what rank ``src`` sends.

        Raises:
            ValueError: with the call checks on, the sender's dtype or element count is not
                ``tensor``'s (before the data moves); see ``_check``.
            RuntimeError (transport dependent): without them, the message does not have
                ``tensor``'s size.
        """
        self._check(tensor)
        self._check_peer(src, "src", distinct=True)
        return self._launch("recv", _Op(lambda _, buf: self._recv(buf, src), peer=src),
                            tensor, tensor, stream, async_op, reads_in=False,
                            collective=False)

    def close(self) -> None:
        """Wait for pending work and stop the worker thread, if one was started."""
        if self._pending is not None:
            self._pending.result()
        if self._executor is not None:
            self._executor.shutdown()
        for calls in (self._calls, self._p2p_calls):
            if calls is not None:
                calls.Free()
        self._calls = self._p2p_calls = None

    # Checks.
    def _check(self, tensor: torch.Tensor, *, reduce: bool = False, blocks: bool = False):
        """Reject what would fail or silently go wrong, before any rank communicates.

        Raises:
            TypeError: not a tensor; a dtype the backend cannot sum.
            ValueError: a device type the backend does not take; non-contiguous memory; a
                dim 0 the number of ranks does not divide (when cut into per-rank blocks).
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type not in self.devices:
            raise ValueError(f"{self.name} takes {', '.join(self.devices)} tensors; "
                             f"got one on {tensor.device}")
        if not tensor.is_contiguous():
            raise ValueError(f"{self.name}: communication buffers must be contiguous")
        if reduce and self.reduce_dtypes is not None and tensor.dtype not in self.reduce_dtypes:
            raise TypeError(f"{self.name} cannot sum {tensor.dtype}; it sums "
                            f"{', '.join(str(d) for d in self.reduce_dtypes)}")
        if blocks and (tensor.dim() == 0 or tensor.shape[0] % self.size != 0):
            raise ValueError(f"dim 0 of shape {tuple(tensor.shape)} must be a multiple of the "
                             f"{self.size} ranks")

    def _check_peer(self, peer: int, label: str, distinct: bool = False) -> None:
        if not 0 <= peer < self.size or (distinct and peer == self.rank):
            raise ValueError(f"{label}={peer} is not a valid peer of rank {self.rank} "
                             f"in a group of {self.size}")

    @staticmethod
    def _check_out(out: torch.Tensor, like: torch.Tensor, shape,
                   same_allowed: bool = False) -> torch.Tensor:
        """``out`` for an input ``like``: a contiguous tensor of ``shape`` and ``like``'s dtype
        and device, sharing no memory with ``like`` (``same_allowed``: except being ``like``'s
        very memory, an in-place all_reduce); a partial overlap would be read after it is
        written, differently per backend.

        Raises:
            ValueError: another shape, dtype or device, non-contiguous, or overlapping.
        """
        if (tuple(out.shape) != tuple(shape) or out.dtype != like.dtype
                or out.device != like.device or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {like.dtype} tensor of shape "
                             f"{tuple(shape)} on {like.device}; got {out.dtype} "
                             f"{tuple(out.shape)} on {out.device}")
        start, out_start = like.data_ptr(), out.data_ptr()
        end, out_end = start + like.nbytes, out_start + out.nbytes
        if out_start < end and start < out_end and not (
                same_allowed and (out_start, out_end) == (start, end)):
            raise ValueError("out must not overlap the input in memory"
                             + (" (it may be the input itself)" if same_allowed else ""))
        return out

    def _new_or_checked(self, out, like, shape) -> torch.Tensor:
        if out is None:
            return torch.empty(shape, dtype=like.dtype, device=like.device)
        return self._check_out(out, like, shape)

    # Execution.
    def _launch(self, label: str, op, src: torch.Tensor, dst: torch.Tensor, stream,
                async_op: bool, reads_in: bool = True, reads_out: bool = False,
                writes_out: bool = True, collective: bool = True):
        """Run ``op(flat_src, flat_dst)`` under this backend's execution model, inside the
        NVTX range ``"<backend> <label>"`` (e.g. ``nccl all_reduce``).

        A synchronous host-driven collective first waits for this communicator's pending
        asynchronous work; point-to-point calls do not, so an asynchronous ``send`` can
        overlap a synchronous ``recv``. A collective of empty tensors moves nothing: once
        the ranks have agreed on the call, it returns ``dst`` (every rank alike, so a layer
        issues as many collectives whatever its ranks' chunks hold)."""
        if stream is not None and not src.is_cuda:  # before any rank communicates
            raise ValueError("stream= applies to CUDA tensors only")
        with annotate(f"{self.name} {label}"):
            if self._calls is not None:
                if collective:
                    self._agree(label, src, getattr(op, "root", None))
                else:
                    op = self._headed(label, op)
            if collective and src.numel() == 0:
                return Work(lambda: dst) if async_op else dst
            return self._execute(op, src, dst, stream, async_op, reads_in, reads_out,
                                 writes_out, collective)

    def _agree(self, label: str, tensor: torch.Tensor, root: int | None) -> None:
        """All ranks compare this collective call (operation, dtype, shape, root) before any
        data moves; a disagreement raises the same ValueError on every rank.

        Raises:
            ValueError: the ranks called different operations, dtypes, shapes or roots.
        """
        from mpi4py import MPI

        # Tuples of ints hash alike in every process (hash(None) need not: root -1 for none).
        sig = hash((_OPS[label], _DTYPES[tensor.dtype], tuple(tensor.shape),
                    -1 if root is None else root)) & _SIGN_BITS
        header = self._header
        header[0], header[1] = sig, -sig
        self._calls.Allreduce(MPI.IN_PLACE, header, op=MPI.MAX)
        if header[0] != sig or header[1] != -sig:
            calls = self._calls.allgather((label, str(tensor.dtype).replace("torch.", ""),
                                           tuple(tensor.shape), root))
            listing = "; ".join(f"rank {r}: {c[0]} {c[1]} {c[2]}"
                                + ("" if c[3] is None else f" root {c[3]}")
                                for r, c in enumerate(calls))
            raise ValueError(f"{self.name}: the ranks disagree on the call ({listing}); "
                             f"every rank must call the same operation on the same shape and "
                             f"dtype")

    def _headed(self, label: str, op):
        """``op`` (a send or recv) preceded by the call header: the sender sends its dtype and
        element count, the receiver compares them with its own and raises on a difference
        (before the data moves). Runs where the data moves, so asynchronous calls stay so."""
        def headed(src: torch.Tensor, dst: torch.Tensor) -> None:
            buf = dst if label == "recv" else src
            mine = np.array([_DTYPES[buf.dtype], buf.numel()], dtype=np.int64)
            if label == "send":
                self._p2p_calls.Send(mine, op.peer, _HEADER_TAG)
            else:
                theirs = np.empty(2, dtype=np.int64)
                self._p2p_calls.Recv(theirs, op.peer, _HEADER_TAG)
                if not np.array_equal(mine, theirs):
                    names = {i: str(d).replace("torch.", "") for d, i in _DTYPES.items()}
                    raise ValueError(
                        f"{self.name}: rank {self.rank} receives {mine[1]} "
                        f"{names[int(mine[0])]} elements from rank {op.peer}, which sends "
                        f"{theirs[1]} {names[int(theirs[0])]}")
            op(src, dst)

        return headed

    def _execute(self, op, src, dst, stream, async_op, reads_in, reads_out, writes_out,
                 collective):
        # A synchronous stream-ordered call without stream=, on the current device, runs on
        # the current stream as it is: torch's Stream objects and stream context cost
        # microseconds of host time.
        on_current = (self.stream_ordered and stream is None and not async_op
                      and src.get_device() == torch._C._cuda_getDevice())
        if src.is_cuda and not on_current:
            current = torch.cuda.current_stream(src.device)
            stream = current if stream is None else stream
            if stream != current:
                stream.wait_stream(current)  # the inputs were produced on the current stream
                for t in (src, dst):
                    t.record_stream(stream)  # the allocator must not reuse them meanwhile
        flat_src = src if src.dim() == 1 else src.view(-1)
        flat_dst = dst if dst.dim() == 1 else dst.view(-1)
        future = None
        if on_current:
            op(flat_src, flat_dst)
        elif self.stream_ordered:
            with torch.cuda.stream(stream):
                op(flat_src, flat_dst)
        else:
            run = functools.partial(self._run_host, op, flat_src, flat_dst, stream,
                                    reads_in, reads_out, writes_out)
            if not async_op:
                if collective and self._pending is not None:
                    self._pending.result()  # collectives keep call order across ranks
                    self._pending = None
                run()
            else:
                if (why := self.async_unavailable_reason()) is not None:
                    raise RuntimeError(f"{self.name}: async_op=True is not possible here: {why}")
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix=f"gemmlab-{self.name}")
                future = self._pending = self._executor.submit(_aborting, run)

        def wait() -> torch.Tensor:
            if future is not None:
                future.result()
            if on_current:
                return dst
            if dst.is_cuda and stream != torch.cuda.current_stream(dst.device):
                torch.cuda.current_stream(dst.device).wait_stream(stream)
            return dst
        return Work(wait) if async_op else wait()

    @torch.no_grad()  # data movement only; on the worker thread grad mode would be on
    def _run_host(self, op, src, dst, stream, reads_in, reads_out, writes_out) -> None:
        """Run a host-driven op; stage CUDA tensors through pinned memory when needed."""
        if not src.is_cuda or self.device_buffers:
            if src.is_cuda:
                stream.synchronize()  # the transport reads device memory outside any stream
            op(src, dst)
            return
        same = src.data_ptr() == dst.data_ptr()
        # The device and stream are set here: this may run on the worker thread.
        with torch.cuda.device(src.device), torch.cuda.stream(stream):
            host_src, host_dst = self._stage(src, dst, same)
            if reads_in or same:
                host_src.copy_(src, non_blocking=True)
            if reads_out and not same:
                host_dst.copy_(dst, non_blocking=True)
            stream.synchronize()
            op(host_src, host_dst)
            if writes_out:
                dst.copy_(host_dst, non_blocking=True)
                self._staging.copied_back = torch.cuda.Event()
                self._staging.copied_back.record(stream)

    def _stage(self, src, dst, same: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Pinned host buffers shaped like ``src`` and ``dst``, reused from call to call by
        this thread: allocating pinned memory takes milliseconds per call, longer than the
        copies themselves. Waits until the previous copy back out of them has finished."""
        local = self._staging
        if getattr(local, "copied_back", None) is not None:
            local.copied_back.synchronize()
        n_src, n_dst = src.numel() * src.element_size(), dst.numel() * dst.element_size()
        offset = -(-n_src // 64) * 64  # dst starts 64-byte aligned after src
        need = n_src if same else offset + n_dst
        if getattr(local, "pinned", None) is None or local.pinned.numel() < need:
            local.pinned = torch.empty(need, dtype=torch.uint8, pin_memory=True)
        host_src = local.pinned[:n_src].view(src.dtype)
        host_dst = host_src if same else local.pinned[offset:offset + n_dst].view(dst.dtype)
        return host_src, host_dst


class _Op:
    """A data movement ``fn(src, dst)`` with the root or peer it involves (for the checks)."""

    __slots__ = ("fn", "root", "peer")

    def __init__(self, fn, root: int | None = None, peer: int | None = None):
        self.fn, self.root, self.peer = fn, root, peer

    def __call__(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.fn(src, dst)


def _aborting(run: Callable[[], None]) -> None:
    """``run()`` on the worker thread; if it fails, the job is aborted (``tp.mpi.abort``,
    when installed): the other ranks are inside the same operation and would wait forever,
    even if this handle is never waited on. Without it, ``wait()`` raises the error."""
    try:
        run()
    except BaseException as exc:
        from ..mpi import abort  # imports mpi4py.MPI: only on this path

        abort("".join(traceback.format_exception(exc)))
        raise
