"""``gemm()``: D = act(A @ B + C) on any backend of the ladder, behind one set of checks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from profiling import nvtx

from . import signature, tuning
from .problem import Launch, Problem
from .registry import ANY_ADDRESS, BACKENDS, LADDER, Backend

ACTIVATIONS = (None, "relu")
_grad_enabled = torch.is_grad_enabled  # one name lookup less on the hot path


class BackendUnavailableError(RuntimeError):
    """The backend cannot run on this machine (no GPU, no CuPy, no Triton, ...)."""


@dataclass(frozen=True)
class Availability:
    """Whether a backend runs here; ``reason`` says why not."""

    name: str
    runs: bool
    reason: str


def available() -> list[Availability]:
    """Every backend in ladder order, with whether it runs on this machine and why not."""
    out = []
    for backend in LADDER:
        reason = backend.unavailable()
        out.append(Availability(backend.name, reason is None, reason or ""))
    return out


def get_backend(name: str) -> Backend:
    """The registry entry called ``name``.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *,
         activation: str | None = None, backend: str = "triton_fused",
         out: torch.Tensor | None = None, allow_tf32: bool = False,
         tuned: bool = True) -> torch.Tensor:
    """D = act(A @ B + C), computed by one backend of the ladder.

    Args:
        a: A, shape (M, K).
        b: B, shape (K, N).
        c: None, a full C of shape (M, N), or a bias of shape (N,) added to every row.
        activation: None or ``"relu"``.
        backend: a name from ``backends.BACKENDS`` (``gemmlab info`` lists them, with what
            runs on this machine).
        out: optional (M, N) tensor that receives D; it must not overlap A, B or C.
        allow_tf32: run fp32 operands on the TF32 tensor cores (10-bit mantissa products);
            off by default, so fp32 means IEEE fp32. Only for fp32 CUDA tensors and the
            backends that declare ``tf32``.
        tuned: for the backends that have something to tune (``Backend.pin``), run the
            configuration ``gemmlab tune`` stored in the tuned table (``GEMMLAB_TUNED_FILE``
            or ``backends/tuned.json``; see ``backends.tuning``) for this GPU, dtype (fp32,
            tf32, fp16, bf16) and shape bucket (M, N, K each rounded up to a power of two);
            the GPU is ``"cpu"`` for CPU tensors. Without a matching entry, or with
            ``tuned=False``, the backend runs its default configuration (Triton's autotuner,
            the registry's tile sizes). The backend's ``config()`` then reports which entry
            was used or why none applied.

    All tensors share one dtype (A's) and one device. Backends that do not declare
    ``strided`` (the CUDA C kernels) receive contiguous copies of non-contiguous inputs, and
    write through a contiguous buffer that is then copied into a non-contiguous ``out``.
    A negated view (``is_neg()``, as ``z.conj().imag`` gives) is read as its values: every
    backend receives a resolved copy of such an input and writes through a buffer into such
    an ``out`` (kernels read memory, not torch's negation bit).
    Under ``torch.autocast`` the backend runs with autocast off: D is computed in, and
    returned as, the operands' dtype. M, N or K = 0 give the exact answer (an empty D, or
    act(C) / zeros) without a launch.

    Cost: the first call of a signature (the arguments, every tensor's shape, strides, dtype,
    device, ``requires_grad``, view flags, whether autocast is on for its device type and,
    unless the backend takes any address (``Backend.any_address``), the 16-byte alignment
    of its address; and the tuned table's version) runs every check, resolves the tuned
    entry and binds the backend's launch (compiling if needed); later calls of that
    signature find the binding (``backends.signature``'s guards compare the tensors) and
    only check what depends on the data (that ``out`` does not overlap an input) and, for
    inputs that require grad on a backend without a backward, grad mode.

    Returns:
        D, shape (M, N), A's dtype and device (``out`` itself when given).

    Raises:
        ValueError: unknown backend or activation; A or B not 2-D; K of A and B differ; C or
            out of the wrong shape; tensors on different devices; a device the backend does
            not support; ``allow_tf32`` where it cannot apply; ``out`` overlapping an input
            (by address, whatever storages hold them) or itself (a stride-0 or
            self-overlapping view);
            an operand too large for the backend's indexing; inputs (or an ``out``) that
            require grad under autograd on a backend without a backward; with ``tuned``, a
            malformed tuned table (the message names the file) or an entry whose config the
            backend cannot use.
        TypeError: an argument that is not a tensor, or not a dense one (a sparse layout);
            mixed dtypes; a dtype the backend does not support.
        BackendUnavailableError: the backend cannot run on this machine (the reason is given).
    """
    # The hot path of every call: find the binding of this signature.
    plan = head = None
    try:
        if b is a:  # torch's guard refuses one tensor in two places: it gets a view
            b = a.view_as(a)
        if c is None:
            tensors = (a, b)
        else:
            if c is a or c is b:
                c = c.view_as(c)
            tensors = (a, b, c)
        if out is not None:
            if out is a or out is b or out is c:
                out = out.view_as(out)
            tensors = (*tensors, out)
        misaligned = None  # a binding of an ANY_ADDRESS backend serves every alignment
        if backend not in ANY_ADDRESS:
            misaligned = (a.data_ptr() | b.data_ptr() | (0 if c is None else c.data_ptr())
                          | (0 if out is None else out.data_ptr())) & 15
            if misaligned:
                misaligned = tuple(t.data_ptr() & 15 for t in tensors)
        head = (backend, activation, allow_tf32, tuned, tuning.generation, c is None,
                out is None, misaligned)
        for check, bound in _PLANS.get(head, ()):
            if check(*tensors):
                plan = bound
                break
    except (AttributeError, TypeError, RuntimeError):  # not dense tensors: _bind says which
        head = None
    if plan is None:
        plan = _bind(a, b, c, activation, backend, out, allow_tf32, tuned)
        if head is not None:
            _keep(head, signature.guard(*tensors), plan)
    if out is not None and _overlaps(plan, a, b, c, out):
        raise ValueError(f"out overlaps {_overlaps(plan, a, b, c, out)} in memory; pass a "
                         f"separate tensor")
    if nvtx.domain is nvtx.NO_PROFILER:  # the range would record nothing: skip its calls
        return plan.launch(a, b, c, out)
    nvtx.push(plan.name)
    try:
        return plan.launch(a, b, c, out)
    finally:
        nvtx.pop()


