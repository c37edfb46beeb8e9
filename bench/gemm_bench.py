"""``gemmlab bench``: every backend of the ladder, checked, then timed, against the best
baseline in the same run.

For each shape x dtype x epilogue the same fresh random A, B and C feed every backend. Each
backend first writes D (by default ReLU(A @ B + C)) into an output poisoned with NaN and is
compared with the float64 reference (relative Frobenius error, tolerance by dtype, every
element written); only a backend that passes is timed. Each timed row has a kernel time
(CUDA-graph replay, the host excluded; its graph's output is checked again) and a call time
(one eager call to an idle GPU, the host included; ``bench.timing``), and from the kernel
time TFLOP/s = 2*M*N*K / t, the percentage of the best cuBLAS (the faster of ``cublas`` and
``cublaslt`` on the same problem in the same run), the speedup over ``torch_compile`` and
over ``torch_unfused``. A row whose call time exceeds its kernel time by more than
``LAUNCH_BOUND`` is marked launch-bound: calling it costs more than its kernel.
The layout follows karpathy/llm.c ``dev/cuda`` (validate every version, then time it,
napkin math beside each time) and siboehm/SGEMM_CUDA (GFLOP/s and % of cuBLAS per step).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

import backends
from backends import dtypes
from backends.cuda import use_launcher
from backends.registry import CUDA_KERNELS

from .style import backend_color
from .timing import SETTLE_MS, call_samples, kernel_samples

GPU_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
              (8192, 8192, 1024), (16384, 4096, 512), (4096, 4096, 256)]
# The CPU functional check: odd shapes that are not multiples of any tile size.
CPU_SHAPES = [(127, 129, 65), (256, 256, 256)]
# Epilogue name -> (C: full (M, N), bias (N,) or none; activation). relu_c is the project's op.
EPILOGUES = {"relu_c": ("full", "relu"), "c": ("full", None), "relu_bias": ("bias", "relu"),
             "bias": ("bias", None), "none": (None, None)}
# A row is launch-bound when its call time exceeds its kernel time by more than this share.
LAUNCH_BOUND = 0.20
# The baselines the reference column picks the faster of.
CUBLAS_BASELINES = ("cublas", "cublaslt")
FORMULAS = {"relu_c": "ReLU(A @ B + C)", "c": "A @ B + C", "relu_bias": "ReLU(A @ B + bias)",
            "bias": "A @ B + bias", "none": "A @ B"}


@dataclass(frozen=True)
class Timing:
    """Timing knobs (see ``bench.timing``). ``rounds``: how many times every row of one
    (shape, dtype) is timed, the rows taking turns, so that a drift of the GPU's clocks
    (power, heat) spreads over all of them instead of favouring the rows timed first; the
    first round takes the rows in the sweep's order and each later one in a shuffled order
    (``random.Random(round)``: the same for every run), so that no row always runs first or
    always right after the same one; a row's times are the medians of its rounds' medians.
    ``timing``: what the primary time (``ms``, TFLOP/s, the ratios) is: ``"graph"`` (kernel
    time from CUDA-graph replay) or ``"eager"`` (``do_bench`` of the eager call).
    ``warmup_ms``: back-to-back calls before a row's kernel-time samples, in every round
    (``bench.timing.SETTLE_MS`` by default: the GPU at its sustained clock)."""

    warmup_ms: float = SETTLE_MS
    rep_ms: float = 100
    min_reps: int = 10
    rounds: int = 1
    timing: str = "graph"


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"4096"`` -> (4096, 4096, 4096); ``"16384x4096x512"`` -> (M, N, K).

    Raises:
        ValueError: not one positive int or three joined by ``x``.
    """
    parts = text.lower().split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"shape {text!r} is not N or MxNxK") from None
    if len(dims) == 1:
        dims *= 3
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"shape {text!r} is not N or MxNxK with positive sizes")
    return dims[0], dims[1], dims[2]


def needed_bytes(m: int, n: int, k: int, dtype_name: str, epilogues=("relu_c",)) -> int:
    """Bytes one (shape, dtype) of the sweep holds at least at once: A and B, per epilogue a C
    and its float64 reference (kept for the CUDA graph's check), the float64 copies of A and
    B while a reference is computed, the poisoned output and a D."""
    size = dtypes.DTYPES[dtype_name].itemsize
    per_epilogue = {"full": m * n * size, "bias": n * size, None: 0}
    return (size * (m * k + k * n) + 8 * (m * k + k * n) + 2 * size * m * n
            + sum(per_epilogue[EPILOGUES[e][0]] + 8 * m * n for e in epilogues))


