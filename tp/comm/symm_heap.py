"""Symmetric heaps for the ``symm`` communicator: every rank owns one buffer of the same size
and holds a view of every peer's buffer, so a rank reads (and writes) peers' memory with
plain tensor copies, and the ranks only need a barrier between writing and reading.

The interface ``symm.py``'s collectives are written over (both heaps provide it):

- ``peer(r)``: a flat ``torch.uint8`` tensor of ``capacity`` bytes viewing rank r's buffer
  (r == rank: this rank's own), on this heap's device; 64-byte aligned.
- ``barrier()``: collective; every rank's writes to its buffer before the barrier are
  visible to every rank after it, and every read of a peer's buffer issued before it has
  finished before anything after it writes.
- ``begin()`` / ``end()``: around each operation (stream-ordered heaps order the operations
  of all streams on the one buffer; no-ops on the host).
- ``one_shot_all_reduce(src, dst)`` / ``one_shot_reduce_scatter(src, dst)``: the whole
  one-shot algorithm as one kernel per piece where the heap has one (``IpcHeap``: fp32,
  fp16, bf16); ``copy_engine_all_gather(src, dst)``: the all-gather by copy engine
  (``IpcHeap``, every dtype). False, having done nothing, where the heap has no such path
  (the caller runs the algorithm itself).
- ``capacity`` (bytes), ``rank``, ``size``, ``device``, ``devices`` (the torch device types
  whose tensors it serves), ``stream_ordered`` (see ``base.py``), and ``close()``
  (collective).

``SharedWindowHeap`` (CPU): an MPI-3 shared-memory window. ``IpcHeap`` (GPU): ``cudaMalloc``
buffers exchanged as CUDA IPC handles, signalled by a tiny spin kernel on the current stream.
Both need every rank of the communicator on one node (shared memory, CUDA IPC).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from backends.cuda import KernelArgs

from .base import raw_stream

# Bytes per rank; larger messages go in pieces, each paying the algorithm's barriers again. On
# GPUs 64 MiB: on 2 H200s it raised busbw at 64-256 MiB from 154-155 to 198-215 GB/s
# (all_gather) and, with the reduction grid below, from 125-126 to 221-225 (reduce_scatter)
# and 179-181 to 265-268 (one-shot all_reduce) against 8 MiB and 64 x 512 threads
# (bench/results/symm-bandwidth-2xh200/).
HOST_CAPACITY, GPU_CAPACITY = 8 << 20, 64 << 20
_ALIGN = 64  # every view starts 64-byte aligned (a cache line; any dtype's alignment)


def _same_node(comm, who: str):
    """``comm``'s ranks on this node, ordered as in ``comm`` (a new communicator).

    Collective over ``comm``. Raises ValueError on every rank when ``comm`` spans several
    nodes: either every node's group is smaller than ``comm`` or none is, so all ranks agree.
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    if node.Get_size() != comm.Get_size():
        found = node.Get_size()
        node.Free()
        raise ValueError(f"{who} needs every rank of the communicator on one node "
                         f"(shared memory); this node has {found} of its {comm.Get_size()} "
                         f"ranks")
    return node


