"""``gemmlab bench --overhead``: what ``gemm()`` costs the host per call, against the call it
wraps, per backend, on tiny shapes where the host is all there is.

Per backend (and dtype) on fresh random A, B, C, every call first checked against float64,
the operands refilled in place with new random values before each call's check: each call
makes its own D, and one that left it unwritten would hand back an earlier call's D, made
from other operands, and fail:

- ``wrapped_us``: the library call the backend makes, set up once by hand and then only
  called, a new D each call as ``gemm()`` gives, and the operands' addresses read per call
  as any caller must: ``torch.addmm(c, a, b).relu_()`` for cublas; ``torch.empty_like`` for
  D and nvmath's binding of ``cublasLtMatmul`` with the planned arguments for cublaslt; the
  function Inductor compiled for torch_compile's graph (what ``gemm()`` calls, past the
  Dynamo frame hook and guards of the function ``torch.compile`` returned); the expression
  for torch_unfused; ``torch.empty_like`` for D and the driver's ``cuLaunchKernel`` (CuPy's
  binding) with a prebuilt ``KernelArgs`` buffer for the CUDA C kernels (the tensor maps of
  cuda_wgmma encoded beforehand); ``torch.empty_like`` and Triton's own
  ``CompiledKernel[grid](*args)`` launch of the compiled kernel, the operands passed as
  tensors, for triton_fused (its bound launch passes their addresses as integers). The
  cuBLASLt and driver calls take the stream current at set-up.
- ``gemm_us``: ``backends.gemm(a, b, c, activation="relu", backend=...)``, tuned (the
  default), after its first call has bound the signature.
- ``launch_us``: the launch ``gemm()`` binds for that signature, called directly
  (``backends.api.bind_launch``); ``front_us``, the median over rounds of gemm() minus it, is
  what ``gemm()``'s own per-call code costs (its binding look-up, the overlap check, the NVTX
  switch), and ``closure_us``, the median of it minus the wrapped call, what the bound launch
  costs over the library call it makes.
- ``untuned_us``: the same with ``tuned=False``; ``tuned_us``, the median over rounds of
  gemm() minus untuned, is what the tuned-table lookup adds per call.
- ``added_us``: what ``gemm()`` adds (its checks, its binding look-up, the NVTX range): the
  median over rounds of the round's gemm() time minus its wrapped-call time, and
  ``added_iqr_us`` the quartiles of those differences. A host whose speed drifts between
  loops (a shared machine) shows as a wide range: a target inside it is within the noise.
- ``host_ns``: the host's speed while the row ran: ns per call of a Python function that
  does nothing (``interpreter_ns``), timed at the start of every round, the median. The H200
  machine's host changes speed in phases, its interpreter, C code and memory copies all
  slowing together (its probe's slow phase: the interpreter 1.7x, C code 1.5x; in its runs
  72-75, ``host_ns`` 41-47 and 64-72 against the fastest 23.2, 1.8-2.0x and 2.8-3.1x:
  ``bench/results/h200-host-phases/``), and every figure above, Python run per call, moves
  with it: this says which phase a row met.
- ``signature_guard``: which guard found the binding (``backends.signature``).
- ``config``: what the backend ran (``Backend.config()`` after the checked calls: the
  autotuner's pick for triton_fused, the kernel's tile sizes, the cuBLASLt plan).

Each figure is host time: the median over ``rounds`` rounds (the four calls taking turns,
in an order rotated each round) of ``timeit`` loops of ``number`` back-to-back calls,
divided by ``number``, with the GPU synchronized between loops. The GPU runs each tiny
kernel faster than the host issues it, so the loop measures the host.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable

import torch

import backends
from backends import signature
from backends.api import bind_launch
from backends.dtypes import DTYPES
from backends.problem import Problem
from backends.registry import CUDA_KERNELS

from .gemm_bench import random_operand

# 32^3: each kernel takes the GPU less time than the host takes to issue it, so the loop
# measures the host. At 128^3 some kernels outlast their launch and the queue stays busy;
# on the H200 machine the same wrapped calls took 0.7-3.9 µs more each for the CUDA C rungs,
# 5.3 for triton_fused, 9.5-29.7 for the torch and cuBLAS ones (wrapped_us of
# bench/results/h200-overhead/ at 128^3, commit b7bb018, against the 32^3 run four minutes
# later: `git show eb6d44b:bench/results/h200-overhead-32/results.json`).
SHAPE = (32, 32, 32)
# Targets of the cheap-gemm() work, in µs per call: gemm() over the wrapped call, and gemm()
# in all for triton_fused, for the CUDA C kernels, and the tuned look-up.
TARGET_ADDED_US = 3.0
TARGET_TRITON_US = 15.0
TARGET_CUDA_US = 12.0
TARGET_TUNED_US = 1.0


def _wrapped(name: str, p: Problem, a, b, c, d) -> Callable[[], object]:
    """The call backend ``name`` wraps, with everything but the call itself done here."""
    if name == "cublas":
        return lambda: torch.addmm(c, a, b).relu_()
    if name == "torch_unfused":
        return lambda: torch.relu(a @ b + c)
    if name == "torch_compile":
        from backends import torch_compile

        compiled = torch_compile.compiled(p, a, b, c)
        compiled(a, b, c)  # compiles, if no gemm() call has yet
        graph = compiled.direct()
        return lambda: graph(a, b, c)[0]
    if name == "cublaslt":
        from nvmath.bindings.cublasLt import matmul

        from backends import cublaslt

        plan = cublaslt.Plan(p, a.device.index, ("row", p.k), ("row", p.n), p.n, p.n, 256)
        args = list(plan.arguments(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(),
                                   torch.cuda.current_stream().cuda_stream))

        def lt_launch():  # the operands' addresses read per call, as any caller must
            out = torch.empty_like(d)
            args[3], args[5], args[8], args[10] = (b.data_ptr(), a.data_ptr(), c.data_ptr(),
                                                   out.data_ptr())
            matmul(*args)
            return out

        lt_launch.plan = plan  # the arguments point into it: it lives as long as the call
        return lt_launch
    if name in CUDA_KERNELS:
        return _wrapped_cuda(CUDA_KERNELS[name], p, a, b, c, d)
    if name == "triton_fused":
        from backends import triton_fused

        launch = triton_fused.bind(p, None)
        launch(a, b, c, d)
        if not launch.compiled:  # the interpreter: no compiled kernel, the JIT is the call
            return lambda: launch(a, b, c, d)
        kernel, grid, make_args = launch.compiled
        # The pointer kernel's arguments: A, B, C and D as tensors (as a Triton user passes
        # them; a new D per call, as gemm() makes), then what the binding fixed.
        fixed = make_args(a, b, c, d)[4:]

        def triton_launch():
            out = torch.empty_like(d)
            kernel[grid](a, b, c, out, *fixed)
            return out

        return triton_launch
    raise ValueError(f"no wrapped call known for backend {name!r}")


def _wrapped_cuda(kernel, p: Problem, a, b, c, d) -> Callable[[], object]:
    from cupy.cuda import driver

    from backends.cuda import KernelArgs, tma

    function, smem = kernel.compiled(p.dtype, a.device.index)
    handle = function.kernel.ptr
    maps, extra, epilogue_maps = None, (), None
    if kernel.tma:
        maps = tma.gemm_maps(a, b, p.k, p.n, kernel.params["BLOCK_M"], kernel.params["BLOCK_K"])
        extra = (maps.data_ptr(),)
    if kernel.epilogue_maps:
        epilogue_maps = tma.EpilogueMaps(p.dtype, p.m, p.n, full_c=True)
    args = KernelArgs(kernel.parameter_values(p), blobs=2 if epilogue_maps else 0)
    stream = torch.cuda.current_stream().cuda_stream
    (gx, gy), (tx, ty) = kernel.launch_grid(p.m, p.n, a.device.index), kernel.threads

    def driver_launch():
        out = torch.empty_like(d)
        args.set_pointers((a.data_ptr(), b.data_ptr(), c.data_ptr(), out.data_ptr(), *extra))
        if epilogue_maps is not None:
            args.set_blobs(epilogue_maps(out, c))
        driver.launchKernel(handle, gx, gy, 1, tx, ty, 1, smem, stream, args.address, 0)
        return out

    driver_launch.maps = maps  # the kernel reads the maps' buffer: it lives as long as the call
    return driver_launch


# Calls per interpreter_ns loop: 0.1-0.4 ms on the H200 machine's host.
INTERPRETER_CALLS = 5000


def _nothing() -> None:
    return None


def interpreter_ns(calls: int = INTERPRETER_CALLS) -> float:
    """The host's speed now: ns per call of a Python function that does nothing, over one
    ``timeit`` loop of ``calls`` calls (the interpreter's call path, which ``gemm()``'s own
    per-call code is made of)."""
    return timeit.timeit(_nothing, number=calls) / calls * 1e9


def _host_us(fn: Callable[[], object], number: int, device: torch.device) -> float:
    """Host µs per call of one ``timeit`` loop of ``number`` calls, GPU idle before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = timeit.timeit(fn, number=number)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return seconds / number * 1e6


