"""cublaslt: cuBLASLt's ``cublasLtMatmul`` with its own fused epilogues, through
nvmath-python's maintained binding of the C API (``nvmath.bindings.cublasLt``): planned once
per binding (descriptors, layouts, the heuristic's algorithm), then each call is one
``cublasLtMatmul`` on torch's current stream, as torch's own cuBLASLt path does.

cuBLASLt is column-major, and a row-major (M, N) D is the column-major (N, M) matrix D^T,
so the call computes D^T = B^T A^T + C^T:

- A row-major (M, K) is the column-major A^T (K, M): op N; a column-major A (a transposed
  view) is read with op T. Likewise B. Other strides are copied to contiguous first.
- full C: beta = 1, C^T read as a column-major (N, M) matrix, in the same epilogue.
- bias: cuBLASLt's bias vector adds one value per row of its column-major D^T, which is
  one value per column of D: the ``BIAS``/``RELU_BIAS`` epilogue as it is.
- ReLU: the ``RELU`` (or ``RELU_BIAS``) epilogue.

fp32 computes in IEEE fp32 (``CUBLAS_COMPUTE_32F``), tf32 in ``CUBLAS_COMPUTE_32F_FAST_TF32``,
fp16 and bf16 with fp32 accumulation (``CUBLAS_COMPUTE_32F``), alpha and beta fp32. The
heuristic is told the operands' pointer alignment (up to 256 bytes, as torch and nvmath do);
a call whose pointers are less aligned than a plan assumed gets a plan of its own.
Source: the cuBLASLt documentation (``cublasLtMatmul``, ``cublasLtEpilogue_t``,
``cublasLtMatmulPreferenceAttributes_t``) and nvmath-python's ``nvmath.bindings.cublasLt``.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch

from .context import bind_primary_context
from .problem import Launch, Problem

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WORKSPACE_BYTES = 32 << 20  # the most a plan may use: torch's cuBLAS workspace on Hopper
_last = ["not launched yet"]


@functools.cache
def unavailable_reason() -> str | None:
    """Why cublaslt cannot run here, or None when it can (asked once per process)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import nvmath.bindings.cublasLt  # noqa: F401  (the import is the check)
    except ImportError as exc:
        return (f"nvmath-python is not importable ({exc}); install gemmlab[cuda13] or "
                f"gemmlab[cuda12]")
    return None


def describe() -> str:
    """The latest call's cuBLASLt epilogue, compute type and workspace."""
    return _last[0]


def _lt():
    from nvmath.bindings import cublasLt

    return cublasLt


@functools.cache
def _handle(device: int) -> int:
    """One cuBLASLt handle per device, kept for the process (as torch keeps its own)."""
    with torch.cuda.device(device):
        return _lt().create()


_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_workspace_lock = threading.Lock()


