"""Nsight Systems sessions: ``gemmlab profile nsys -- [mpiexec -n P] <command>``.

One report per rank: ``nsys profile`` goes after ``mpiexec -n P`` (and its options), so every
rank runs under its own nsys and writes ``<out>/<name>.rank<R>.nsys-rep``, R taken from the
rank variable of the MPI flavour (``%q{VAR}`` in the output name: Open MPI sets
``OMPI_COMM_WORLD_RANK``, MPICH's Hydra ``PMI_RANK``; Nsight Systems User Guide, "Profiling MPI
applications"). A command without mpiexec gives one report, ``<out>/<name>.nsys-rep``. Then,
per report::

    nsys export --type=sqlite --force-overwrite=true --output=<report>.sqlite <report>.nsys-rep
    nsys stats --report=cuda_gpu_kern_sum --report=nvtx_sum --report=nvtx_gpu_proj_sum \
        --format=csv --output=<report> --force-overwrite=true <report>.sqlite

(``nsys stats`` writes ``<report>_<report name>.csv``), and the overlap analysis on the SQLite
export's ``CUPTI_ACTIVITY_KIND_KERNEL`` table (``start``/``end`` in ns, ``deviceId``,
``streamId``, ``shortName``/``demangledName`` ids into ``StringIds``; Nsight Systems "SQLite
Schema Reference"):

- communication kernels: names matching ``COMM_REGEX`` (NCCL's kernels, ``ncclDevKernel_*`` /
  ``ncclKernel_*``, which also carry the ``ring/nccl`` send/receive steps); compute kernels:
  every other kernel. ``ring``'s reductions are torch add kernels and count as compute.
- per rank and device: comm = union of the communication kernels' intervals, compute = union
  of the compute kernels', overlapped = |comm ∩ compute|, overlap_share = overlapped / |comm|,
  exposed_comm = |comm| - overlapped (the communication time nothing else hid).
- copy engines, from ``CUPTI_ACTIVITY_KIND_MEMCPY`` (``start``, ``end``, ``deviceId``,
  ``bytes``): per rank and device the copies, their bytes, copy = union of their intervals,
  and how much of it ran beside compute kernels (``copy_under_compute``, ``copy_share``):
  what a copy-engine collective such as symm's all-gather hides.
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from .ncu import require

COMM_REGEX = r"(?i)nccl"
STATS_REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_gpu_proj_sum")
LAUNCHERS = ("mpiexec", "mpirun")
# Launcher options that take a value (Open MPI and MPICH Hydra), so the program is found
# after them; --opt=value and flags need no entry.
VALUE_OPTIONS = {
    "-n": 1, "-np": 1, "-c": 1, "--n": 1, "-N": 1, "--npernode": 1, "-npernode": 1, "-ppn": 1,
    "-H": 1, "-host": 1, "--host": 1, "-hosts": 1, "-hostfile": 1, "--hostfile": 1, "-f": 1,
    "-machinefile": 1, "--machinefile": 1, "--map-by": 1, "--bind-to": 1, "--rank-by": 1,
    "-x": 1, "-wdir": 1, "--wdir": 1, "-cwd": 1, "-genvlist": 1, "-envlist": 1,
    "-bind-to": 1, "-map-by": 1, "--mca": 2, "-mca": 2, "-genv": 2, "-env": 2,
}
RANK_VARIABLES = {"Open MPI": "OMPI_COMM_WORLD_RANK", "OpenRTE": "OMPI_COMM_WORLD_RANK",
                  "HYDRA": "PMI_RANK", "MPICH": "PMI_RANK", "Intel(R) MPI": "PMI_RANK"}


def split_launcher(command: list[str]) -> tuple[list[str], list[str]]:
    """``(launcher part, program part)`` of ``command``: ``mpiexec -n 2 --bind-to none
    gemmlab tp`` -> ``(["mpiexec", "-n", "2", "--bind-to", "none"], ["gemmlab", "tp"])``;
    a command not started by mpiexec or mpirun has an empty launcher part.

    Raises:
        ValueError: an empty command, or a launcher with no program after its options.
    """
    if not command:
        raise ValueError("no command to profile: give it after --")
    if Path(command[0]).name not in LAUNCHERS:
        return [], list(command)
    i = 1
    while i < len(command) and command[i].startswith("-"):
        i += 1 + VALUE_OPTIONS.get(command[i], 0)
    if i >= len(command):
        raise ValueError(f"no program after {' '.join(command)}")
    return command[:i], command[i:]


def rank_variable(version_text: str) -> str:
    """The environment variable holding the world rank, from ``mpiexec --version`` output.

    Raises:
        ValueError: an MPI flavour not in ``RANK_VARIABLES`` (pass ``--rank-env``).
    """
    for marker, variable in RANK_VARIABLES.items():
        if marker in version_text:
            return variable
    first = version_text.strip().splitlines()[:1]
    raise ValueError(f"unknown MPI flavour ({first[0] if first else 'no version output'}); "
                     "name its rank variable with --rank-env")


def build_command(command: list[str], out_dir: str | Path, name: str = "report", *,
                  rank_env: str | None = None, nsys: str = "nsys") -> list[str]:
    """The command line running ``command`` under ``nsys profile`` (CUDA and NVTX traced, no
    CPU sampling), one report per rank after ``mpiexec -n P``: ``<out_dir>/<name>.rank%q{VAR}``
    with VAR = ``rank_env``, which an MPI command needs. Kernels replayed from a CUDA graph are
    traced one by one (``--cuda-graph-trace=node``; nsys's default traces a graph launch as a
    whole, and its kernels would be missing from the kernel table and the overlap).

    Raises:
        ValueError: an empty command, an MPI command without ``rank_env``.
    """
    launcher, program = split_launcher(command)
    if launcher and rank_env is None:
        raise ValueError("an mpiexec command needs the rank variable (rank_env)")
    output = Path(out_dir) / (f"{name}.rank%q{{{rank_env}}}" if launcher else name)
    profile = [nsys, "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--sample=none",
               "--cpuctxsw=none", f"--output={output}", "--force-overwrite=true"]
    return [*launcher, *profile, *program]


def stats_command(sqlite_path: str | Path, prefix: str | Path, nsys: str = "nsys") -> list[str]:
    """``nsys stats`` writing ``<prefix>_<report>.csv`` for each of ``STATS_REPORTS``."""
    reports = [f"--report={report}" for report in STATS_REPORTS]
    return [nsys, "stats", *reports, "--format=csv", f"--output={prefix}",
            "--force-overwrite=true", str(sqlite_path)]


def export_command(report: str | Path, sqlite_path: str | Path, nsys: str = "nsys") -> list[str]:
    """``nsys export`` of a ``.nsys-rep`` to SQLite."""
    return [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={sqlite_path}",
            str(report)]


def parse_stats_csv(text: str) -> list[dict]:
    """The rows of one ``nsys stats --format csv`` report; numeric cells as int or float
    (times in ns, as nsys writes them), the rest as strings."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row = {}
        for key, value in raw.items():
            try:
                row[key] = int(value)
            except ValueError:
                try:
                    row[key] = float(value)
                except ValueError:
                    row[key] = value
        rows.append(row)
    return rows


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of half-open intervals [start, end) as sorted, disjoint intervals."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def measure(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of ``intervals``."""
    return sum(end - start for start, end in union(intervals))


def intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intervals covered by both ``a`` and ``b`` (each any list of intervals)."""
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass
class Overlap:
    """Communication/compute overlap on one device, times in ns; ``share`` is None when
    there is no communication."""

    comm_ns: int
    compute_ns: int
    overlapped_ns: int
    exposed_comm_ns: int
    share: float | None


def overlap(comm: list[tuple[int, int]], compute: list[tuple[int, int]]) -> Overlap:
    """How much of the communication intervals ran while compute kernels ran."""
    comm_ns = measure(comm)
    hidden = measure(intersection(comm, compute))
    return Overlap(comm_ns, measure(compute), hidden, comm_ns - hidden,
                   hidden / comm_ns if comm_ns else None)


def _read(sqlite_path: str | Path, table: str, query: str, fields: tuple[str, ...]) -> list[dict]:
    """``query``'s rows as dicts of ``fields``; empty when the export has no ``table`` (nsys
    creates a table only for what the report traced)."""
    with sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True) as db:
        has = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                         (table,)).fetchone()
        return [dict(zip(fields, row)) for row in db.execute(query)] if has else []


def read_kernels(sqlite_path: str | Path) -> list[dict]:
    """Every kernel of an nsys SQLite export: ``start``, ``end`` (ns), ``device``, ``stream``,
    ``name`` (short) and ``demangled``; empty when the report traced no kernel (no
    ``CUPTI_ACTIVITY_KIND_KERNEL`` table)."""
    return _read(sqlite_path, "CUPTI_ACTIVITY_KIND_KERNEL",
                 "SELECT k.start, k.end, k.deviceId, k.streamId, s.value, d.value "
                 "FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
                 "JOIN StringIds AS s ON s.id = k.shortName "
                 "JOIN StringIds AS d ON d.id = k.demangledName ORDER BY k.start",
                 ("start", "end", "device", "stream", "name", "demangled"))


def read_copies(sqlite_path: str | Path) -> list[dict]:
    """Every memory copy of an nsys SQLite export: ``start``, ``end`` (ns), ``device`` and
    ``bytes``; empty when the report traced none (no ``CUPTI_ACTIVITY_KIND_MEMCPY`` table)."""
    return _read(sqlite_path, "CUPTI_ACTIVITY_KIND_MEMCPY",
                 "SELECT start, end, deviceId, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                 "ORDER BY start", ("start", "end", "device", "bytes"))


def overlap_by_device(kernels: list[dict], comm_regex: str = COMM_REGEX,
                      copies: list[dict] = ()) -> list[dict]:
    """One row per device of ``kernels`` and ``copies`` (as ``read_kernels`` and
    ``read_copies``): kernel counts, the ``Overlap`` in ms (``comm_ms``, ``compute_ms``,
    ``overlapped_ms``, ``exposed_comm_ms``, ``overlap_share``: None without communication),
    and the copy engines': ``copies``, ``copy_gb``, ``copy_ms``, ``copy_under_compute_ms``,
    ``copy_share`` (None without copies)."""
    pattern = re.compile(comm_regex)
    rows = []
    for device in sorted({k["device"] for k in kernels} | {c["device"] for c in copies}):
        mine = [k for k in kernels if k["device"] == device]
        comm = [k for k in mine if pattern.search(k["demangled"])]
        compute = [(k["start"], k["end"]) for k in mine if not pattern.search(k["demangled"])]
        result = overlap([(k["start"], k["end"]) for k in comm], compute)
        moved = [c for c in copies if c["device"] == device]
        beside = overlap([(c["start"], c["end"]) for c in moved], compute)
        rows.append({"device": device, "comm_kernels": len(comm),
                     "compute_kernels": len(compute),
                     **{key.replace("_ns", "_ms"): value / 1e6
                        for key, value in asdict(result).items() if key.endswith("_ns")},
                     "overlap_share": result.share, "copies": len(moved),
                     "copy_gb": sum(c["bytes"] for c in moved) / 1e9,
                     "copy_ms": beside.comm_ns / 1e6,
                     "copy_under_compute_ms": beside.overlapped_ns / 1e6,
                     "copy_share": beside.share})
    return rows


def rank_of(report: Path) -> int | None:
    """The rank in a report's name (``<name>.rank3.nsys-rep`` -> 3), None for one report."""
    found = re.search(r"\.rank(\d+)$", report.name.removesuffix(".nsys-rep"))
    return int(found.group(1)) if found else None


