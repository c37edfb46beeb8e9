"""``gemmlab study``: how a faster GEMM changes TP scaling, and the compute/communication
trade-off behind it (the engine; the command is ``bench.commands.study``).

**Study.** For each mode in ``--mode`` (strong, weak), communicator in ``--comm``, P in
``--ranks`` (ascending; P = 1 is required: every efficiency is relative to it) and GEMM
backend in ``--backend``, one *point*: ``gemmlab scale <mode>`` of every workload in
``--workload`` (the TP MLP block, the transformer layer; sizes, rules, timing and check in
``bench.scale``) under ``mpiexec -n P``, launched by ``bench.scale_series.run_one`` into
``points/<mode>_<backend>_<comm>/P<P>/``. Every workload is checked before it is timed,
exactly as ``gemmlab scale`` checks it; a FAIL row is kept and reported (``ok`` false, no
times) and never enters an efficiency, a correlation or a chart. A point the machine cannot
run (more ranks than GPUs) is skipped; one that fails (nonzero exit, timeout) ends its
series: the larger P of that mode, backend and communicator are not tried.

Each row is ``gemmlab scale``'s (``step_ms``, ``comm_ms``, ``comm_share``,
``tflops_per_gpu``, ``comm_bytes``, ``flops_per_gpu``, the check's fields) plus, against the
P = 1 row of the same workload, mode, backend and communicator (``with_efficiency``):

- ``efficiency``: strong T(1) / (P T(P)), weak T(1) / T(P), T(P) the step_ms at P; exactly
  1.0 at P = 1; ``speedup`` beside it (``bench.scale_series.scaling``);
- ``p1_tflops_per_gpu``: that P = 1 row's ``tflops_per_gpu`` (TFLOP/s): the model FLOPs of
  a step (every GEMM of forward and backward, attention's QK^T and AV included) over the
  measured P = 1 step, i.e. the backend's per-GPU GEMM rate on this workload with no TP, the
  x-axis of the study.

``summarize`` answers the question numerically, for each workload, mode, communicator and
P > 1 with at least two backends checked and timed there: Pearson's r and Spearman's rho of
efficiency against ``p1_tflops_per_gpu`` across the backends, the least-squares slope
(efficiency per TFLOP/s), and the efficiency and comm share of the slowest and the fastest
backend at P = 1. ``plot`` draws, per workload, mode and communicator, efficiency and comm
share against ``p1_tflops_per_gpu``: one point per backend, one line per P.

**Trade-off** (``--tradeoff``). At one P >= 2, for each partition (each combination of
``--hidden``, ``--ffn-ratio`` and ``--tokens``) and backend: one P = 1 point (strong; at
P = 1 strong and weak are the same problem and no collective is called, so it serves both
modes and every communicator), then one point at P per mode and communicator. Per rank and
per step (``tradeoff_fields``):

- ``comm_bytes`` S, the *bytes communicated*: the bytes of the collectives the checked step
  called on the TP communicator (``bench.scale.recording``), each call's input numel x
  itemsize, summed; nccl-tests' size S of each call. Without sequence parallelism every such
  call is an all-reduce (the row-parallel forward's, the column-parallel backward's dX:
  Megatron-LM's g and f), so S is 2 T h x itemsize for the MLP block and 6 T h x itemsize for
  the layer (q, k and v are separate column-parallel linears, each all-reducing its dX;
  Megatron-LM fuses them: 4 T h). A ring all-reduce moves 2(P-1)/P S bytes out of each rank.
- ``flop_per_byte``: ``flops_per_gpu`` / S, FLOP per byte communicated. For the MLP,
  strong: 12 T h (r h) / P FLOPs over 2 T h x itemsize bytes, 6 r h / (P x itemsize); weak
  (FFN r h P wide): 6 r h / itemsize; neither depends on the tokens.
- ``busbw_GBps``: the point's own bus bandwidth, its recorded collectives replayed alone:
  S x 2(P-1)/P / comm_ms, GB/s = 1e9 bytes/s.

The model (``add_model``), no overlap and bandwidth only (no per-call latency term):

- ``model_compute_ms`` = ``flops_per_gpu`` / R, R = ``p1_tflops_per_gpu``, the same
  workload, partition and backend measured at P = 1 (strong: T(1) / P; weak: T(1));
- ``model_comm_ms`` = S x 2(P-1)/P / B, B = ``model_busbw_GBps``: the highest
  ``busbw_GBps`` of any point of the same communicator in the run (what the largest messages
  reach; a point whose collectives are small sits below it, where latency matters);
- ``model_comm_share`` = comm / (compute + comm) = 1 / (1 + I B / (f R)), with
  I = ``flop_per_byte`` and f = 2(P-1)/P: the FLOP per byte communicated alone sets the share,
  for a given GEMM rate and bandwidth (a faster GEMM, larger R, raises it).

The measured ``comm_share`` is the communication alone over the step; with ``--overlap`` (the
default) part of it hides behind GEMMs, so compare it with the no-overlap model under
``--no-overlap``. ``summarize_tradeoff`` gives, per series, the measured and the modelled comm
share at the lowest and highest FLOP per byte (means over the partitions there: the tokens do
not change it), Spearman's rho of the measured share against FLOP per byte, and the mean
|measured - model|; ``plot_tradeoff`` draws the measured points, the model's value of each
point, and the closed form above as a curve over FLOP per byte at the series' median R.

Sources: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", arXiv:2104.04473: the TP split and its all-reduces (f and g,
sec. 2.3), the tensor-parallel communication per layer and device, 8 b s h (t-1)/t: tensors
of b s h elements all-reduced twice in the forward and twice in the backward pass (sec. 3),
and the model FLOPs (sec. 5.1, ``bench.scale``); the all-reduce bus-bandwidth factor
2(P-1)/P, NVIDIA nccl-tests, doc/PERFORMANCE.md (``bench.comm_bench``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from .comm_bench import COLLECTIVES
from .recording import REPO
from .scale_series import run_one, scaling
from .style import backend_color, flops

# The GEMM backends a study compares by default, by dtype: the ladder's rungs for it, the
# Triton kernel and the libraries (those that cannot run here are skipped, with the reason).
DEFAULT_BACKENDS = {
    "fp32": ("cuda_regblock", "cuda_vec", "cuda_pipelined", "triton_fused", "cublas"),
    "bf16": ("cuda_wmma", "cuda_mma", "cuda_wgmma", "cuda_wgmma_persistent",
             "cuda_wgmma_cluster", "cuda_wgmma_pingpong", "triton_fused", "cublas", "cublaslt"),
}
DEFAULT_BACKENDS["fp16"] = DEFAULT_BACKENDS["bf16"]  # the tensor-core rungs take both


def default_backends(dtype_name: str) -> tuple[str, ...]:
    """``--backend`` when not given, for ``dtype_name`` (fp32, fp16, bf16)."""
    return DEFAULT_BACKENDS[dtype_name]


def default_comms(device_type: str) -> tuple[str, ...]:
    """``--comm`` when not given: the library's collectives and the symmetric-heap ones
    (nccl and symm on GPUs, mpi and symm on CPUs)."""
    return ("nccl", "symm") if device_type == "cuda" else ("mpi", "symm")


def why_not_here(backends: list[str], comms: list[str], dtype_name: str,
                 device_type: str) -> dict[str, dict[str, str | None]]:
    """Why each GEMM backend and each communicator cannot run ``dtype_name`` on
    ``device_type`` (the messages of ``bench.session.check_gemm_backend`` and ``check_comm``),
    or None where it can: ``{"backend": {name: why}, "communicator": {name: why}}``. Asked
    of a child Python process, so that this one, which launches ``mpiexec``, initialises
    neither MPI (``check_comm`` imports mpi4py's MPI for some communicators) nor CUDA.

    Raises:
        subprocess.CalledProcessError, subprocess.TimeoutExpired: the child failed.
    """
    code = ("import json, sys\n"
            "from bench.session import UsageError, check_comm, check_gemm_backend\n"
            "def why(check, name):\n"
            "    try:\n"
            "        check(name, sys.argv[1], sys.argv[2])\n"
            "    except UsageError as exc:\n"
            "        return str(exc)\n"
            "print(json.dumps({kind: {n: why(check, n) for n in names.split(',')} for kind, "
            "check, names in (('backend', check_gemm_backend, sys.argv[3]), "
            "('communicator', check_comm, sys.argv[4]))}))\n")
    out = subprocess.run([sys.executable, "-c", code, dtype_name, device_type,
                          ",".join(backends), ",".join(comms)], capture_output=True, text=True,
                         check=True, cwd=REPO, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def scale_flags(*, workloads: list[str], device_type: str, dtype_name: str, backend: str,
                comm: str, tokens: int, hidden: int, ffn_ratio: int, heads: int, seq: int,
                layer_flags: list[str]) -> list[str]:
    """The ``gemmlab scale`` flags of one point (``layer_flags``: the timing and overlap
    flags every point shares)."""
    return ["--device", device_type, "--dtype", dtype_name, "--workload", ",".join(workloads),
            "--backend", backend, "--comm", comm, "--tokens", str(tokens), "--hidden",
            str(hidden), "--ffn-ratio", str(ffn_ratio), "--heads", str(heads), "--seq",
            str(seq), *layer_flags]


def run_point(mpiexec: list[str], p: int, mode: str, flags: list[str], out: Path,
              timeout: float) -> tuple[str, str, list[dict]]:
    """One point: ``gemmlab scale <mode> <flags>`` on ``p`` ranks into ``out``
    (``bench.scale_series.run_one``); (status, reason, rows), the rows of its results.json
    when it ran (status ``ok``, or ``check_failed`` with FAIL rows among them), else []."""
    status, reason = run_one(mpiexec, p, mode, flags, out, timeout)
    if status not in ("ok", "check_failed"):
        return status, reason, []
    return status, reason, json.loads((out / "results.json").read_text())["rows"]


def point_dir(root: Path, mode: str, backend: str, comm: str, p: int,
              partition: str = "") -> Path:
    """``root/points/<mode>_<backend>_<comm>[_<partition>]/P<p>`` (a ``/`` in a
    communicator's name, ``ring/mpi``, becomes ``-``)."""
    name = "_".join(x for x in (mode, backend, comm.replace("/", "-"), partition) if x)
    return root / "points" / name / f"P{p}"


def timed(row: dict) -> bool:
    """Whether ``row`` passed its check and was timed (a FAIL row has no times)."""
    return row.get("ok", False) and "step_ms" in row


def with_efficiency(mode: str, rows: list[dict], base: dict[str, dict]) -> list[dict]:
    """``rows`` (one point, P = each row's ``P``) with ``speedup``, ``efficiency`` and
    ``p1_tflops_per_gpu`` against ``base``, the P = 1 rows of the same mode, backend and
    communicator by workload (module doc). None where either row is a FAIL or missing."""
    out = []
    for r in rows:
        b = base.get(r["workload"])
        first = b if b is not None and timed(b) else None
        speedup, efficiency = (scaling(mode, r["P"], first["step_ms"], r["step_ms"])
                               if first is not None and timed(r) else (None, None))
        out.append({**r, "speedup": speedup, "efficiency": efficiency,
                    "p1_tflops_per_gpu": None if first is None else first["tflops_per_gpu"]})
    return out


def _or_none(f, *args) -> float | None:
    """``f(*args)``, or None where statistics cannot give it (fewer than two points, or a
    constant input)."""
    try:
        return f(*args)
    except statistics.StatisticsError:
        return None


def _ranks(values: list[float]) -> list[float]:
    """The rank of each value, 1-based, ties sharing their mean rank (for Spearman's rho)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rho: Pearson's r of the ranks; None for fewer than 2 points or a constant."""
    return _or_none(statistics.correlation, _ranks(x), _ranks(y))


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def summarize(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """The study's answer (module doc): one stats dict and one line of text per workload,
    mode, communicator and P > 1, from the checked and timed rows with a P = 1 rate only."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["P"] > 1 and r.get("efficiency") is not None:
            groups.setdefault((r["workload"], r["mode"], r["comm"], r["P"]), []).append(r)
    stats, lines = [], []
    for (workload, mode, comm, p), sub in groups.items():
        sub = sorted(sub, key=lambda r: r["p1_tflops_per_gpu"])
        x = [r["p1_tflops_per_gpu"] for r in sub]
        y = [r["efficiency"] for r in sub]
        fit = _or_none(statistics.linear_regression, x, y)
        ends = {end: {"backend": r["backend"], "p1_tflops_per_gpu": r["p1_tflops_per_gpu"],
                      "efficiency": r["efficiency"], "comm_share": r["comm_share"]}
                for end, r in (("slowest", sub[0]), ("fastest", sub[-1]))}
        s = {"workload": workload, "mode": mode, "comm": comm, "P": p, "n": len(sub),
             "backends": [r["backend"] for r in sub],
             "pearson_r": _or_none(statistics.correlation, x, y), "spearman_rho": spearman(x, y),
             "slope_per_tflops": None if fit is None else fit.slope, **ends}
        stats.append(s)
        head = f"{workload} {mode} {comm} P={p}"
        if len(sub) < 2:
            lines.append(f"{head}: one backend checked and timed ({sub[0]['backend']}), "
                         f"nothing to correlate")
            continue
        slow, fast = ends["slowest"], ends["fastest"]
        slope = "n/a" if fit is None else f"{fit.slope:+.3g}"
        lines.append(
            f"{head}: over {len(sub)} backends, efficiency against the P = 1 TFLOP/s per GPU: "
            f"Pearson r {_signed(s['pearson_r'])}, Spearman rho {_signed(s['spearman_rho'])}, "
            f"slope {slope} per TFLOP/s; slowest {slow['backend']} "
            f"({flops(slow['p1_tflops_per_gpu'])}): efficiency "
            f"{_percent(slow['efficiency'])}, comm share {_percent(slow['comm_share'])}; "
            f"fastest {fast['backend']} ({flops(fast['p1_tflops_per_gpu'])}): efficiency "
            f"{_percent(fast['efficiency'])}, comm share {_percent(fast['comm_share'])}")
    return stats, lines


def _per(rows: list[dict]) -> str:
    return "GPU" if any(r.get("device") == "cuda" for r in rows) else "rank"


def _figure(panels: int, height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(max(panels, 1), 2, figsize=(11, height * max(panels, 1)),
                             squeeze=False)
    return plt, fig, axes


def plot(rows: list[dict], path: Path) -> None:
    """Per workload, mode and communicator, two panels: efficiency and comm share (%)
    against the P = 1 TFLOP/s per GPU (log), one point per backend (its colour, labelled),
    one line per P > 1 through the backends. FAIL rows are not drawn."""
    drawn = [r for r in rows if r["P"] > 1 and r.get("efficiency") is not None]
    keys = list(dict.fromkeys((r["workload"], r["mode"], r["comm"]) for r in drawn))
    ps = sorted({r["P"] for r in drawn})
    plt, fig, axes = _figure(len(keys), 3.6)
    if not keys:
        axes[0][0].text(0.5, 0.5, "no checked point at P > 1", ha="center",
                        transform=axes[0][0].transAxes)
    styles = ("-", "--", ":", "-.")
    for (eff, share), key in zip(axes, keys):
        eff.axhline(100, color="k", linewidth=0.8, label="ideal")
        for i, p in enumerate(ps):
            sub = sorted((r for r in drawn if (r["workload"], r["mode"], r["comm"]) == key
                          and r["P"] == p), key=lambda r: r["p1_tflops_per_gpu"])
            x = [r["p1_tflops_per_gpu"] for r in sub]
            for ax, field in ((eff, "efficiency"), (share, "comm_share")):
                y = [100 * r[field] for r in sub]
                ax.plot(x, y, color="0.4", linestyle=styles[i % len(styles)],
                        label=f"P = {p}")
                ax.scatter(x, y, c=[backend_color(r["backend"]) for r in sub], zorder=3)
                if i == 0:  # each backend named once per panel
                    for r, xi, yi in zip(sub, x, y):
                        ax.annotate(r["backend"], (xi, yi), fontsize=7,
                                    textcoords="offset points", xytext=(3, 3))
        for ax, label in ((eff, "scaling efficiency (%)"), (share, "comm share (%)")):
            ax.set_xscale("log")
            ax.margins(x=0.15)  # room for the labels of the end points
            ax.set_xlabel(f"TFLOP/s per {_per(drawn)} at P = 1")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        eff.set_title(f"{key[0]}, {key[1]} scaling, {key[2]}: efficiency", fontsize=10)
        share.set_title(f"{key[0]}, {key[1]} scaling, {key[2]}: communication share",
                        fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tradeoff_fields(row: dict, p1_tflops: float | None) -> dict:
    """``row`` (a point at P >= 2) with ``p1_tflops_per_gpu`` (the P = 1 rate, None without
    a checked one), ``flop_per_byte`` and its own ``busbw_GBps`` (module doc; None for a FAIL
    row)."""
    out = {**row, "p1_tflops_per_gpu": p1_tflops, "flop_per_byte": None, "busbw_GBps": None}
    if timed(row):
        factor = COLLECTIVES["all_reduce"].factor(row["P"])
        out |= {"flop_per_byte": row["flops_per_gpu"] / row["comm_bytes"],
                "busbw_GBps": row["comm_bytes"] * factor / (row["comm_ms"] * 1e-3) / 1e9}
    return out


def add_model(rows: list[dict]) -> None:
    """Add the model's fields (module doc) to every trade-off row, in place:
    ``model_busbw_GBps`` (the highest busbw_GBps of its communicator), ``model_compute_ms``,
    ``model_comm_ms`` and ``model_comm_share``; None for a FAIL row or one without a P = 1
    rate."""
    best: dict[str, float] = {}
    for r in rows:
        if r["busbw_GBps"] is not None:
            best[r["comm"]] = max(best.get(r["comm"], 0.0), r["busbw_GBps"])
    for r in rows:
        r |= {"model_busbw_GBps": best.get(r["comm"]), "model_compute_ms": None,
              "model_comm_ms": None, "model_comm_share": None}
        if r["busbw_GBps"] is None or r["p1_tflops_per_gpu"] is None:
            continue
        compute = r["flops_per_gpu"] / (r["p1_tflops_per_gpu"] * 1e12) * 1e3
        comm = (r["comm_bytes"] * COLLECTIVES["all_reduce"].factor(r["P"])
                / (r["model_busbw_GBps"] * 1e9) * 1e3)
        r |= {"model_compute_ms": compute, "model_comm_ms": comm,
              "model_comm_share": comm / (compute + comm)}


MODEL = {
    "bytes_communicated": "comm_bytes: per rank and step, the input bytes (numel x itemsize) "
                          "of every collective the checked step called on the TP communicator, "
                          "summed (all all-reduces without sequence parallelism)",
    "flop_per_byte": "flops_per_gpu / comm_bytes",
    "busbw_GBps": "comm_bytes x 2(P-1)/P / comm_ms (the point's collectives replayed alone)",
    "model_compute_ms": "flops_per_gpu / p1_tflops_per_gpu (same workload, partition, "
                        "backend at P = 1)",
    "model_comm_ms": "comm_bytes x 2(P-1)/P / model_busbw_GBps (the highest busbw_GBps of the "
                     "communicator in this run); no latency term",
    "model_comm_share": "model_comm_ms / (model_compute_ms + model_comm_ms), no overlap",
    "sources": ["Narayanan et al. 2021, arXiv:2104.04473, sec. 2.3, 3 and 5.1",
                "NVIDIA nccl-tests, doc/PERFORMANCE.md (all-reduce busbw factor 2(P-1)/P)"],
}


def summarize_tradeoff(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Per workload, mode, backend and communicator (module doc): one stats dict and one
    line, from the rows with a model (checked, timed, with a P = 1 rate)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("model_comm_share") is not None:
            groups.setdefault((r["workload"], r["mode"], r["backend"], r["comm"], r["P"]),
                              []).append(r)
    stats, lines = [], []
    for (workload, mode, backend, comm, p), sub in groups.items():
        x = [r["flop_per_byte"] for r in sub]
        ends = (min(x), max(x))

        def at(end, field):
            return statistics.fmean(r[field] for r in sub if r["flop_per_byte"] == end)

        s = {"workload": workload, "mode": mode, "backend": backend, "comm": comm, "P": p,
             "n": len(sub), "flop_per_byte": list(ends),
             "comm_share": [at(e, "comm_share") for e in ends],
             "model_comm_share": [at(e, "model_comm_share") for e in ends],
             "spearman_rho": spearman(x, [r["comm_share"] for r in sub]),
             "mean_abs_model_error": statistics.fmean(
                 abs(r["comm_share"] - r["model_comm_share"]) for r in sub),
             "model_busbw_GBps": sub[0]["model_busbw_GBps"]}
        stats.append(s)
        (lo, hi), (mlo, mhi) = s["comm_share"], s["model_comm_share"]
        lines.append(
            f"{workload} {mode} {backend} {comm} P={p}: comm share {_percent(lo)} at "
            f"{ends[0]:.3g} FLOP/B -> {_percent(hi)} at {ends[1]:.3g} FLOP/B over {len(sub)} "
            f"partitions (Spearman rho {_signed(s['spearman_rho'])}); model {_percent(mlo)} -> "
            f"{_percent(mhi)} at busbw {s['model_busbw_GBps']:.3g} GB/s, mean |measured - "
            f"model| {s['mean_abs_model_error']:.0%}")
    return stats, lines


def plot_tradeoff(rows: list[dict], path: Path) -> None:
    """Comm share (%) against FLOP per byte communicated (log), one panel per workload and
    mode, one colour per backend and one marker per communicator: the measured points
    (filled), the model's value of each point (hollow) and the model's closed form at the
    series' median P = 1 rate (dashed; module doc). FAIL rows are not drawn."""
    import numpy as np

    drawn = [r for r in rows if r.get("flop_per_byte") is not None]
    keys = list(dict.fromkeys((r["workload"], r["mode"]) for r in drawn))
    plt, fig, axes = _figure((len(keys) + 1) // 2, 4.0)
    flat = [ax for pair in axes for ax in pair]
    if not keys:
        flat[0].text(0.5, 0.5, "no checked point", ha="center", transform=flat[0].transAxes)
    markers = "os^Dv"
    comms = list(dict.fromkeys(r["comm"] for r in drawn))
    for ax, key in zip(flat, keys):
        sub = [r for r in drawn if (r["workload"], r["mode"]) == key]
        for backend, comm in dict.fromkeys((r["backend"], r["comm"]) for r in sub):
            series = [r for r in sub if (r["backend"], r["comm"]) == (backend, comm)]
            colour, marker = backend_color(backend), markers[comms.index(comm) % len(markers)]
            ax.plot([r["flop_per_byte"] for r in series],
                    [100 * r["comm_share"] for r in series], linestyle="none", marker=marker,
                    color=colour, label=f"{backend}, {comm}: measured")
            modelled = [r for r in series if r.get("model_comm_share") is not None]
            if not modelled:
                continue
            ax.plot([r["flop_per_byte"] for r in modelled],
                    [100 * r["model_comm_share"] for r in modelled], linestyle="none",
                    marker=marker, markerfacecolor="none", color=colour,
                    label=f"{backend}, {comm}: model")
            rate = statistics.median(r["p1_tflops_per_gpu"] for r in modelled) * 1e12
            bandwidth = modelled[0]["model_busbw_GBps"] * 1e9
            factor = COLLECTIVES["all_reduce"].factor(modelled[0]["P"])
            x = np.geomspace(min(r["flop_per_byte"] for r in series) / 1.5,
                             max(r["flop_per_byte"] for r in series) * 1.5, 50)
            ax.plot(x, 100 / (1 + x * bandwidth / (factor * rate)), linestyle="--",
                    color=colour, linewidth=1, label=f"{backend}, {comm}: model, median rate")
        ax.set_xscale("log")
        ax.set_xlabel("FLOP per byte communicated (per rank, per step)")
        ax.set_ylabel("comm share (%)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"{key[0]}, {key[1]} sizes, P = {sub[0]['P']}", fontsize=10)
    for ax in flat[max(len(keys), 1):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
