"""Raw CUDA C kernels of the ladder, compiled at run time by NVRTC through CuPy.

Each ``NN_name.cu`` file beside this module holds one kernel of the ladder with a header
comment saying what technique it adds. Tile sizes are compile-time macros (``BLOCK_M``,
``BLOCK_N``, ``BLOCK_K``, ``TM``, ``TN``) whose defaults in the file are the ones the
registry uses, so ``nvcc -arch=sm_90 -cubin NN_name.cu`` builds the same kernel.

Every kernel has the signature::

    (const elem_t* A, const elem_t* B, const elem_t* C, elem_t* D,
     int M, int N, int K, long long ldc, int relu)

with row-major contiguous A (M, K), B (K, N) and D (M, N); C is NULL, a full (M, N) matrix
(``ldc = N``) or a length-N bias (``ldc = 0``). ``elem_t`` (``common.cuh``) is float, or
``__half`` / ``__nv_bfloat16`` when the launcher compiles with ``-DGEMM_FP16`` /
``-DGEMM_BF16`` for 16-bit operands (accumulation stays fp32). A thread block computes a
``BLOCK_M x BLOCK_N`` tile of D, on a grid of ``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))``
blocks; it has ``THREADS`` threads along x when the kernel's parameters define ``THREADS``,
else ``(BLOCK_N // TN, BLOCK_M // TM)``. A kernel that needs more than the 48 KiB of static
shared memory declares ``extern __shared__`` memory and its size in bytes as
``extern "C" __constant__ int gemm_dynamic_smem``; the launcher reads it after compiling.

A kernel built with ``tma=True`` (``09_wgmma.cu``) uses sm_90a-only instructions (wgmma,
setmaxnreg), so it is compiled for ``sm_90a`` and runs on compute capability 9.0 GPUs only; it
reads A and B through TMA tensor maps (``backends/cuda/tma.py``) and takes a tenth argument,
``const unsigned long long* tmaps``: a device buffer with the two 128-byte maps. A kernel built
with ``epilogue_maps=True`` (``10_wgmma_persistent.cu``) takes ``void* workspace`` and
``unsigned long long token`` after ``tmaps`` (a ``STREAM_K`` build's, ``StreamKWorkspace``;
0 and 0 otherwise), and stores D and prefetches C through tensor maps, passed by value after
them as two 128-byte ``__grid_constant__`` parameters, ``map_d`` and ``map_c``
(``tma.EpilogueMaps``).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import itertools
import secrets
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from profiling.cuda_toolkit import toolkit_include_dirs

from ..context import bind_primary_context
from ..problem import Problem
from .sources import SOURCE_DIR, compile_options, declares_dynamic_smem
from .tma import MAP_BYTES

_MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, which runs over the tiles along M
_DTYPE_DEFINES = {torch.float32: (), torch.float16: ("-DGEMM_FP16",),
                  torch.bfloat16: ("-DGEMM_BF16",)}
MAX_THREADS = 1024  # CUDA's limit per thread block
# M, N and K reach the kernels as int, and a tile's row or column index runs up to a tile
# (256 at most) past them: both must stay below 2**31 (element offsets are 64-bit).
MAX_DIM = 2**31 - 1 - 1024


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """Why the CuPy-launched CUDA kernels cannot run here, or None when they can (asked once
    per process: gemm() checks it on every call)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import cupy  # noqa: F401  (the import is the check)
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); install gemmlab[cuda12] or gemmlab[cuda13]"
    return None


def _no_dependent_macros(params: dict[str, int]) -> dict[str, int]:
    return {}


@dataclass(frozen=True)
class CudaSpace:
    """The compile-time macros ``gemmlab tune`` sweeps for one CUDA C kernel.

    Attributes:
        macros: each swept macro and its values; the space is their Cartesian product.
        derive: from one combination, the macros that follow from it (e.g. ``THREADS`` from
            the block and warp tiles), added to it.
    """

    macros: dict[str, tuple[int, ...]]
    derive: Callable[[dict[str, int]], dict[str, int]] = _no_dependent_macros

    def candidates(self) -> list[dict[str, int]]:
        """Every combination of ``macros`` with its dependent macros, in order, less those
        with more than ``MAX_THREADS`` threads per block (``CudaKernel.threads``)."""
        configs = []
        for values in itertools.product(*self.macros.values()):
            params = dict(zip(self.macros, values))
            params |= self.derive(params)
            x, y = CudaKernel("", "", params).threads
            if x * y <= MAX_THREADS:
                configs.append(params)
        return configs


