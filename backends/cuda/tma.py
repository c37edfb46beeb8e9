"""TMA tensor maps for the kernels that read A and B through the tensor memory accelerator
(``09_wgmma.cu``), encoded by the CUDA driver's ``cuTensorMapEncodeTiled``.

A tensor map (``CUtensorMap``, 128 bytes) describes a 2-D row-major matrix in global memory:
its address, sizes, row stride and the box one copy moves, with the 128-byte swizzle wgmma
reads. The driver requires 16-byte aligned addresses and row strides (CUDA driver API,
"Tensor Map Object Management"); ``operands`` pads A or B into an aligned copy when they are
not. The two maps of a launch sit in one small device buffer the kernel receives as a pointer;
``LaunchMaps`` keeps a binding's buffers by A's and B's addresses (everything else a map
encodes is fixed by the binding), so a repeated call encodes and copies nothing.
``EpilogueMaps`` encodes the maps of D and C that ``10_wgmma_persistent.cu`` takes by value
(no device buffer, so a CUDA graph that captures a call with a fresh D holds that D's map).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections import OrderedDict

import torch

MAP_BYTES = 128  # sizeof(CUtensorMap)
BOX_N = 64  # columns of a B box: 128 bytes of 16-bit elements, the swizzle span
_ALIGN = 16  # bytes: global address and row strides of a tensor map
# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
_DATA_TYPES = {torch.float16: 6, torch.bfloat16: 9}
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3


@functools.cache
def _encode_tiled():
    """The driver's cuTensorMapEncodeTiled through ctypes (CuPy does not wrap it)."""
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % _ALIGN == 0 and t.stride(0) * t.element_size() % _ALIGN == 0


def operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` (M, K) and ``b`` (K, N), each as is when a tensor map can describe it, else as a
    copy whose rows are zero-padded to a multiple of 16 bytes (the logical sizes the maps
    declare stay M, K, N, so the padding is never read)."""
    def fit(t: torch.Tensor) -> torch.Tensor:
        if _aligned(t):
            return t
        # A new row-major tensor: F.pad of nothing would clone t's strides, and a one-row
        # view may have any row stride (a (1, K) transpose has stride (1, 1)).
        per_row = _ALIGN // t.element_size()
        padded = t.new_zeros(t.shape[0], t.shape[1] + -t.shape[1] % per_row)
        padded[:, :t.shape[1]] = t
        return padded

    return fit(a), fit(b)


def encode_2d(address: int, dtype: torch.dtype, rows: int, cols: int, row_bytes: int,
              box_rows: int, box_cols: int) -> bytes:
    """The tensor map of a ``rows`` x ``cols`` row-major fp16/bf16 matrix at ``address`` whose
    rows are ``row_bytes`` apart (both multiples of 16), copied in boxes of ``box_rows`` x
    ``box_cols`` elements with the 128-byte swizzle; elements outside the matrix read as
    zeros.

    Raises:
        RuntimeError: the driver refuses the map (its CUresult in the message).
    """
    raw = ctypes.create_string_buffer(MAP_BYTES + 64)
    aligned = -(-ctypes.addressof(raw) // 64) * 64  # CUtensorMap is 64-byte aligned
    dims = (ctypes.c_uint64 * 2)(cols, rows)  # innermost first
    strides = (ctypes.c_uint64 * 1)(row_bytes)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    status = _encode_tiled()(aligned, _DATA_TYPES[dtype], 2, address, dims, strides, box,
                             element_strides, 0, _SWIZZLE_128B, _L2_PROMOTION_256B, 0)
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for a "
                           f"{rows}x{cols} {dtype} matrix, box {box_rows}x{box_cols}")
    return ctypes.string_at(aligned, MAP_BYTES)


def gemm_maps(a: torch.Tensor, b: torch.Tensor, k: int, n: int, block_m: int,
              block_k: int, keep: list | None = None) -> torch.Tensor:
    """A uint8 device tensor holding the tensor maps of A, (M, ``k``) in boxes of ``block_m``
    x ``block_k``, and of B, (``k``, ``n``) in boxes of ``block_k`` x ``BOX_N``; ``a`` and
    ``b`` as ``operands`` returns them (their columns may extend past ``k`` and ``n``).

    ``keep``: while a CUDA graph is captured, the copy to the device comes from pinned host
    memory (a pageable one cannot be captured), which every replay reads again: it is
    appended to ``keep``, which the caller holds as long as the graph may replay."""
    size = a.element_size()
    maps = (encode_2d(a.data_ptr(), a.dtype, a.shape[0], k, a.stride(0) * size, block_m,
                      block_k) +
            encode_2d(b.data_ptr(), b.dtype, k, n, b.stride(0) * size, block_k, BOX_N))
    host = torch.frombuffer(bytearray(maps), dtype=torch.uint8)
    if keep is None:
        return host.to(a.device)
    host = host.pin_memory()
    keep.append(host)
    return host.to(a.device, non_blocking=True)


class LaunchMaps:
    """The operands' addresses and tensor-map buffer of one binding's launches (one shape,
    dtype and strides, so only A's and B's addresses vary between calls, aligned or not).

    ``launch_maps(a, b, stream)`` returns ``(A's address, B's address, maps address)``: of
    ``a`` and ``b`` as ``operands`` gives them, and of the maps as ``gemm_maps`` encodes
    them. The buffers of the last ``kept`` address pairs encoded whose operands are used as
    they are (the aligned case) are kept, so calling again on the same tensors on the
    default stream costs two ``data_ptr`` reads and a dict look-up; padded operands are new
    copies, encoded per call (the copies and their buffer live until the same thread's next
    such call, which is after its launch has been queued: per thread, as a binding may
    launch from several).

    ``stream``: the raw CUDA stream of the launch. On another than the legacy default stream
    (0, which cannot be captured) a call asks whether a CUDA graph is being captured; one
    made during a capture keeps what the captured launch reads (the maps buffer, padded
    copies, the pinned source of the maps' copy; never the caller's own operands) for the
    life of this binding: the graph reads them at every replay, after any number of later
    calls. Each capture of a new or padded pair adds its own, as each graph needs them.
    """

    def __init__(self, k: int, n: int, block_m: int, block_k: int, kept: int = 8):
        self.k, self.n, self.block_m, self.block_k, self.kept = k, n, block_m, block_k, kept
        # (A's, B's address) -> (maps buffer, (A's, B's, the buffer's address))
        self._maps: OrderedDict[tuple[int, int], tuple[torch.Tensor, tuple[int, int, int]]] = (
            OrderedDict())
        self._padded = threading.local()  # .kept: (maps, padded A, padded B)
        # Read by captured graphs, never released: device tensors by address, pinned sources.
        self._captured: dict[int, torch.Tensor] = {}
        self._pinned: list[torch.Tensor] = []

    def __call__(self, a: torch.Tensor, b: torch.Tensor, stream: int = 0
                 ) -> tuple[int, int, int]:
        key = (a.data_ptr(), b.data_ptr())
        hit = self._maps.get(key)
        capturing = stream != 0 and torch.cuda.is_current_stream_capturing()
        if hit is not None:
            if capturing:
                self._captured[hit[1][2]] = hit[0]
            return hit[1]
        pa, pb = operands(a, b)
        maps = gemm_maps(pa, pb, self.k, self.n, self.block_m, self.block_k,
                         keep=self._pinned if capturing else None)
        addresses = (pa.data_ptr(), pb.data_ptr(), maps.data_ptr())
        if capturing:
            self._captured.update((t.data_ptr(), t) for t, own in ((maps, None), (pa, a),
                                                                   (pb, b)) if t is not own)
        if pa is a and pb is b:
            self._maps[key] = (maps, addresses)
            if len(self._maps) > self.kept:
                self._maps.popitem(last=False)
        else:
            self._padded.kept = (maps, pa, pb)
        return addresses


EPILOGUE_BOX = 64  # rows and columns of a D or C box: 128 bytes of 16-bit elements per row


class EpilogueMaps:
    """The ``map_d`` and ``map_c`` kernel parameters of one binding of a kernel that stores D
    and prefetches a full C through tensor maps (``10_wgmma_persistent.cu``): 256 bytes, D's
    map then C's, both (M, N) in boxes of ``EPILOGUE_BOX`` x ``EPILOGUE_BOX`` with the
    128-byte swizzle. Each is encoded only where the kernel reads it, under the kernel's own
    conditions, and is zeros otherwise: D's when N % 8 == 0 and D is 16-byte aligned (its
    rows then are), C's when that holds and C is a full, 16-byte aligned (M, N) matrix. The
    last ``kept`` (D, C) address pairs' maps are kept, so a repeated call encodes nothing.

    Args:
        dtype: float16 or bfloat16.
        m, n: D's shape.
        full_c: the binding's C is a full (M, N) matrix (not None, not a bias).
    """

    def __init__(self, dtype: torch.dtype, m: int, n: int, full_c: bool, kept: int = 8):
        self.dtype, self.m, self.n, self.full_c = dtype, m, n, full_c
        self._maps = functools.lru_cache(maxsize=kept)(self._encode)

    def __call__(self, d: torch.Tensor, c: torch.Tensor | None) -> bytes:
        return self._maps(d.data_ptr(), c.data_ptr() if c is not None and self.full_c else 0)

    def _encode(self, d_address: int, c_address: int) -> bytes:
        zeros = bytes(MAP_BYTES)
        row_bytes = self.n * self.dtype.itemsize

        def encode(address: int) -> bytes:
            return encode_2d(address, self.dtype, self.m, self.n, row_bytes, EPILOGUE_BOX,
                             EPILOGUE_BOX)

        stage = self.n % 8 == 0 and d_address % _ALIGN == 0
        prefetch = stage and c_address != 0 and c_address % _ALIGN == 0
        return ((encode(d_address) if stage else zeros) +
                (encode(c_address) if prefetch else zeros))