def measure(name: str, dtype_name: str, device: torch.device, shape=SHAPE, *, rounds: int = 21,
            number: int = 200, seed: int = 0) -> dict:
    """One row (see the module doc): checked, then timed; ``ok`` False and no times when a
    check fails (``error`` says which call and why). A loop holds ``number`` calls, fewer
    when one call takes more than 50 µs (the Triton interpreter on a CPU)."""
    spec = DTYPES[dtype_name]
    dtype, tf32, tol = spec.torch, spec.tf32, spec.tolerance
    m, n, k = shape
    generator = torch.Generator(device=device).manual_seed(seed)
    a, b, c = (random_operand(*s, dtype=dtype, device=device, generator=generator)
               for s in ((m, k), (k, n), (m, n)))
    p = Problem.of(a, b, c, True, tf32)
    d = torch.empty((m, n), dtype=dtype, device=device)  # a D for the set-up of raw launches
    impl = backends.BACKENDS[name]
    row = {"backend": name, "dtype": dtype_name, "M": m, "N": n, "K": k, "number": number,
           "rounds": rounds, "wrapped_us": None, "gemm_us": None, "untuned_us": None,
           "launch_us": None, "added_us": None, "front_us": None, "closure_us": None,
           "tuned_us": None, "host_ns": None, "ok": False, "error": "",
           "signature_guard": signature.implementation(), "config": ""}

    def gemm(tuned: bool):
        return lambda: backends.gemm(a, b, c, activation="relu", backend=name,
                                     allow_tf32=tf32, tuned=tuned)

    calls = {"gemm_us": gemm(True), "untuned_us": gemm(False)}
    try:
        calls["wrapped_us"] = _wrapped(name, p, a, b, c, d)
        launch = bind_launch(a, b, c, activation="relu", backend=name, allow_tf32=tf32)
        calls["launch_us"] = lambda: launch(a, b, c, None)
        for label, call in calls.items():
            for operand in (a, b, c):  # the calls read these tensors: same addresses
                operand.copy_(random_operand(*operand.shape, dtype=dtype, device=device,
                                             generator=generator))
            ref = backends.reference(a, b, c, "relu")
            err = backends.relative_error(call(), ref)
            if not err <= tol:
                raise ValueError(f"{label[:-3]} call: relative error {err:.2e} > {tol:.0e}")
        row["config"] = impl.config()
    except Exception as exc:  # a broken backend is a FAIL row, not the end of the sweep
        row["error"] = f"{type(exc).__name__}: {exc}"
        return row
    slowest = max(_host_us(call, 1, device) for call in calls.values())
    number = row["number"] = max(1, min(number, int(200 * 50 / slowest)))
    samples = {label: [] for label in calls}
    host = []
    order = list(calls)
    for r in range(rounds):  # the order rotates, so no call always runs first or last
        host.append(interpreter_ns())
        for label in order[r % len(order):] + order[:r % len(order)]:
            samples[label].append(_host_us(calls[label], number, device))
    row.update({label: statistics.median(s) for label, s in samples.items()}, ok=True)
    row["host_ns"] = statistics.median(host)
    added = [g - w for g, w in zip(samples["gemm_us"], samples["wrapped_us"])]
    row["added_us"] = statistics.median(added)
    row["added_iqr_us"] = _quartiles(added)
    row["front_us"] = _median_difference(samples, "gemm_us", "launch_us")
    row["closure_us"] = _median_difference(samples, "launch_us", "wrapped_us")
    if impl.pin is not None:
        row["tuned_us"] = _median_difference(samples, "gemm_us", "untuned_us")
    return row