def bind_launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *,
                activation: str | None = None, backend: str = "triton_fused",
                out: torch.Tensor | None = None, allow_tf32: bool = False,
                tuned: bool = True) -> Launch:
    """The launch ``gemm()`` binds for this call's signature, bound anew: every check of
    ``gemm()`` runs once, here, and the result is called as ``launch(a, b, c, out)`` with
    nothing between the caller and the backend. For measurements: ``gemmlab bench
    --overhead`` times it beside ``gemm()`` to split what ``gemm()`` adds into its own look-up
    and the launch's. The launch checks nothing, so it must be called only with tensors of
    the signature it was bound for (shapes, strides, dtype, device; its backend's
    alignment). Arguments, errors raised: as ``gemm()``'s."""
    return _bind(a, b, c, activation, backend, out, allow_tf32, tuned).launch


# Bindings kept: per head (the arguments, which of C and out are given and the pointers'
# misalignment), a list of (the signature guard's check of the tensors given, which also
# holds autocast's state for their device type, Plan), most recent first. Past MAX_PLANS
# in all the cache starts again (a program with unboundedly many shapes pays the
# first-call cost again, nothing more); a head keeps at most PLANS_PER_HEAD, so a look-up
# tries at most that many guards (a failing one costs tens of nanoseconds).
MAX_PLANS = 1024
PLANS_PER_HEAD = 32
_PLANS: dict[tuple, list] = {}
_plan_count = [0]


def _keep(head: tuple, guards: signature.Guard, plan: Plan) -> None:
    if _plan_count[0] >= MAX_PLANS:
        _PLANS.clear()
        _plan_count[0] = 0
    bindings = _PLANS.setdefault(head, [])
    bindings.insert(0, (guards.check, plan))
    _plan_count[0] += 1
    if len(bindings) > PLANS_PER_HEAD:
        bindings.pop()
        _plan_count[0] -= 1


@dataclass(frozen=True)
class Plan:
    """One bound call signature: its launch, its NVTX range's name (the backend's), and the
    bytes each of A, B, C and out spans from its address (for the overlap check)."""

    launch: Launch
    name: str
    spans: tuple[int, int, int, int]