def free_bytes(device: torch.device) -> int:
    """Memory free for tensors on ``device``: the GPU's free memory, or the host's available
    memory (``MemAvailable`` of /proc/meminfo, else free physical pages)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def too_large(shapes, dtype_names: list[str], device: torch.device,
              epilogues=("relu_c",)) -> str | None:
    """Why the largest (shape, dtype) does not fit in ``device``'s free memory, or None."""
    need, (m, n, k), dtype_name = max(
        (needed_bytes(*shape, d, epilogues), shape, d) for shape in shapes for d in dtype_names)
    free = free_bytes(device)
    if need <= free:
        return None
    where = "on the GPU" if device.type == "cuda" else "in host memory"
    return (f"shape {m}x{n}x{k} {dtype_name} needs at least {need / 1e9:.1f} GB for its "
            f"operands, outputs and float64 references; {free / 1e9:.1f} GB is free {where}")


def runnable(names: list[str], say) -> list[str]:
    """``names`` less the backends that cannot run on this machine, each reported through
    ``say`` with the reason."""
    status = {s.name: s for s in backends.available()}
    for name in names:
        if not status[name].runs:
            say(f"skipped {name}: {status[name].reason}")
    return [n for n in names if status[n].runs]


def unsupported(backend: backends.Backend, dtype_name: str, device: torch.device) -> str | None:
    """Why ``backend`` does not take this dtype (``tf32`` = fp32 with TF32 on) on ``device``,
    or None when it does."""
    d = dtypes.DTYPES[dtype_name]
    if device.type not in backend.devices:
        return f"runs on {', '.join(backend.devices)}, not {device.type}"
    if d.torch not in backend.dtypes:
        takes = ", ".join(dtypes.name_of(t) for t in backend.dtypes) or "no dtype"
        return f"takes {takes} here, not {dtype_name}"
    if d.tf32 and not backend.tf32:
        return "has no TF32 mode"
    if d.tf32 and device.type != "cuda":
        return "TF32 needs a GPU"
    return None


def nothing_runs(names: list[str], dtype_names: list[str], device: torch.device) -> str:
    """The message for a selection of which nothing runs on ``device``: why, for each
    requested backend (cannot run here) or (backend, dtype) pair (not supported)."""
    reasons = []
    for name in names:
        backend = backends.BACKENDS[name]
        if (why := backend.unavailable()) is not None:
            reasons.append(f"{name}: {why}")
            continue
        reasons += [f"{name} {d}: {unsupported(backend, d, device)}" for d in dtype_names]
    return "nothing to run here; " + "; ".join(reasons)


def supports(backend: backends.Backend, dtype_name: str, device: torch.device) -> bool:
    """Whether ``backend`` takes this dtype (``tf32`` = fp32 with TF32 on) on ``device``."""
    return unsupported(backend, dtype_name, device) is None


def random_operand(*shape, dtype: torch.dtype, device: torch.device,
                   generator: torch.Generator) -> torch.Tensor:
    """Fresh standard-normal values: never zeros, signs mixed so a ReLU cuts about half of D."""
    return torch.randn(shape, generator=generator, device=device).to(dtype)


class Checked(NamedTuple):
    """A row after its check: the call to time and how to check the D of its CUDA graph
    (both None when the row failed)."""

    row: dict
    call: Callable[[], object] | None
    verify: Callable[[torch.Tensor], str | None] | None


def check(name: str, a, b, c, ref, dtype_name: str, epilogue: str,
          launcher: str = "") -> Checked:
    """One row: ``name`` checked against ``ref`` on a poisoned output. ``launcher`` (CUDA C
    backends only): ``"cupy"`` or ``"pycuda"``; the call must then run inside
    ``use_launcher(launcher)``."""
    tf32 = dtypes.DTYPES[dtype_name].tf32
    activation = EPILOGUES[epilogue][1]
    m, n, k = a.shape[0], b.shape[1], a.shape[1]
    row = {"backend": name, "launcher": launcher, "dtype": dtype_name, "epilogue": epilogue,
           "M": m, "N": n, "K": k, "ms": None, "tflops": None, "kernel_ms": None,
           "call_ms": None, "host_us": None, "launch_bound": None, "timing": "",
           "samples": None, "kernel_ms_rounds": None, "pct_best_cublas": None,
           "best_cublas": None,
           "x_torch_compile": None, "speedup_vs_torch_unfused": None, "rel_err": None,
           "tol": dtypes.DTYPES[dtype_name].tolerance, "ok": False, "config": "", "error": ""}
    out = torch.full((m, n), float("nan"), dtype=a.dtype, device=a.device)

    def call(out=None):
        return backends.gemm(a, b, c, activation=activation, backend=name, out=out,
                             allow_tf32=tf32)

    with use_launcher(launcher) if launcher else contextlib.nullcontext():
        try:
            call(out)
        except Exception as exc:  # a broken backend is a FAIL row, not the end of the sweep
            row["error"] = f"{type(exc).__name__}: {exc}"
            return Checked(row, None, None)
        err = backends.relative_error(out, ref)
        row.update(rel_err=err, ok=err <= row["tol"], config=backends.BACKENDS[name].config())
    if not row["ok"]:
        return Checked(row, None, None)

    def verify(d) -> str | None:
        """The graph's D against the same reference and tolerance."""
        err = backends.relative_error(d, ref)
        return None if err <= row["tol"] else f"relative error {err:.2e} > {row['tol']:.0e}"

    return Checked(row, call, verify)