def _median_difference(samples: dict[str, list[float]], minuend: str, subtrahend: str) -> float:
    """The median over rounds of each round's ``minuend`` loop minus its ``subtrahend`` loop."""
    return statistics.median(x - y for x, y in zip(samples[minuend], samples[subtrahend]))


def _quartiles(values: list[float]) -> list[float]:
    """The first and third quartiles of ``values`` (both the value when there is one)."""
    if len(values) < 2:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


def added_text(row: dict, spec: str = ".1f") -> str:
    """``added_us`` and its quartiles, as "2.9 (2.5-3.3)"; "-" when not measured (rows
    recorded before the quartiles were kept show the median alone)."""
    if row.get("added_us") is None:
        return "-"
    iqr = row.get("added_iqr_us")
    text = format(row["added_us"], spec)
    return f"{text} ({iqr[0]:{spec}}-{iqr[1]:{spec}})" if iqr else text


def targets_missed(row: dict) -> list[str]:
    """The targets (``TARGET_*``) a measured row misses, as short phrases."""
    missed = []
    if row["added_us"] > TARGET_ADDED_US:
        iqr = row.get("added_iqr_us")
        noise = " (its quartiles reach below: noise?)" if iqr and iqr[0] <= TARGET_ADDED_US else ""
        missed.append(f"adds {row['added_us']:.1f} > {TARGET_ADDED_US:g} µs{noise}")
    limit = {"triton_fused": TARGET_TRITON_US}.get(
        row["backend"], TARGET_CUDA_US if row["backend"] in CUDA_KERNELS else None)
    if limit is not None and row["gemm_us"] > limit:
        missed.append(f"gemm() {row['gemm_us']:.1f} > {limit:g} µs")
    if row["tuned_us"] is not None and row["tuned_us"] > TARGET_TUNED_US:
        missed.append(f"tuned look-up {row['tuned_us']:.1f} > {TARGET_TUNED_US:g} µs")
    return missed


def plot(rows: list[dict], path) -> None:
    """Host µs per call: the wrapped call and gemm() side by side, per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["ok"]]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.5))
    ys = range(len(shown))
    ax.barh([y + 0.2 for y in ys], [r["wrapped_us"] for r in shown], 0.4, label="wrapped call")
    ax.barh([y - 0.2 for y in ys], [r["gemm_us"] for r in shown], 0.4, label="gemm()")
    ax.set_yticks(list(ys), [f"{r['backend']} {r['dtype']}" for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("host µs per call")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