def _bind(a, b, c, activation, backend, out, allow_tf32, tuned) -> Plan:
    """Every check of ``gemm()``'s docstring, then the launch for this call signature."""
    impl = get_backend(backend)
    m, n, k = _check(impl, a, b, c, activation, out, allow_tf32)
    relu = activation == "relu"
    spans = (_span(a), _span(b), _span(c), _span(out))
    if m == 0 or n == 0 or k == 0:
        launch = lambda a, b, c, out: _degenerate(m, n, a, c, relu, out)  # noqa: E731
    else:
        p = Problem.of(a, b, c, relu, allow_tf32)
        if tuned and impl.pin is not None:
            choice = tuning.resolve(impl, a.device, a.dtype, allow_tf32, m, n, k)
            launch = impl.bind(p, choice.config, choice.note)
        else:
            launch = impl.bind(p, None)
        launch = _readable(launch, p, impl.strided, a, b, c, out)
    if torch.is_autocast_enabled(a.device.type):
        launch = _without_autocast(launch, a.device.type)
    if not impl.differentiable and _requires_grad(a, b, c, out):
        launch = _no_grad_only(launch, impl)
    return Plan(launch, impl.name, spans)


def _no_grad_only(launch: Launch, impl: Backend) -> Launch:
    """``launch`` for inputs that require grad on a backend without a backward, bound under
    ``torch.no_grad()`` (``_check`` refuses them under grad mode): it refuses a call made
    with grad mode on. Bindings are not keyed on grad mode (only such inputs depend on it),
    so this binding may be found by such a call."""
    def no_grad_only(a, b, c, out):
        if _grad_enabled():
            raise ValueError(_no_backward(impl))
        return launch(a, b, c, out)

    return no_grad_only


def _without_autocast(launch: Launch, device_type: str) -> Launch:
    """``launch`` with autocast off for the operands' device: under ``torch.autocast`` the
    torch backends' matmuls would run in the autocast dtype (and ``cublas`` return it), where
    ``gemm()`` computes in the operands' dtype (fp32 means IEEE fp32) and returns it."""
    def as_written(a, b, c, out):
        with torch.autocast(device_type, enabled=False):
            return launch(a, b, c, out)

    return as_written


def _readable(launch: Launch, p: Problem, strided: bool, a, b, c, out) -> Launch:
    """``launch`` given operands its backend reads as plain memory, decided once from the
    signature: an input that is a negated view (``is_neg()``: its memory holds -x, as
    ``z.conj().imag`` gives) becomes a resolved copy, and for a backend that reads contiguous
    operands only (not ``strided``) a non-contiguous input becomes a contiguous copy; D is
    written through a new contiguous buffer into an ``out`` that is either."""
    def plain(t):
        return not t.is_neg() and (strided or t.is_contiguous())

    copies = [t is not None and not plain(t) for t in (a, b, c)]
    through = out is not None and not plain(out)
    if not any(copies) and not through:
        return launch

    def copied(a, b, c, out):
        a, b, c = (t.resolve_neg().contiguous() if copy else t
                   for t, copy in zip((a, b, c), copies))
        if through:
            return out.copy_(launch(a, b, c, torch.empty_like(p.d_template)))
        return launch(a, b, c, out)

    return copied


def _self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share an address: dimensions sorted by stride, each
    stride must exceed the farthest offset the smaller ones reach (conservative: a layout it
    cannot prove disjoint counts as overlapping)."""
    reach = 0
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _span(t: torch.Tensor | None) -> int:
    """Bytes from ``t``'s address to the end of its last element (0 when empty)."""
    if t is None or t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def _overlaps(plan: Plan, a, b, c, out) -> str | None:
    """The first input whose bytes overlap ``out``'s, by address span, whatever storages
    hold them (two views of one buffer through two storages are caught too)."""
    o0 = out.data_ptr()
    o1 = o0 + plan.spans[3]
    for label, t, span in (("a", a, plan.spans[0]), ("b", b, plan.spans[1]),
                           ("c", c, plan.spans[2])):
        if t is not None and span and o1 > o0:
            t0 = t.data_ptr()
            if t0 < o1 and o0 < t0 + span:
                return label
    return None