def time_rows(checked: list[Checked], device: torch.device, timing: Timing) -> None:
    """Fill the times of every row that passed its check, timing the rows in turn
    ``timing.rounds`` times (``Timing``): ``kernel_ms`` and ``call_ms`` (medians of the
    rounds' medians, GPU only), ``ms`` (the primary: kernel time), ``kernel_ms_rounds`` (each
    round's median kernel time, in the rounds' order: how far apart they are is the run's
    spread), ``timing`` (how the kernel time was taken), ``host_us`` (call minus kernel),
    ``launch_bound``, ``samples`` (per round, of the kernel time) and ``tflops``. A row whose
    CUDA graph gives a wrong D is turned into a FAIL and left untimed."""
    knobs = {"warmup_ms": timing.warmup_ms, "rep_ms": timing.rep_ms,
             "min_reps": timing.min_reps}
    timed = [entry for entry in checked if entry.call is not None]
    kernel: list[list[float]] = [[] for _ in timed]
    calls: list[list[float]] = [[] for _ in timed]
    turns = list(zip(timed, kernel, calls))
    for r in range(timing.rounds):
        order = turns if r == 0 else random.Random(r).sample(turns, len(turns))
        for (row, call, verify), k_times, c_times in order:
            if not row["ok"]:
                continue
            with use_launcher(row["launcher"]) if row["launcher"] else contextlib.nullcontext():
                try:
                    samples, how = kernel_samples(call, device, timing=timing.timing,
                                                  verify=verify, **knobs)
                except ValueError as exc:
                    row.update(ok=False, error=str(exc))
                    continue
                row["timing"], row["samples"] = how, len(samples)
                k_times.append(statistics.median(samples))
                if device.type == "cuda":
                    c_times.append(statistics.median(call_samples(
                        call, device, rep_ms=timing.rep_ms, min_reps=timing.min_reps)))
    for (row, _, _), k_times, c_times in zip(timed, kernel, calls):
        if not row["ok"]:
            continue
        ms = statistics.median(k_times)
        row.update(ms=ms, kernel_ms=ms, kernel_ms_rounds=k_times,
                   tflops=2 * row["M"] * row["N"] * row["K"] / (ms * 1e-3) / 1e12)
        if c_times:
            call_ms = statistics.median(c_times)
            row.update(call_ms=call_ms, host_us=(call_ms - ms) * 1e3,
                       launch_bound=call_ms > (1 + LAUNCH_BOUND) * ms)


def add_ratios(rows: list[dict]) -> None:
    """Fill, within each (shape, dtype, epilogue), the % of the best cuBLAS (and which one),
    the speedup over torch_compile and over torch_unfused, all from the primary times."""
    def key(r):
        return r["M"], r["N"], r["K"], r["dtype"], r["epilogue"]
    base = {(key(r), r["backend"]): r["ms"] for r in rows if r["ms"] is not None}
    for r in rows:
        if r["ms"] is None:
            continue
        cublas = [(base[key(r), b], b) for b in CUBLAS_BASELINES if (key(r), b) in base]
        if cublas:
            best_ms, best = min(cublas)
            # The ratio first, so the best row itself is exactly 100.
            r.update(pct_best_cublas=100 * (best_ms / r["ms"]), best_cublas=best)
        if (compiled := base.get((key(r), "torch_compile"))) is not None:
            r["x_torch_compile"] = compiled / r["ms"]
        if (unfused := base.get((key(r), "torch_unfused"))) is not None:
            r["speedup_vs_torch_unfused"] = unfused / r["ms"]