class SharedWindowHeap:
    """Host memory shared by the ranks of one node: an MPI-3 shared-memory window.

    ``MPI.Win.Allocate_shared`` gives each rank a segment of one shared allocation and
    ``Win.Shared_query(r)`` the address of rank r's segment in this process (MPI-3.1, sec.
    11.2.3); each is wrapped zero-copy as numpy, then torch. Shared windows follow the unified
    memory model (sec. 11.4, checked here), where loads and stores reach the other processes
    directly; ``barrier()`` is ``Win_sync``, ``Barrier``, ``Win_sync``: each ``MPI_Win_sync``
    is a memory barrier between this process's accesses and the window (sec. 11.5.4), the
    ``MPI_Barrier`` orders the processes. ``Win_sync`` is valid in a passive-target epoch, so
    one ``Lock_all`` epoch stays open for the window's life.
    """

    devices = ("cpu",)
    stream_ordered = False

    def __init__(self, comm, capacity: int = HOST_CAPACITY):
        """Collective over mpi4py ``comm``; ``capacity``: bytes per rank (>= 64).

        Raises:
            ValueError: ranks of ``comm`` on more than one node; a capacity under 64 bytes.
        """
        from mpi4py import MPI

        if capacity < _ALIGN:
            raise ValueError(f"symm: capacity must be >= {_ALIGN} bytes; got {capacity}")
        self.node = _same_node(comm, "symm on CPU")
        self.rank, self.size = self.node.Get_rank(), self.node.Get_size()
        self.capacity, self.device = capacity, torch.device("cpu")
        # _ALIGN extra bytes: each segment is used from its first 64-byte boundary on.
        self.win = MPI.Win.Allocate_shared(capacity + _ALIGN, 1, comm=self.node)
        if self.win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:
            self.win.Free()
            self.node.Free()
            raise RuntimeError("symm: this MPI's shared windows use the separate memory "
                               "model; plain loads and stores need the unified one")
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self._peers = []
        for r in range(self.size):
            raw = np.frombuffer(self.win.Shared_query(r)[0], dtype=np.uint8)
            # Mappings are page aligned, so the offset to 64 bytes is the same in every process.
            skip = -raw.ctypes.data % _ALIGN
            self._peers.append(torch.from_numpy(raw[skip:skip + capacity]))
        self.barrier()  # no rank uses a buffer before every rank has mapped them all

    def peer(self, r: int) -> torch.Tensor:
        return self._peers[r]

    def begin(self) -> None:
        """Nothing: host-driven operations already run one at a time, in call order."""

    def end(self) -> None:
        """Nothing (see ``begin``)."""

    def one_shot_all_reduce(self, src: torch.Tensor, dst: torch.Tensor) -> bool:
        """False: no kernel on the host (the module doc's interface)."""
        return False

    one_shot_reduce_scatter = copy_engine_all_gather = one_shot_all_reduce

    def barrier(self) -> None:
        self.win.Sync()
        self.node.Barrier()
        self.win.Sync()

    def close(self) -> None:
        """Free the window (collective over the ranks)."""
        self._peers = []
        self.win.Unlock_all()
        self.win.Free()
        self.node.Free()


