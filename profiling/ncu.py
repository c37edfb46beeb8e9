"""Nsight Compute sessions: ``gemmlab profile ncu -- <command>``.

One session runs the command under ``ncu`` with the sections a kernel study needs, keeps the
report, exports its raw page as CSV and turns it into one row per profiled kernel::

    ncu --clock-control none --nvtx --nvtx-include "gemmlab@cuda_regblock/" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section SpeedOfLight_RooflineChart --metrics <EXTRA_METRICS> \
        -o <out>/report -f <command...>
    ncu --import <out>/report.ncu-rep --csv --page raw --print-units base

``--clock-control none`` leaves the GPU at its own clocks (the machines are shared, and the
bench measures at those clocks); the trailing slash of the NVTX filter selects push/pop
ranges, which is what ``profiling.nvtx.annotate`` opens. Metric names come from the section
files of Nsight Compute 2025.3 (``sections/*.section``) and its Profiling Guide; each hardware
metric was checked against ``ncu --query-metrics --chip gh100`` on the H200 machine, which
matters because ncu drops an unknown ``--metrics`` name without a word
(``tests/fixtures/profiling/README.md``).

Achieved FLOPs are counted the way the roofline sections count them, from the predicated-on
thread-instruction counters (``SpeedOfLight_RooflineChart``: FADD + FMUL + 2 FFMA, and the
same for doubles; ``SpeedOfLight_HierarchicalHalfRooflineChart``: 2 HADD + 2 HMUL + 4 HFMA, the
half instructions being two-wide), plus the tensor-core datapath's counters by source type
(``sm__ops_path_tensor_src_*``, one count per FLOP: on the H200 a 2048^3 GEMM counted
2 * 2048^3 there, for ``mma.sync`` and ``wgmma`` kernels alike)::

    FLOP = fadd + fmul + 2 ffma + 2 (hadd + hmul) + 4 hfma + dadd + dmul + 2 dfma + tensor ops
    FLOP/s = FLOP / gpu__time_duration

(the integer tensor paths, ``sm__ops_path_tensor_src_int*``, are not FLOPs and are left out).
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from pathlib import Path

from .nvtx import DOMAIN

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
            "SpeedOfLight_RooflineChart")

# Report columns: metric name -> row key. Units are ncu's base units (--print-units base).
DURATION = "gpu__time_duration.sum"  # ns (SpeedOfLight)
COLUMNS = {
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",  # SpeedOfLight
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",  # Occupancy
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers",  # LaunchStats
    "launch__shared_mem_per_block_static": "smem_static_bytes",
    "launch__shared_mem_per_block_dynamic": "smem_dynamic_bytes",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
    "dram__bytes_read.sum": "dram_read_bytes",  # MemoryWorkloadAnalysis tables
    "dram__bytes_write.sum": "dram_write_bytes",
}
_OP = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
# Per precision: FLOPs per predicated-on thread instruction, as the roofline sections weigh them.
INSTRUCTION_FLOPS = {
    "flop_fp32": {_OP.format("fadd"): 1, _OP.format("fmul"): 1, _OP.format("ffma"): 2},
    "flop_fp16": {_OP.format("hadd"): 2, _OP.format("hmul"): 2, _OP.format("hfma"): 4},
    "flop_fp64": {_OP.format("dadd"): 1, _OP.format("dmul"): 1, _OP.format("dfma"): 2},
}
TENSOR_OPS = tuple(f"sm__ops_path_tensor_src_{path}.sum" for path in (
    "fp16", "bf16_dst_fp32", "tf32_dst_fp32", "fp64", "fp8"))
FLOP_COUNTERS = {**INSTRUCTION_FLOPS, "flop_tensor": dict.fromkeys(TENSOR_OPS, 1)}
# Collected on top of the sections: the roofline sections read these counters only as
# per-cycle rates, and DRAM bytes split by direction.
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum",
                 *(name for weights in FLOP_COUNTERS.values() for name in weights))


class ToolMissing(RuntimeError):
    """A profiler executable is not on PATH."""


WHERE = {"ncu": "install Nsight Compute (CUDA toolkits ship it) or put its ncu on PATH",
         "nsys": "install Nsight Systems, or put the nsys inside Nsight Compute "
                 "(<nsight-compute>/host/target-linux-x64/nsys) on PATH"}


def require(tool: str) -> str:
    """The path of ``tool`` (``ncu`` or ``nsys``) on PATH.

    Raises:
        ToolMissing: with a one-line message naming the tool and where to get it.
    """
    path = shutil.which(tool)
    if path is None:
        raise ToolMissing(f"{tool} not found on PATH: {WHERE[tool]}")
    return path


def nvtx_filter(range_name: str | None) -> str:
    """The ``--nvtx-include`` value selecting push/pop range ``range_name`` in domain
    ``gemmlab``, or any gemmlab range when None (ncu's ``regex:`` form)."""
    if range_name is None:
        return f"regex:{DOMAIN}@.+/"
    return f"{DOMAIN}@{range_name}/"


def build_command(command: list[str], report: str | Path, *, ranges: list[str] | None = None,
                  sections: tuple[str, ...] = SECTIONS, launch_count: int | None = None,
                  kernel_name: str | None = None, metrics: tuple[str, ...] = EXTRA_METRICS,
                  ncu: str = "ncu") -> list[str]:
    """The ``ncu`` command line profiling ``command`` into ``<report>.ncu-rep``.

    ``ranges``: NVTX push/pop ranges of domain gemmlab to profile (one ``--nvtx-include``
    each; None: every gemmlab range). ``launch_count``: profile at most that many kernels
    (``--launch-count``). ``kernel_name``: ncu's ``--kernel-name`` filter (a name, or
    ``regex:...``). ``metrics``: collected on top of the sections (ncu drops a name the GPU
    does not have without a word, so check new names with ``ncu --query-metrics``).

    Raises:
        ValueError: an empty command.
    """
    if not command:
        raise ValueError("no command to profile: give it after --")
    argv = [ncu, "--clock-control", "none", "--nvtx"]
    for name in ranges or [None]:
        argv += ["--nvtx-include", nvtx_filter(name)]
    for section in sections:
        argv += ["--section", section]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    if launch_count is not None:
        argv += ["--launch-count", str(launch_count)]
    if kernel_name is not None:
        argv += ["--kernel-name", kernel_name]
    return [*argv, "-o", str(report), "-f", *command]


def export_command(report: str | Path, ncu: str = "ncu") -> list[str]:
    """The command printing the raw page of ``report`` (a ``.ncu-rep``) as CSV in base units
    (ns, bytes, %), one row per profiled kernel."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


def _number(text: str) -> float | None:
    """A raw-page value as a float; None for ``n/a`` or an empty cell."""
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def _nvtx_range(row: dict[str, str]) -> str | None:
    """The gemmlab push/pop ranges a kernel ran in, joined by " > " in the order ncu lists the
    stack, from the raw page's ``thread Domain:Push/Pop_Range:...`` column (present when ncu
    ran with ``--nvtx``), whose cell reads ``<tid>  "gemmlab:<range>:<payload type>:..."``."""
    for key, value in row.items():
        if "Push/Pop_Range" in key:
            names = [entry.split(":")[1] for entry in re.findall(r'"([^"]*)"', value)
                     if entry.startswith(f"{DOMAIN}:")]
            return " > ".join(names) or None
    return None


def parse_raw_csv(text: str) -> list[dict]:
    """One row per profiled kernel from ``ncu --import R --csv --page raw --print-units base``.

    The CSV has a header row of metric names, a row of units, then one row per kernel.
    Returned keys: ``id``, ``kernel``, ``range`` (the gemmlab NVTX range, or None),
    ``duration_us``, ``sm_pct``, ``memory_pct``, ``dram_pct`` (% of peak sustained),
    ``achieved_occupancy_pct``, ``theoretical_occupancy_pct``, ``registers`` (per thread),
    ``smem_static_bytes``, ``smem_dynamic_bytes`` (per block), ``grid_size``, ``block_size``,
    ``dram_read_bytes``, ``dram_write_bytes``, ``flop`` (the module docstring's formula; its
    parts as ``flop_fp32``, ``flop_fp16``, ``flop_fp64``, ``flop_tensor``) and ``tflops``
    (FLOP / duration, 1e12/s). A metric the report lacks gives None.

    Raises:
        ValueError: the text has no ``ID`` / ``Kernel Name`` header, or a unit row that says
            the duration is not in nanoseconds (export without ``--print-units base``).
    """
    lines = list(csv.reader(io.StringIO(text)))
    start = next((i for i, line in enumerate(lines) if line[:1] == ["ID"]), None)
    if start is None or "Kernel Name" not in lines[start]:
        raise ValueError("not an ncu raw-page CSV: no header row starting with \"ID\" "
                         "and naming \"Kernel Name\"")
    header, units = lines[start], lines[start + 1]
    unit = dict(zip(header, units))
    if unit.get(DURATION, "ns") not in ("ns", "nsecond"):
        raise ValueError(f"{DURATION} is in {unit[DURATION]!r}, expected ns: export with "
                         "--print-units base")
    rows = []
    for values in lines[start + 2:]:
        if len(values) != len(header):  # a blank or cut-off line
            continue
        raw = dict(zip(header, values))
        num = {key: _number(value) for key, value in raw.items()}
        duration_ns = num.get(DURATION)
        out = {"id": int(raw["ID"]), "kernel": raw["Kernel Name"], "range": _nvtx_range(raw),
               "duration_us": None if duration_ns is None else duration_ns / 1e3}
        out |= {key: num.get(metric) for metric, key in COLUMNS.items()}
        out |= flops(num)
        out["tflops"] = (None if out["flop"] is None or not duration_ns
                         else out["flop"] / (duration_ns * 1e-9) / 1e12)
        rows.append(out)
    return rows


def flops(counters: dict[str, float | None]) -> dict[str, float | None]:
    """FLOPs from metric values (name -> value, None or absent when not collected), by the
    module docstring's formula: ``flop_fp32``, ``flop_fp16``, ``flop_fp64``, ``flop_tensor``
    and their sum ``flop``; a part none of whose counters was collected is None."""
    out: dict[str, float | None] = {}
    for key, weights in FLOP_COUNTERS.items():
        values = [(counters.get(name), weight) for name, weight in weights.items()]
        out[key] = (None if all(value is None for value, _ in values)
                    else sum(float(value or 0) * weight for value, weight in values))
    found = [value for value in out.values() if value is not None]
    return out | {"flop": sum(found) if found else None}


def run(command: list[str], out_dir: str | Path, *, ranges: list[str] | None = None,
        sections: tuple[str, ...] = SECTIONS, launch_count: int | None = None,
        kernel_name: str | None = None,
        metrics: tuple[str, ...] = EXTRA_METRICS) -> tuple[int, list[dict], dict]:
    """Profile ``command`` into ``out_dir/report.ncu-rep``, export ``out_dir/raw.csv`` and
    parse it.

    Returns (the profiled command's exit status as ncu reports it, the rows of
    ``parse_raw_csv``, a dict of the ncu and export command lines).

    Raises:
        ToolMissing: ncu is not on PATH.
        RuntimeError: ncu wrote no report, or the export failed (its message is included).
    """
    ncu = require("ncu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report"
    argv = build_command(command, report, ranges=ranges, sections=sections,
                         launch_count=launch_count, kernel_name=kernel_name, metrics=metrics,
                         ncu=ncu)
    report.with_suffix(".ncu-rep").unlink(missing_ok=True)  # else an old report reads as this one
    status = subprocess.run(argv).returncode
    if not report.with_suffix(".ncu-rep").exists():
        raise RuntimeError(f"ncu wrote no report (exit status {status}); no kernel matched the "
                           "filters, or the command failed before launching one")
    export = export_command(report.with_suffix(".ncu-rep"), ncu=ncu)
    done = subprocess.run(export, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(export)} failed: {done.stderr.strip()}")
    (out / "raw.csv").write_text(done.stdout)
    return status, parse_raw_csv(done.stdout), {"ncu_command": argv, "export_command": export}


def plot(rows: list[dict], path: Path) -> None:
    """Speed of light per kernel: SM, DRAM throughput and achieved occupancy, % of peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['id']} {r['range'] or ''} {short_name(r['kernel'])}" for r in rows]
    keys = (("sm_pct", "SM throughput"), ("dram_pct", "DRAM throughput"),
            ("achieved_occupancy_pct", "achieved occupancy"))
    fig, ax = plt.subplots(figsize=(10, 1 + 0.25 * len(rows) * len(keys)))
    height = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        ax.barh([j + i * height for j in range(len(rows))], [r[key] or 0 for r in rows],
                height, label=label)
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(rows))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of peak")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def short_name(kernel: str, width: int = 40) -> str:
    """A kernel name cut to ``width`` characters, for tables and charts."""
    name = re.sub(r"\(.*", "", kernel)
    return name if len(name) <= width else name[:width - 1] + "…"