def launchers_of(name: str, launchers: tuple[str, ...]) -> tuple[str, ...]:
    """The launchers a backend runs under: each of ``launchers`` for a CUDA C kernel, one
    unnamed (``""``) for the others."""
    return launchers if name in CUDA_KERNELS else ("",)


def run_sweep(names: list[str], shapes: list[tuple[int, int, int]], dtype_names: list[str],
              device: torch.device, timing: Timing, seed: int = 0,
              epilogues: tuple[str, ...] = ("relu_c",), progress=None,
              launchers: tuple[str, ...] = ("cupy",),
              record: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Check and time every (shape, dtype, epilogue, backend) the backend supports on ``device``;
    the CUDA C backends once per launcher in ``launchers``.

    Every backend of one (shape, dtype, epilogue) sees the same fresh random inputs. All rows
    of one (shape, dtype) are checked first, then timed together (``time_rows``).
    ``progress``, if given, is called with a short description before each row is checked;
    ``record``, if given, with the rows of each (shape, dtype) once they are timed, ratios
    filled. Returns rows in sweep order with ratios filled.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for m, n, k in shapes:
        for dtype_name in dtype_names:
            chosen = [x for x in names if supports(backends.BACKENDS[x], dtype_name, device)]
            if not chosen:
                continue
            dtype = dtypes.DTYPES[dtype_name].torch
            a = random_operand(m, k, dtype=dtype, device=device, generator=generator)
            b = random_operand(k, n, dtype=dtype, device=device, generator=generator)
            checked = []  # every epilogue's rows of this (shape, dtype), timed together below
            for epilogue in epilogues:
                c_kind, activation = EPILOGUES[epilogue]
                c_shape = {"full": (m, n), "bias": (n,), None: None}[c_kind]
                c = None if c_shape is None else random_operand(
                    *c_shape, dtype=dtype, device=device, generator=generator)
                ref = backends.reference(a, b, c, activation)
                for name in chosen:
                    for launcher in launchers_of(name, launchers):
                        if progress is not None:
                            progress(f"{name} {launcher} {dtype_name} {FORMULAS[epilogue]} "
                                     f"{m}x{n}x{k}")
                        checked.append(check(name, a, b, c, ref, dtype_name, epilogue,
                                             launcher))
            time_rows(checked, device, timing)
            finished = [entry.row for entry in checked]
            add_ratios(finished)  # the ratios compare rows of one (shape, dtype, epilogue)
            rows += finished
            if record is not None:
                record(finished)
    return rows


def describe(row: dict) -> str:
    """A row in one line: backend (and launcher), dtype, op, shape, then its TFLOP/s or FAIL."""
    name = f"{row['backend']} {row['launcher']}".rstrip()
    what = f"{name} {row['dtype']} {FORMULAS[row['epilogue']]} {row['M']}x{row['N']}x{row['K']}"
    if not row["ok"]:
        return f"{what}: FAIL"
    return f"{what}: {fmt(row['tflops'], '.3g')} TFLOP/s"


def count_rows(names, shapes, dtype_names, device, epilogues=("relu_c",),
               launchers=("cupy",)) -> int:
    """How many rows ``run_sweep`` will produce (for the progress bar)."""
    return len(shapes) * len(epilogues) * sum(
        len(launchers_of(x, launchers)) * supports(backends.BACKENDS[x], d, device)
        for x in names for d in dtype_names)


def plot(rows: list[dict], path: Path) -> None:
    """TFLOP/s per backend and shape, one panel per (dtype, epilogue); failed rows left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["dtype"], r["epilogue"]) for r in rows))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for ax, (dtype_name, epilogue) in zip(axes[:, 0], panels):
        sub = [r for r in rows if (r["dtype"], r["epilogue"]) == (dtype_name, epilogue)]
        shapes = list(dict.fromkeys(f"{r['M']}x{r['N']}x{r['K']}" for r in sub))
        names = list(dict.fromkeys(r["backend"] for r in sub))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            by_shape = {f"{r['M']}x{r['N']}x{r['K']}": r["tflops"] for r in sub
                        if r["backend"] == name and r["tflops"] is not None}
            xs = [j + i * width for j, s in enumerate(shapes) if s in by_shape]
            ax.bar(xs, [by_shape[s] for s in shapes if s in by_shape], width, label=name,
                   color=backend_color(name))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, fontsize=8)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"D = {FORMULAS[epilogue]}, {dtype_name}", fontsize=10)
        ax.legend(fontsize=7, ncol=3)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(value, spec: str) -> str:
    """Table cell: ``-`` for a missing value."""
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else format(value, spec)