def _workspace(device: int, stream: int) -> tuple[int, int]:
    """(address, bytes) of the workspace of ``stream``: WORKSPACE_BYTES, allocated at its
    first use and kept (plans keep its address). Two streams never share one; calls on one
    stream are ordered, so they may."""
    with _workspace_lock:
        buffer = _workspaces.get((device, stream))
        if buffer is None:
            buffer = _workspaces[device, stream] = torch.empty(
                WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")
    return buffer.data_ptr(), WORKSPACE_BYTES


def _set(setter, dtype_of, obj: int, attr, value) -> None:
    """Set a cuBLASLt descriptor attribute, as the binding's dtype for it."""
    buf = np.array([value], dtype=dtype_of(attr))
    setter(obj, attr, buf.ctypes.data, buf.itemsize)


def _aligned_to(address: int) -> int:
    """The largest power of two up to 256 that divides ``address`` (or its low bits)."""
    return min(256, address & -address) if address & 255 else 256


def _data_type(dtype: torch.dtype) -> int:
    from nvmath import CudaDataType

    return {torch.float32: CudaDataType.CUDA_R_32F, torch.float16: CudaDataType.CUDA_R_16F,
            torch.bfloat16: CudaDataType.CUDA_R_16BF}[dtype]


def _operand(t: torch.Tensor, rows: int, cols: int) -> tuple[str, int] | None:
    """How cuBLASLt reads the (rows, cols) tensor ``t``: ``("row", ld)`` for row-major
    strides, ``("col", ld)`` for column-major ones, None when neither (copy it)."""
    s0, s1 = t.stride()
    if s1 == 1 and s0 >= max(1, cols):
        return "row", s0
    if s0 == 1 and s1 >= max(1, rows):
        return "col", s1
    return None


def _row_major(t: torch.Tensor, rows: int, cols: int) -> bool:
    how = _operand(t, rows, cols)
    return how is not None and how[0] == "row"


class Plan:
    """The descriptors, layouts and algorithm of one cuBLASLt problem: the operands' layouts
    (``_operand``'s answers), the epilogue and the pointers' alignment. ``caller(stream)``
    runs it on a stream as ``call(a_ptr, b_ptr, c_ptr, d_ptr)``; ``c_ptr`` is the full C, or
    the bias, or 0; ``arguments`` gives the ``cublasLtMatmul`` call it makes. ``a_layout``
    and ``b_layout`` are ``("row" | "col", leading dimension)``; ``c_ld`` (full C) and
    ``d_ld`` are row strides; ``bias_ptr`` is the bias the plan starts with.

    Raises:
        RuntimeError: cuBLASLt's heuristic has no algorithm for it.
    """

    def __init__(self, p: Problem, device: int, a_layout, b_layout, c_ld: int | None,
                 d_ld: int, alignment: int, bias_ptr: int = 0):
        from nvmath import CudaDataType
        from nvmath.bindings import cublas

        lt = _lt()
        self.device, handle = device, _handle(device)
        dtype = _data_type(p.dtype)
        compute = (cublas.ComputeType.COMPUTE_32F_FAST_TF32 if p.allow_tf32
                   else cublas.ComputeType.COMPUTE_32F)
        self._objects: list[tuple] = []  # (destroy, handle) of everything created here
        desc = self._keep(lt.matmul_desc_destroy,
                          lt.matmul_desc_create(compute, CudaDataType.CUDA_R_32F))
        attr = lt.MatmulDescAttribute
        set_desc = functools.partial(_set, lt.matmul_desc_set_attribute,
                                     lt.get_matmul_desc_attribute_dtype, desc)
        # D^T = B^T A^T: cuBLASLt's "A" is our B, its "B" is our A.
        (a_order, lda), (b_order, ldb) = a_layout, b_layout
        set_desc(attr.TRANSA, cublas.Operation.N if b_order == "row" else cublas.Operation.T)
        set_desc(attr.TRANSB, cublas.Operation.N if a_order == "row" else cublas.Operation.T)
        self.bias, self.full_c = p.c == "bias", p.c == "full"
        if self.bias:
            epilogue = lt.Epilogue.RELU_BIAS if p.relu else lt.Epilogue.BIAS
        else:
            epilogue = lt.Epilogue.RELU if p.relu else lt.Epilogue.DEFAULT
        set_desc(attr.EPILOGUE, epilogue)
        self._set_bias = functools.partial(set_desc, attr.BIAS_POINTER)
        if self.bias:
            self._set_bias(bias_ptr)
        self._bias_ptr = bias_ptr

        def layout(rows, cols, ld):
            return self._keep(lt.matrix_layout_destroy,
                              lt.matrix_layout_create(dtype, rows, cols, ld))

        m, n, k = p.m, p.n, p.k
        bt = layout(n, k, ldb) if b_order == "row" else layout(k, n, ldb)
        at = layout(k, m, lda) if a_order == "row" else layout(m, k, lda)
        dt = layout(n, m, d_ld)
        ct = layout(n, m, c_ld) if p.c == "full" else dt
        self._scalars = np.array([1.0, 1.0 if p.c == "full" else 0.0], dtype=np.float32)
        alpha = self._scalars.ctypes.data
        beta = alpha + self._scalars.itemsize

        preference = self._keep(lt.matmul_preference_destroy, lt.matmul_preference_create())
        pattr = lt.MatmulPreferenceAttribute
        set_pref = functools.partial(_set, lt.matmul_preference_set_attribute,
                                     lt.get_matmul_preference_attribute_dtype, preference)
        set_pref(pattr.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES)
        for which in ("A", "B", "C", "D"):
            set_pref(getattr(pattr, f"MIN_ALIGNMENT_{which}_BYTES"), alignment)
        self._heuristic = lt.MatmulHeuristicResult(1)
        found = np.zeros(1, dtype=np.int32)
        lt.matmul_algo_get_heuristic(handle, desc, bt, at, ct, dt, preference, 1,
                                     self._heuristic.ptr, found.ctypes.data)
        if found[0] == 0:
            raise RuntimeError(f"cuBLASLt has no algorithm for {p} (alignment {alignment} B)")
        # cublasLtMatmulHeuristicResult_t opens with its cublasLtMatmulAlgo_t.
        algo = self._heuristic.ptr
        self._call = lt.matmul
        # cublasLtMatmul's arguments around the four pointers, and those after D's pointer
        # but for the stream's workspace and the stream.
        self._head = (handle, desc, alpha)
        self._layouts = (bt, at, beta, ct)
        self._d_layout_and_algo = (dt, algo)
        self.text = (f"cuBLASLt via nvmath.bindings, {epilogue.name} epilogue"
                     f"{', C with beta=1' if p.c == 'full' else ''}, {compute.name}, "
                     f"{alignment}-byte alignment, "
                     f"workspace {int(self._heuristic.workspace_size)} B")
        self._lock = threading.Lock()

    def _keep(self, destroy, obj: int) -> int:
        self._objects.append((destroy, obj))
        return obj

    def arguments(self, a_ptr: int, b_ptr: int, c_ptr: int, d_ptr: int,
                  stream: int) -> tuple:
        """``cublasLtMatmul``'s 16 arguments for these pointers on ``stream`` (C is D's
        pointer when there is no full C: beta is 0 then, and C is not read)."""
        bt, at, beta, ct = self._layouts
        c = c_ptr if self.full_c else d_ptr
        return (*self._head, b_ptr, bt, a_ptr, at, beta, c, ct, d_ptr,
                *self._d_layout_and_algo, *_workspace(self.device, stream), stream)

    def caller(self, stream: int):
        """``call(a_ptr, b_ptr, c_ptr, d_ptr)``: one ``cublasLtMatmul`` on ``stream``, D (at
        ``d_ptr``) = act(A B + C), ``c_ptr`` the full C, the bias or 0. Everything but the
        pointers is bound here, once per stream: the call passes ``arguments``' values
        positionally, with no tuple built per call."""
        (handle, desc, alpha, _, bt, _, at, beta, _, ct, _, dt, algo, workspace, size,
         _) = self.arguments(0, 0, 0, 0, stream)
        matmul, full_c = self._call, self.full_c

        def call(a_ptr, b_ptr, c_ptr, d_ptr):
            matmul(handle, desc, alpha, b_ptr, bt, a_ptr, at, beta,
                   c_ptr if full_c else d_ptr, ct, d_ptr, dt, algo, workspace, size, stream)

        if self.bias:
            def with_bias(a_ptr, b_ptr, c_ptr, d_ptr):
                with self._lock:  # the bias pointer lives in the shared descriptor
                    if c_ptr != self._bias_ptr:
                        self._set_bias(c_ptr)
                        self._bias_ptr = c_ptr
                    call(a_ptr, b_ptr, c_ptr, d_ptr)

            return with_bias
        call.plan = self  # the call holds handles the plan owns: it keeps the plan alive
        return call

    def __del__(self):
        for destroy, obj in reversed(getattr(self, "_objects", ())):
            try:
                destroy(obj)
            except Exception:  # at interpreter exit the library may be gone already
                pass


def bind(p: Problem, config=None) -> Launch:
    """The cuBLASLt launch for ``p``: planned at its first call (the operands' layouts fix
    the plan; ``gemm()`` binds once per signature) and per pointer alignment, then one
    ``cublasLtMatmul`` per call on torch's current stream, writing into ``out`` when its
    rows are contiguous, else into a new D that is then copied into ``out``."""
    device = p.device.index if p.device.index is not None else torch.cuda.current_device()
    raw_stream, current_device = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
    layout: list = []  # A's and B's _operand, whether C is copied, whether D goes through one
    plans: dict[int, Plan] = {}  # the pointers' low 8 bits (their alignment) -> Plan
    # stream << 8 | the pointers' low 8 bits -> (Plan.caller(stream), Plan.text)
    calls: dict[int, tuple] = {}
    per_thread = threading.local()  # ``ready`` once the thread's context is bound
    template, empty_like = p.d_template, torch.empty_like

    def launch(a, b, c, out):
        try:
            per_thread.ready
        except AttributeError:  # the thread's first call: cuBLASLt needs a current context
            bind_primary_context(device)
            per_thread.ready = True
        if not layout:
            layout[:] = (_operand(a, p.m, p.k), _operand(b, p.k, p.n),
                         c is not None and not (_row_major(c, p.m, p.n) if c.dim() == 2
                                                else c.stride(0) == 1),
                         out is not None and not _row_major(out, p.m, p.n))
        a_how, b_how, copy_c, through = layout
        if copy_c or a_how is None or b_how is None:
            a, b = a if a_how else a.contiguous(), b if b_how else b.contiguous()
            c = c.contiguous() if copy_c else c
        d = empty_like(template) if through or out is None else out
        a_ptr, b_ptr, d_ptr = a.data_ptr(), b.data_ptr(), d.data_ptr()
        c_ptr = 0 if c is None else c.data_ptr()
        stream = raw_stream(device)
        low_bits = (a_ptr | b_ptr | c_ptr | d_ptr) & 255
        bound = calls.get(stream << 8 | low_bits)
        if bound is None:
            plan = plans.get(low_bits)
            if plan is None:
                plan = plans[low_bits] = Plan(
                    p, device, a_how or ("row", p.k), b_how or ("row", p.n),
                    c.stride(0) if p.c == "full" else None, d.stride(0),
                    _aligned_to(low_bits), c_ptr)
            bound = calls[stream << 8 | low_bits] = (plan.caller(stream), plan.text)
        if current_device() == device:
            bound[0](a_ptr, b_ptr, c_ptr, d_ptr)
        else:
            with torch.cuda.device(device):
                bound[0](a_ptr, b_ptr, c_ptr, d_ptr)
        _last[0] = bound[1]
        return out.copy_(d) if through else d

    return launch