@dataclass(frozen=True)
class CudaKernel:
    """One ``.cu`` file of the ladder and the compile-time tile sizes it is built with.

    Args:
        source: file name in ``backends/cuda/``, e.g. ``"03_regblock.cu"``.
        name: the ``extern "C"`` kernel in it.
        params: macros passed as ``-DNAME=value``; must hold ``BLOCK_M`` and ``BLOCK_N``,
            may hold ``TM`` and ``TN`` (rows and columns of D per thread, default 1) or
            ``THREADS`` (a 1-D block of that many threads).
        dtypes: operand dtypes it is built for (float32, or float16 and bfloat16).
        tma: reads A and B through TMA tensor maps and needs sm_90a (see the module doc);
            ``params`` must then hold ``BLOCK_M`` and ``BLOCK_K``, the box of A.
        epilogue_maps: the kernel also takes the tensor maps of D and C by value
            (``tma.EpilogueMaps``; see the module doc); needs ``tma``.
        sm80: uses instructions of compute capability 8.0 (``cp.async``, bf16 tensor-core
            operations): steps 6-8.
        persistent: the kernel loops over the tiles itself: its grid is min(#SMs, #tiles)
            CTAs along x (``grid`` says how many tiles there are), or #SMs with ``STREAM_K``
            set in ``params`` (the tiles' k-tiles are shared out); with ``CLUSTER_M`` in
            ``params`` (the kernel's compile-time cluster size along M, ``__cluster_dims__``),
            CLUSTER_M x min(#SMs / CLUSTER_M, #cluster tiles), a cluster tile being CLUSTER_M
            tile rows by one tile column.
        space: the macros ``gemmlab tune`` searches (its candidates hold ``params``; the
            kernel's static_asserts reject what does not fit), or None: nothing to tune.
    """

    source: str
    name: str
    params: dict[str, int] = field(default_factory=dict)
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    tma: bool = False
    space: CudaSpace | None = None
    persistent: bool = False
    epilogue_maps: bool = False
    sm80: bool = False

    @property
    def arch_suffix(self) -> str:
        """``"a"`` when the kernel needs the arch-specific target (sm_90a), else ``""``."""
        return "a" if self.tma else ""

    @property
    def threads(self) -> tuple[int, int]:
        """Thread block shape (x, y)."""
        p = self.params
        if "THREADS" in p:
            return p["THREADS"], 1
        return p["BLOCK_N"] // p.get("TN", 1), p["BLOCK_M"] // p.get("TM", 1)

    def grid(self, m: int, n: int) -> tuple[int, int]:
        """Grid shape for an M x N output: one block per BLOCK_M x BLOCK_N tile."""
        p = self.params
        return -(-n // p["BLOCK_N"]), -(-m // p["BLOCK_M"])

    def launch_grid(self, m: int, n: int, device: int) -> tuple[int, int]:
        """The grid a launch on CUDA device ``device`` uses: ``grid``, or for a persistent
        kernel its CTAs along x (the ``persistent`` attribute)."""
        gx, gy = self.grid(m, n)
        if not self.persistent:
            return gx, gy
        if self.params.get("STREAM_K", 0):
            return _multiprocessors(device), 1
        cluster = self.params.get("CLUSTER_M", 1)
        return cluster * min(_multiprocessors(device) // cluster, gx * -(-gy // cluster)), 1

    def parameter_values(self, p: Problem) -> list[int]:
        """The values of the kernel's parameters before its by-value tensor maps for Problem
        ``p``, as ``KernelArgs`` takes them: zeros for the pointers (A, B, C, D), M, N, K,
        ldc and relu, then zeros for the tensor maps' buffer (``tma``) and the stream-K
        workspace and token (``epilogue_maps``)."""
        ldc = 0 if p.c != "full" else p.n
        return [0, 0, 0, 0, p.m, p.n, p.k, ldc, int(p.relu), *([0] if self.tma else []),
                *([0, 0] if self.epilogue_maps else [])]

    def defines(self, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
        """The ``-D`` compiler options that fix the tile sizes and the element type."""
        return (*(f"-D{k}={v}" for k, v in sorted(self.params.items())),
                *_DTYPE_DEFINES[dtype])

    def description(self) -> str:
        """The source file and the tile sizes as ``-D`` options, e.g. ``"03_regblock.cu
        -DBLOCK_K=8 -DBLOCK_M=128 -DBLOCK_N=128 -DTM=8 -DTN=8"``: how the backend's
        ``config()`` names the build that ran (``described`` reads it back)."""
        return " ".join((self.source, *self.defines()))

    def described(self, text: str) -> CudaKernel:
        """This kernel with the tile sizes that ``text`` names: a ``description()``, maybe
        followed by a note in parentheses (the backend's ``config()``, a bench row's
        ``config``).

        Raises:
            ValueError: ``text`` does not describe a build of this kernel's source file.
        """
        source, *defines = text.split(" (", 1)[0].split() or [""]
        if source != self.source:
            raise ValueError(f"{text!r} does not describe a build of {self.source}")
        params = {}
        for define in defines:
            macro, equals, value = define.removeprefix("-D").partition("=")
            if not define.startswith("-D") or not equals or not value.isdigit():
                raise ValueError(f"{text!r}: {define!r} is not a -DNAME=value tile size")
            params[macro] = int(value)
        return replace(self, params=params)

    def compiled(self, dtype: torch.dtype, device: int):
        """The compiled kernel (a ``cupy.RawKernel``-like function) and its dynamic shared
        memory in bytes, for ``dtype`` operands on ``device``."""
        return _compiled(self.source, self.name, self.defines(dtype), device, self.arch_suffix)

    def bind(self, p: Problem, record: list | None = None, tag: object = None):
        """The launch of D = act(A @ B + C) for Problem ``p``, on torch's current stream;
        each launch stores ``tag`` in ``record[0]`` when ``record`` is given (what ran, for
        ``Backend.config()``; stored here, a wrapper would add a Python call per launch).

        It takes contiguous CUDA tensors ``a`` (M, K), ``b`` (K, N), ``c`` (None, (M, N) or
        (N,)) and ``out`` (None or (M, N)) of ``p``'s dtype on ``p``'s device (``gemm()`` has
        checked all of that) and returns D. Everything that depends only on ``p`` is done
        here, once: compiling, the grid, the scalar arguments. A launch passes the pointers as
        integers (no copy; the launcher never owns the memory) to the CUDA driver's
        ``cuLaunchKernel`` (through CuPy's binding, with a ``KernelArgs`` buffer built here),
        or through PyCUDA inside ``use_launcher("pycuda")``.

        Raises:
            ValueError: M needs more than 65535 thread blocks along gridDim.y.
            RuntimeError: a ``tma`` kernel on a GPU that is not compute capability 9.0; at
                launch, the PyCUDA launcher on a stream other than the default one.
        """
        m, n, k = p.m, p.n, p.k
        device = p.device.index if p.device.index is not None else torch.cuda.current_device()
        grid = self.launch_grid(m, n, device)
        if grid[1] > _MAX_GRID_Y:
            raise ValueError(f"{self.name}: M={m} needs {grid[1]} blocks along gridDim.y "
                             f"(limit {_MAX_GRID_Y}) at BLOCK_M={self.params['BLOCK_M']}")
        if self.tma and (why := sm90a_unavailable_reason(device)) is not None:
            raise RuntimeError(f"{self.name}: {why}")
        import cupy
        from cupy.cuda import driver, runtime

        function, smem = self.compiled(p.dtype, device)
        handle = function.kernel.ptr  # the CUfunction of CuPy's RawKernel on this device
        values = self.parameter_values(p)
        blob_count = 2 if self.epilogue_maps else 0
        # One argument buffer per thread: a launch writes its pointers there, and the driver
        # reads them with the GIL released (a thread-local costs less than a lock). A
        # thread's first launch also binds the device's context to it (the tensor maps'
        # encoding and cuLaunchKernel need one).
        per_thread = threading.local()
        (gx, gy), (tx, ty) = grid, self.threads
        maps_of = epilogue_maps_of = stream_k = None
        if self.params.get("STREAM_K", 0):
            stream_k = StreamKWorkspace(self, gx, p.device)
        if self.tma:
            from .tma import EpilogueMaps, LaunchMaps

            maps_of = LaunchMaps(k, n, self.params["BLOCK_M"], self.params["BLOCK_K"])
            if self.epilogue_maps:
                epilogue_maps_of = EpilogueMaps(p.dtype, m, n, full_c=p.c == "full")
        template, empty_like = p.d_template, torch.empty_like
        raw_stream, get_device, launch_kernel = (torch._C._cuda_getCurrentRawStream,
                                                 runtime.getDevice, driver.launchKernel)

        def launch(a, b, c, out):
            try:
                args = per_thread.args
            except AttributeError:  # this thread's first launch of the binding
                bind_primary_context(device)
                args = per_thread.args = KernelArgs(values, blobs=blob_count)
            if record is not None:
                record[0] = tag
            if out is None:
                out = empty_like(template)
            stream = raw_stream(device)
            if maps_of is None:
                pointers = (a.data_ptr(), b.data_ptr(), 0 if c is None else c.data_ptr(),
                            out.data_ptr())
            else:
                a_ptr, b_ptr, maps = maps_of(a, b, stream)
                pointers = (a_ptr, b_ptr, 0 if c is None else c.data_ptr(), out.data_ptr(), maps)
                if stream_k is not None:  # held until the launch is queued
                    workspace, token = stream_k()
                    pointers += (workspace.data_ptr(), token)
            blobs = b"" if epilogue_maps_of is None else epilogue_maps_of(out, c)
            if _LAUNCHER.get() == "pycuda":
                from .pycuda_launch import launch as pycuda_launch

                # The values with the pointers written over theirs (the unused slots stay).
                pycuda_launch(self, p.dtype, device, grid,
                              (*pointers[:4], *values[4:9], *pointers[4:],
                               *values[len(pointers) + 5:]), blobs)
                return out
            args.set_pointers(pointers)
            if blobs:
                args.set_blobs(blobs)
            if get_device() == device:
                launch_kernel(handle, gx, gy, 1, tx, ty, 1, smem, stream, args.address, 0)
            else:
                with cupy.cuda.Device(device):
                    launch_kernel(handle, gx, gy, 1, tx, ty, 1, smem, stream,
                                  args.address, 0)
            return out

        return launch


@functools.cache
def _multiprocessors(device: int) -> int:
    """The SM count of CUDA device ``device``: a persistent kernel's CTAs."""
    return torch.cuda.get_device_properties(device).multi_processor_count


BLOB_BYTES = MAP_BYTES  # a by-value CUtensorMap parameter (``__grid_constant__``), 64-byte aligned


class KernelArgs:
    """The parameter array ``cuLaunchKernel`` reads a launch's arguments through: one 8-byte
    slot per kernel parameter, in order, and the array of the slots' addresses (CUDA driver
    API, "Execution Control"). Pointers and ``long long`` fill a slot; an ``int`` is read
    from its first 4 bytes, which on a little-endian host (x86-64, aarch64) hold the value.
    ``blobs`` more parameters of ``BLOB_BYTES`` each (tensor maps by value) follow, each in
    its own 64-byte aligned buffer. Built once per binding: a launch rewrites only the pointer
    slots and the blobs, so passing the arguments costs no Python objects (CuPy's own launch
    builds one per argument). The driver copies the values when the launch is queued (or
    when a CUDA graph captures it), so the next call may rewrite them at once.

    Args:
        values: every parameter's value (ints: pointers as addresses, the rest as themselves;
            non-negative).
        blobs: how many ``BLOB_BYTES`` parameters follow them (zeros until ``set_blobs``).
    """

    def __init__(self, values: list[int], blobs: int = 0):
        if sys.byteorder != "little":
            raise RuntimeError("KernelArgs packs int parameters for little-endian hosts")
        self._slot_memory = (ctypes.c_uint64 * len(values))(*values)
        base = ctypes.addressof(self._slot_memory)
        # Writes go through memoryviews of the buffers: writing the 256 bytes of maps took
        # 0.10-0.20 µs as a slice store against 0.66-0.79 by ctypes.memmove (2-core CPU
        # development machine: bench/results/h200-overhead-kernel-args/README.md); item
        # stores were not timed.
        self.slots = memoryview(self._slot_memory).cast("B").cast("Q")
        self._blob_memory = ctypes.create_string_buffer(BLOB_BYTES * blobs + 64)
        blob_base = -(-ctypes.addressof(self._blob_memory) // 64) * 64
        offset = blob_base - ctypes.addressof(self._blob_memory)
        self._blobs = memoryview(self._blob_memory).cast("B")[offset:offset + BLOB_BYTES * blobs]
        addresses = [base + 8 * i for i in range(len(values))]
        addresses += [blob_base + BLOB_BYTES * i for i in range(blobs)]
        self.argv = (ctypes.c_void_p * len(addresses))(*addresses)
        self.address = ctypes.addressof(self.argv)

    def set_blobs(self, data: bytes) -> None:
        """Write every blob parameter at once: ``data`` holds ``blobs`` x ``BLOB_BYTES``.

        Raises:
            ValueError: ``data`` is not that long.
        """
        try:
            self._blobs[:] = data
        except ValueError:  # the memoryview refuses a length that differs
            raise ValueError(f"expected {len(self._blobs)} bytes of blob parameters, got "
                             f"{len(data)}") from None

    def set_pointers(self, pointers: tuple[int, ...]) -> None:
        """Write the pointer parameters (A, B, C, D, then any after the scalars: the tensor
        maps' buffer, the stream-K workspace and token)."""
        slots = self.slots
        slots[0], slots[1], slots[2], slots[3] = pointers[:4]
        if len(pointers) > 4:  # after the five scalars
            slots[9] = pointers[4]
            if len(pointers) > 5:
                slots[10], slots[11] = pointers[5], pointers[6]


class StreamKWorkspace:
    """The ``workspace`` and ``token`` parameters of one launch of a ``STREAM_K`` build of
    ``10_wgmma_persistent.cu`` with ``ctas`` CTAs, laid out as the kernel reads them: a
    64-bit flag per CTA and consumer warpgroup (BLOCK_M / 64 of them), padded to 16 bytes,
    then a BLOCK_M x BLOCK_N fp32 accumulator per CTA.

    ``workspace()`` returns a fresh uint8 tensor of ``bytes`` on ``device`` from torch's
    caching allocator (ordered on the current stream, so concurrent streams and CUDA graphs
    each get their own; the caller holds it until the launch is queued) and a token no
    earlier launch of this binding used. A flag holds the token once its accumulator is written, and
    the reader sets it back to 0, so the kernel needs no zeroed memory: a replayed graph
    finds its flags at 0, and a fresh block's bytes match a 62-bit random token with
    probability 2^-62.
    """

    def __init__(self, kernel: CudaKernel, ctas: int, device: torch.device):
        p = kernel.params
        flags = ctas * (p["BLOCK_M"] // 64)
        self.bytes = -(-flags // 2) * 16 + ctas * p["BLOCK_M"] * p["BLOCK_N"] * 4
        # empty_like of one element seen as `bytes` (Problem.d_template's way): no keywords
        # to parse on the launch path.
        self._template = torch.empty(1, dtype=torch.uint8, device=device).expand(self.bytes)
        self._tokens = itertools.count(secrets.randbits(62) + 1)

    def __call__(self) -> tuple[torch.Tensor, int]:
        return torch.empty_like(self._template), next(self._tokens)


LAUNCHERS = ("cupy", "pycuda")
_LAUNCHER: contextvars.ContextVar[str] = contextvars.ContextVar("launcher", default="cupy")


@contextlib.contextmanager
def use_launcher(name: str):
    """Launch the CUDA C kernels through ``name`` (``"cupy"`` or ``"pycuda"``) inside.

    Raises:
        ValueError: an unknown launcher.
        RuntimeError: PyCUDA asked for but not installed (``pycuda_unavailable_reason``).
    """
    if name not in LAUNCHERS:
        raise ValueError(f"unknown launcher {name!r}; known: {', '.join(LAUNCHERS)}")
    if name == "pycuda" and (why := pycuda_unavailable_reason()) is not None:
        raise RuntimeError(f"launcher pycuda: {why}")
    token = _LAUNCHER.set(name)
    try:
        yield
    finally:
        _LAUNCHER.reset(token)


def sm90a_unavailable_reason(device: int | None = None) -> str | None:
    """Why an sm_90a kernel (``tma=True``) cannot run on ``device`` (default: the current
    one), or None when it can: sm_90a code runs on compute capability 9.0 only."""
    return _capability_reason(device, lambda capability: capability == (9, 0),
                              "needs a compute capability 9.0 GPU (sm_90a: wgmma, TMA)")


def sm80_unavailable_reason(device: int | None = None) -> str | None:
    """Why a kernel with ``sm80=True`` cannot run on ``device`` (default: the current one),
    or None when it can: compute capability 8.0 or newer."""
    return _capability_reason(device, lambda capability: capability >= (8, 0),
                              "needs compute capability 8.0 or newer (cp.async, bf16 "
                              "tensor-core instructions)")


def _capability_reason(device: int | None, runs: Callable[[tuple[int, int]], bool],
                       needs: str) -> str | None:
    """No CUDA's reason, else None where ``runs`` accepts the device's compute capability,
    else ``needs`` with the capability it has."""
    if (why := cuda_unavailable_reason()) is not None:
        return why
    capability = _capability(torch.cuda.current_device() if device is None else device)
    return None if runs(capability) else f"{needs}; this one is {capability[0]}.{capability[1]}"


@functools.cache
def _capability(device: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))


@functools.cache
def pycuda_unavailable_reason() -> str | None:
    """Why the PyCUDA launcher cannot run here, or None when it can."""
    if (why := cuda_unavailable_reason()) is not None:
        return why
    try:
        import pycuda.driver  # noqa: F401  (the imports are the check)
        from cuda.bindings import driver  # noqa: F401  (cuFuncGetParamInfo: pycuda_launch)
    except ImportError as exc:
        return f"PyCUDA or cuda-bindings is not installed ({exc}); install gemmlab[pycuda]"
    return None


@functools.cache
def _toolkit_includes() -> tuple[str, ...]:
    """``-I`` options that let NVRTC find cuda_fp16.h, cuda_bf16.h and mma.h with the crt/
    headers mma.h includes: CuPy's CUDA path (which may be a pip wheel without crt/), then the
    toolkits of ``toolkit_include_dirs``."""
    import cupy

    cupy_root = cupy.cuda.get_cuda_path()
    dirs = ([Path(cupy_root) / "include"] if cupy_root else []) + list(toolkit_include_dirs())
    return tuple(f"-I{d}" for d in dict.fromkeys(dirs) if d.is_dir())


def raw_module(code: str, device: int, defines: tuple[str, ...] = (), arch_suffix: str = ""):
    """``code`` (CUDA C++) compiled by NVRTC into a ``cupy.RawModule`` for CUDA device
    ``device``'s architecture (plus ``arch_suffix``, e.g. ``"a"`` for sm_90a), with the ladder's
    options and the toolkit headers (cuda_fp16.h, cuda_bf16.h, mma.h). CuPy caches the
    binary on disk, so a second process skips NVRTC.

    Raises:
        cupy.cuda.compiler.CompileException: the code does not compile (NVRTC's log)."""
    import cupy

    major, minor = torch.cuda.get_device_capability(device)
    options = compile_options(f"sm_{major}{minor}{arch_suffix}", defines) + _toolkit_includes()
    with cupy.cuda.Device(device):
        return cupy.RawModule(code=code, options=options)


@functools.cache
def _compiled(source: str, name: str, defines: tuple[str, ...], device: int, arch_suffix: str):
    """Compile once per (source, tile sizes, dtype, device) for the device's own architecture
    (sm_90 on H200; sm_90a with ``arch_suffix="a"``). CuPy also caches the binary on disk, so
    a second process skips NVRTC. Returns the function and its dynamic shared memory in
    bytes."""
    import cupy

    module = raw_module((SOURCE_DIR / source).read_text(), device, defines, arch_suffix)
    with cupy.cuda.Device(device):
        function = module.get_function(name)
        smem = 0
        if declares_dynamic_smem(source):
            smem = int(cupy.ndarray((1,), cupy.int32,
                                    memptr=module.get_global("gemm_dynamic_smem")).get()[0])
            function.max_dynamic_shared_size_bytes = smem
        return function, smem