def ipc_unavailable_reason() -> str | None:
    """Why ``IpcHeap`` cannot be used here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import cupy  # noqa: F401
    except ImportError as exc:
        return f"CuPy is not importable ({exc})"
    return None


# Rank ``rank`` advances its barrier count (a device-side counter after the flags of its own
# header), writes the new count, ``epoch``, into its slot of every peer's header (one thread
# per peer), then waits until every peer's slot in its own header has reached ``epoch``. The
# count lives on the GPU, not in the launch's arguments, so a barrier captured into a CUDA
# graph takes the next epoch at every replay, in step with the eager barriers around it. The
# fences make the rank's earlier writes (everything before the kernel on its stream) visible
# before its flag, and the peers' before what follows the kernel (release, then acquire, at
# system scope because the peers are other processes, possibly on other GPUs). Slots only
# grow, so the comparison is ">= epoch" (a fast peer may already be at the next barrier),
# written as a signed difference so that it survives the 32-bit wrap-around.
_SIGNAL_AND_WAIT = r"""
extern "C" __global__ void signal_and_wait(const unsigned long long* headers, int rank,
                                           int size) {
    int peer = threadIdx.x;
    volatile unsigned int* mine = (volatile unsigned int*)headers[rank];
    unsigned int epoch = mine[size] + 1;
    __syncthreads();  // every thread has read the count before it moves
    if (peer == 0) mine[size] = epoch;
    if (peer >= size) return;
    __threadfence_system();
    ((volatile unsigned int*)headers[peer])[rank] = epoch;
    while ((int)(mine[peer] - epoch) < 0) {
    }
    __threadfence_system();
}
"""


# The all-gather copies its own block on a side stream from this many bytes per rank on: on 2
# H200s that raised busbw at 64 MiB-1 GiB from 180-201 to 200-217 GB/s (call time), and at 1-16
# MiB the three more host calls cost more than the copy saved (61-66 against 41-57 us per call;
# bench/results/comm-2xh200-all/ against comm-2xh200-all-gather-side/).
SIDE_COPY_MIN_BYTES = 32 << 20

# The one-shot reduction kernels (``symm_reduce.cu``): their launch shape and the flag area
# they keep in every rank's header (flags[block][rank], then two counters), in bytes. A
# launch takes up to one block per SM (at most REDUCE_MAX_BLOCKS): reading peers' memory
# over NVLink needs many loads in flight (the measurements at GPU_CAPACITY above: 132 x 1024
# threads and 264 x 512 within 2.2% of each other, 64 x 512 20-27% slower).
REDUCE_MAX_BLOCKS, REDUCE_MAX_RANKS, REDUCE_THREADS = 256, 8, 1024
_REDUCE_DEFINES = (f"-DSYMM_MAX_RANKS={REDUCE_MAX_RANKS}", f"-DSYMM_THREADS={REDUCE_THREADS}")
_REDUCE_FLAG_BYTES = 4 * REDUCE_MAX_BLOCKS * REDUCE_MAX_RANKS
_REDUCE_AREA = -(-(_REDUCE_FLAG_BYTES + 8) // 256) * 256
_REDUCE_SOURCE = Path(__file__).with_name("symm_reduce.cu")
# dtype -> (its name in the kernels' names, elements per 16-byte load)
_REDUCE_DTYPES = {torch.float32: ("fp32", 4), torch.float16: ("fp16", 8),
                  torch.bfloat16: ("bf16", 8)}
_REDUCE_KERNELS = [(name, width) for name, vec in _REDUCE_DTYPES.values() for width in (vec, 1)]


class IpcHeap:
    """GPU memory of every rank mapped into every rank through CUDA IPC (one node).

    Each rank ``cudaMalloc``s a header of flags (the barrier's, one int32 per rank; the
    reduction kernels', per block and rank) followed by its ``capacity`` bytes: a buffer of
    its own allocation, so its IPC handle starts at the buffer (a pointer inside torch's
    caching allocator would export the whole block). The
    handles (``cudaIpcGetMemHandle``) are exchanged with ``allgather`` and opened with
    ``cudaIpcOpenMemHandle`` (peer access enabled lazily; a process cannot open its own
    handle, so its own buffer is used directly). Every pointer is wrapped through DLPack as a
    ``torch.uint8`` tensor on this rank's device, so ``dst.copy_(heap.peer(r))`` is a
    ``cudaMemcpyAsync`` (copy engine) and sums read peers' memory in place, on torch's current
    stream. ``barrier()`` launches ``signal_and_wait`` on that stream: no host round trip, one
    epoch per barrier. Ranks may share a GPU (IPC handles open in other processes on the same
    device); ranks on different GPUs need peer access between them (NVLink or PCIe P2P). No
    NVLink multicast is used.
    """

    devices = ("cuda",)
    stream_ordered = True

    def __init__(self, comm, device: torch.device, capacity: int = GPU_CAPACITY):
        """Collective over mpi4py ``comm``; ``device``: this rank's GPU; ``capacity``: bytes
        per rank.

        Raises:
            RuntimeError: no GPU or no CuPy (``ipc_unavailable_reason``).
            ValueError: ranks of ``comm`` on more than one node; a capacity under 64 bytes.
        """
        if (why := ipc_unavailable_reason()) is not None:
            raise RuntimeError(f"symm: {why}")
        if capacity < _ALIGN:
            raise ValueError(f"symm: capacity must be >= {_ALIGN} bytes; got {capacity}")
        import cupy

        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.comm = _same_node(comm, "symm on GPU")
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.capacity, self.device = capacity, device
        # The header: the barrier's int32 flags, one per rank, then this rank's barrier
        # count, padded to 256 bytes; then the reduction kernels' flag area.
        self._barrier_bytes = -(-4 * (self.size + 1) // 256) * 256
        self._header = self._barrier_bytes + _REDUCE_AREA
        nbytes = self._header + capacity
        runtime = cupy.cuda.runtime
        self._runtime, self._driver = runtime, cupy.cuda.driver  # no import per call
        self._opened: list[int] = []
        with cupy.cuda.Device(device.index):
            self._own = runtime.malloc(nbytes)
            runtime.memset(self._own, 0, self._header)  # every flag 0 before any peer writes
            runtime.deviceSynchronize()
            handles = self.comm.allgather(bytes(runtime.ipcGetMemHandle(self._own)))
            bases = []
            for r, handle in enumerate(handles):
                if r == self.rank:
                    bases.append(self._own)
                else:
                    self._opened.append(runtime.ipcOpenMemHandle(handle))
                    bases.append(self._opened[-1])
            self._headers = cupy.asarray(np.array(bases, dtype=np.uint64))
            self._kernel = cupy.RawKernel(_SIGNAL_AND_WAIT, "signal_and_wait")
            self._peers = [self._wrap(base + self._header, capacity) for base in bases]
            self._buffers = [base + self._header for base in bases]  # device addresses
            # The reduction kernels' tables: every rank's buffer and flag area.
            self._data = cupy.asarray(np.array(self._buffers, np.uint64))
            self._flags = cupy.asarray(np.array([b + self._barrier_bytes for b in bases],
                                                np.uint64))
        counters = self._own + self._barrier_bytes + _REDUCE_FLAG_BYTES
        # cuLaunchKernel's parameters, built once: a launch rewrites src to chunks only.
        self._reduce_args = KernelArgs([self._data.data.ptr, self._flags.data.ptr, counters,
                                        0, 0, 0, 0, 0, self.rank, self.size])
        self._reduce_module = None  # loaded at the first reduction (``_reduce_function``)
        self._reduce_blocks = min(REDUCE_MAX_BLOCKS,
                                  torch.cuda.get_device_properties(device).multi_processor_count)
        self._reduce_functions: dict[tuple[str, int], int] = {}
        self._barrier_args = KernelArgs([self._headers.data.ptr, self.rank, self.size])
        with cupy.cuda.Device(device.index):
            self._barrier_function = self._kernel.kernel.ptr  # compiled here, once
            # The end of the previous operation (see ``begin``); raw handles, because torch's
            # stream and event objects cost microseconds of host time per call.
            self._last = runtime.eventCreateWithFlags(runtime.eventDisableTiming)
            # The all-gather's own block goes on a stream of its own (``copy_engine_all_gather``).
            self._own_stream = runtime.streamCreateWithFlags(runtime.streamNonBlocking)
            self._fork, self._join = (runtime.eventCreateWithFlags(runtime.eventDisableTiming)
                                      for _ in range(2))
        self._last_captured = False  # whether it was recorded in a CUDA graph capture
        self.comm.Barrier()  # nobody signals before every rank has opened every buffer

    def _wrap(self, ptr: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` at device pointer ``ptr`` as a torch uint8 tensor on this rank's device
        (DLPack carries CuPy's device id; ``__cuda_array_interface__`` would make torch ask the
        pointer, which names the peer's GPU)."""
        import cupy

        memory = cupy.cuda.UnownedMemory(ptr, nbytes, self, device_id=self.device.index)
        array = cupy.ndarray((nbytes,), dtype=cupy.uint8,
                             memptr=cupy.cuda.MemoryPointer(memory, 0))
        tensor = torch.from_dlpack(array)
        if tensor.device != self.device:
            raise RuntimeError(f"symm: a peer buffer came out on {tensor.device}, not "
                               f"{self.device}")
        return tensor

    def peer(self, r: int) -> torch.Tensor:
        return self._peers[r]

    def begin(self) -> None:
        """Start of an operation on the current stream: wait for the previous one, which may
        have run on another stream (``stream=``), since all use the same buffer. Not across
        the edge of a CUDA graph capture: a capture cannot wait on work outside it, and its
        replays are ordered by the stream they run on."""
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing == self._last_captured:  # an event never recorded is waited for at once
            self._runtime.streamWaitEvent(raw_stream(self.device.index), self._last, 0)

    def end(self) -> None:
        """End of an operation on the current stream (what the next ``begin`` waits for)."""
        self._last_captured = torch.cuda.is_current_stream_capturing()
        self._runtime.eventRecord(self._last, raw_stream(self.device.index))

    def one_shot_all_reduce(self, src: torch.Tensor, dst: torch.Tensor) -> bool:
        """``dst`` = the sum over the ranks of ``src`` by ``symm_reduce.cu``'s kernel: one
        launch per piece of at most ``capacity`` bytes on the current stream (copy in,
        barrier, sum in rank order, fp16/bf16 in fp32 rounded once, barrier). ``src`` and
        ``dst`` are flat and contiguous on this heap's device; ``dst`` may be ``src``.

        Returns False, having done nothing, when the kernel does not apply (``_reduce``).
        Collective, in the same order on every rank; not for concurrent calls from several
        threads (the launch parameters are shared)."""
        return self._reduce(src, dst, 1)

    def one_shot_reduce_scatter(self, src: torch.Tensor, dst: torch.Tensor) -> bool:
        """``dst`` (n elements) = the sum over the ranks of block ``rank`` of ``src`` (P x n
        elements), as ``one_shot_all_reduce`` does it: each piece of every block is copied
        in, and block ``rank`` of every buffer summed, by one launch. Returns False, having
        done nothing, when the kernel does not apply (``_reduce``)."""
        return self._reduce(src, dst, self.size)

    def copy_engine_all_gather(self, src: torch.Tensor, dst: torch.Tensor) -> bool:
        """``dst`` = every rank's ``src`` in rank order (flat, contiguous, any dtype), by
        ``cudaMemcpyAsync`` on the current stream, so the copy engines move the data and no
        SM is taken: per piece of at most ``capacity`` bytes, ``src`` is copied into this
        rank's buffer, barrier, every peer's buffer is pulled into its block of ``dst``,
        barrier. From ``SIDE_COPY_MIN_BYTES`` of ``src`` on, this rank's own block of ``dst``
        is copied from ``src`` meanwhile, on a stream of the heap's that forks from the
        current one and joins it at the end (another copy engine; the join is captured with
        the rest in a CUDA graph); below, in turn with the pulls. Returns True (the
        caller's algorithm is not needed). Collective, in the same order on every rank."""
        device = self.device.index
        if torch._C._cuda_getDevice() != device:
            with torch.cuda.device(device):
                return self.copy_engine_all_gather(src, dst)
        nbytes, src_ptr, dst_ptr = src.numel() * src.element_size(), src.data_ptr(), dst.data_ptr()
        runtime, stream = self._runtime, raw_stream(device)
        copy, default = runtime.memcpyAsync, runtime.memcpyDefault  # direction from the UVA
        aside = nbytes >= SIDE_COPY_MIN_BYTES
        if aside:
            runtime.eventRecord(self._fork, stream)
            runtime.streamWaitEvent(self._own_stream, self._fork, 0)
            copy(dst_ptr + self.rank * nbytes, src_ptr, nbytes, default, self._own_stream)
            runtime.eventRecord(self._join, self._own_stream)
        for a in range(0, nbytes, self.capacity):
            piece = min(self.capacity, nbytes - a)
            copy(self._buffers[self.rank], src_ptr + a, piece, default, stream)
            self.barrier()
            for q, buffer in enumerate(self._buffers):
                if q != self.rank or not aside:
                    copy(dst_ptr + q * nbytes + a, src_ptr + a if q == self.rank else buffer,
                         piece, default, stream)
            self.barrier()
        if aside:
            runtime.streamWaitEvent(stream, self._join, 0)
        return True

    def _reduce(self, src: torch.Tensor, dst: torch.Tensor, chunks: int) -> bool:
        """The launches of ``one_shot_all_reduce`` (``chunks`` 1) and
        ``one_shot_reduce_scatter`` (``chunks`` P); False when the kernel does not apply: a
        dtype other than fp32, fp16 or bf16, or more than ``REDUCE_MAX_RANKS`` ranks."""
        kind = _REDUCE_DTYPES.get(src.dtype)
        if kind is None or self.size > REDUCE_MAX_RANKS:
            return False
        name, vec = kind
        size, n = src.element_size(), dst.numel()
        step, src_ptr, dst_ptr = self.capacity // (size * chunks), src.data_ptr(), dst.data_ptr()
        slots = self._reduce_args.slots
        for a in range(0, n, step):  # pieces by address: no tensor views on the hot path
            s, d, count = src_ptr + a * size, dst_ptr + a * size, min(step, n - a)
            # 16-byte loads need every chunk's start aligned: in src, dst and the buffer
            aligned = (s | d) % 16 == 0 and (chunks == 1 or (n | count) % vec == 0)
            width = vec if aligned else 1
            function = self._reduce_functions.get((name, width))
            if function is None:
                function = self._reduce_function(name, width)
            blocks = max(1, min(self._reduce_blocks, -(-count // width // REDUCE_THREADS)))
            slots[3], slots[4], slots[5], slots[6], slots[7] = s, n, d, count, chunks
            self._launch(function, blocks, REDUCE_THREADS, self._reduce_args)
        return True

    def _launch(self, function: int, blocks: int, threads: int, args: KernelArgs) -> None:
        """``cuLaunchKernel`` of ``function`` on the current stream of this heap's device."""
        device = self.device.index
        if torch._C._cuda_getDevice() != device:
            with torch.cuda.device(device):
                return self._launch(function, blocks, threads, args)
        self._driver.launchKernel(function, blocks, 1, 1, threads, 1, 1, 0,
                                  raw_stream(device), args.address, 0)

    def _reduce_function(self, name: str, width: int) -> int:
        """The CUfunction of the reduction kernel for dtype ``name`` and ``width`` elements
        per load (all of them compiled by NVRTC at the first call of the process)."""
        from backends.cuda import raw_module

        # Kept: the handles below are valid only while the module is loaded.
        self._reduce_module = raw_module(_REDUCE_SOURCE.read_text(), self.device.index,
                                         _REDUCE_DEFINES)
        for key in _REDUCE_KERNELS:
            kernel = self._reduce_module.get_function(f"symm_reduce_{key[0]}_v{key[1]}")
            self._reduce_functions[key] = kernel.kernel.ptr
        return self._reduce_functions[(name, width)]

    def barrier(self) -> None:
        self._launch(self._barrier_function, 1, self.size, self._barrier_args)

    def close(self) -> None:
        """Unmap the peers' buffers and free this rank's (collective over the ranks)."""
        import cupy

        runtime = cupy.cuda.runtime
        torch.cuda.synchronize(self.device)
        self.comm.Barrier()  # every rank has finished reading every buffer
        self._peers = []
        with cupy.cuda.Device(self.device.index):
            for event in (self._last, self._fork, self._join):
                runtime.eventDestroy(event)
            runtime.streamDestroy(self._own_stream)
            for ptr in self._opened:
                runtime.ipcCloseMemHandle(ptr)
            self.comm.Barrier()  # every mapping of this rank's buffer is closed
            runtime.free(self._own)
        self._opened = []
        self.comm.Free()


def open_heap(comm, device: torch.device, capacity: int | None = None):
    """The heap for tensors on ``device``: ``IpcHeap`` for CUDA, ``SharedWindowHeap`` else,
    of ``capacity`` bytes per rank (None: ``GPU_CAPACITY`` or ``HOST_CAPACITY``).

    Collective over mpi4py ``comm``. Raises as their constructors."""
    if device.type == "cuda":
        return IpcHeap(comm, device, GPU_CAPACITY if capacity is None else capacity)
    return SharedWindowHeap(comm, HOST_CAPACITY if capacity is None else capacity)