def analyse(report: Path, comm_regex: str = COMM_REGEX, nsys: str = "nsys") -> dict:
    """Export one report to SQLite, run ``nsys stats`` on it and the overlap analysis.

    Returns ``{"report", "rank", "stats": {report name: rows}, "overlap": rows}``.

    Raises:
        RuntimeError: nsys export or stats failed (their message is included).
    """
    base = report.parent / report.name.removesuffix(".nsys-rep")
    sqlite_path = Path(f"{base}.sqlite")
    for name in STATS_REPORTS:  # a report nsys stats skips must not be read from an older run
        Path(f"{base}_{name}.csv").unlink(missing_ok=True)
    for argv in (export_command(report, sqlite_path, nsys), stats_command(sqlite_path, base, nsys)):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()}")
    stats = {}
    for name in STATS_REPORTS:
        path = Path(f"{base}_{name}.csv")
        stats[name] = parse_stats_csv(path.read_text()) if path.exists() else []
    rank = rank_of(report)
    rows = [{"rank": rank, "report": report.name, **row}
            for row in overlap_by_device(read_kernels(sqlite_path), comm_regex,
                                         read_copies(sqlite_path))]
    return {"report": report.name, "rank": rank, "stats": stats, "overlap": rows}


def run(command: list[str], out_dir: str | Path, *, name: str = "report",
        comm_regex: str = COMM_REGEX, rank_env: str | None = None) -> tuple[int, list[dict]]:
    """Profile ``command`` (one report per rank under mpiexec), then ``analyse`` every report.

    ``rank_env``: the rank variable; by default read from ``mpiexec --version``.

    Returns (the command's exit status, one ``analyse`` result per report, by rank).

    Raises:
        ToolMissing: nsys is not on PATH.
        ValueError: a bad command, or an MPI flavour whose rank variable is unknown.
        RuntimeError: no report was written, or nsys export/stats failed.
    """
    nsys = require("nsys")
    launcher, _ = split_launcher(command)
    if launcher and rank_env is None:
        version = subprocess.run([launcher[0], "--version"], capture_output=True, text=True)
        rank_env = rank_variable(version.stdout + version.stderr)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{name}*.nsys-rep"):
        old.unlink()  # a report from an earlier run would be analysed as another rank
    status = subprocess.run(build_command(command, out, name, rank_env=rank_env,
                                          nsys=nsys)).returncode
    reports = sorted(out.glob(f"{name}*.nsys-rep"), key=lambda p: (rank_of(p) or 0, p.name))
    if not reports:
        raise RuntimeError(f"nsys wrote no report in {out} (exit status {status})")
    return status, [analyse(report, comm_regex, nsys) for report in reports]


def plot(rows: list[dict], path: Path) -> None:
    """Per rank and device: communication time hidden under compute and exposed (ms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"rank {r['rank'] if r['rank'] is not None else 0} GPU {r['device']}" for r in rows]
    hidden = [r["overlapped_ms"] for r in rows]
    exposed = [r["exposed_comm_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.5 * len(rows)))
    ax.barh(labels, hidden, label="communication hidden under compute")
    ax.barh(labels, exposed, left=hidden, label="communication exposed")
    ax.set_xlabel("ms")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