def _check(impl: Backend, a, b, c, activation, out, allow_tf32) -> tuple[int, int, int]:
    """Every check of gemm()'s docstring, before anything is launched; returns (M, N, K)."""
    for label, t in (("a", a), ("b", b), ("c", c), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
        if t is not None and t.layout != torch.strided:
            raise TypeError(f"{label} must be a dense tensor (torch.strided layout), got "
                            f"{t.layout}")
    if a is None or b is None:
        raise TypeError("a and b are required tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"A and B must be 2-D, A (M, K) and B (K, N); "
                         f"got A {tuple(a.shape)} and B {tuple(b.shape)}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: A is {m}x{k} but B is {k2}x{n}")
    if c is not None and tuple(c.shape) not in ((m, n), (n,)):
        raise ValueError(f"C must be ({m}, {n}) or a bias of shape ({n},); got {tuple(c.shape)}")
    if out is not None and tuple(out.shape) != (m, n):
        raise ValueError(f"out must have shape ({m}, {n}); got {tuple(out.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")

    tensors = {"a": a, "b": b, "c": c, "out": out}
    tensors = {label: t for label, t in tensors.items() if t is not None}
    devices = {label: t.device for label, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device; got {_listing(devices)}")
    dtypes = {label: t.dtype for label, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"all tensors must share one dtype; got {_listing(dtypes)}")

    # The backend's limits, not the machine's: checked where it cannot run too.
    if impl.max_dim is not None and max(m, n, k) > impl.max_dim:
        raise ValueError(f"backend {impl.name!r} indexes M, N and K up to {impl.max_dim}; got "
                         f"M, N, K = {m}, {n}, {k}")
    if impl.max_offset is not None:
        # D's offsets as gemm() allocates it (contiguous) when no out is given
        reach = {"out": m * n - 1, **{label: _span(t) // t.element_size() - 1
                                      for label, t in tensors.items()}}
        if max(reach.values()) > impl.max_offset:
            raise ValueError(f"backend {impl.name!r} indexes at most {impl.max_offset} "
                             f"elements past an operand's start; got last-element offsets "
                             f"{_listing(reach)}")

    reason = impl.unavailable()
    if reason is not None:
        raise BackendUnavailableError(f"backend {impl.name!r} cannot run here: {reason}")
    if a.dtype not in impl.dtypes:
        raise TypeError(f"backend {impl.name!r} supports {_names(impl.dtypes)}; got {a.dtype}")
    if a.device.type not in impl.devices:
        raise ValueError(f"backend {impl.name!r} runs on {', '.join(impl.devices)} tensors; "
                         f"got {a.device}")
    if allow_tf32 and not (impl.tf32 and a.dtype == torch.float32 and a.is_cuda):
        raise ValueError(f"allow_tf32 needs fp32 CUDA tensors and a backend with TF32 "
                         f"(backend {impl.name!r}, {a.dtype} on {a.device})")
    if out is not None and _self_overlapping(out):
        raise ValueError(f"out must not overlap itself (strides {tuple(out.stride())} for shape "
                         f"{tuple(out.shape)}: several elements of D would share memory)")
    if not impl.differentiable and torch.is_grad_enabled() and _requires_grad(a, b, c, out):
        raise ValueError(_no_backward(impl))
    return m, n, k


def _requires_grad(a, b, c, out=None) -> bool:
    """Whether autograd would record the call: an input requires grad, or ``out`` does (a
    tensor of a graph, which a backend without a backward would overwrite unseen)."""
    return any(t.requires_grad for t in (a, b, c, out) if t is not None)


def _no_backward(impl: Backend) -> str:
    grads = ", ".join(b.name for b in LADDER if b.differentiable)
    return (f"backend {impl.name!r} has no backward: call it under torch.no_grad() or use a "
            f"differentiable backend ({grads})")


def _degenerate(m: int, n: int, a: torch.Tensor, c: torch.Tensor | None, relu: bool,
                out: torch.Tensor | None) -> torch.Tensor:
    """M, N or K is 0: A @ B is an (M, N) matrix of zeros (empty when M or N is 0)."""
    d = torch.zeros((m, n), dtype=a.dtype, device=a.device)
    if c is not None:
        d = d + c
    if relu:
        d = torch.relu(d)
    return d if out is None else out.copy_(d)


def _listing(values: dict) -> str:
    return ", ".join(f"{label}: {value}" for label, value in values.items())


def _names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes) or "no dtype here"
