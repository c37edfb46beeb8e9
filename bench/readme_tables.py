"""Generate the result tables of the README (and of the notebooks under ``bench/results/``) from
committed ``results.json`` files, so they cannot drift.

A generated region in a markdown file looks like::

    <!-- gemmlab:table ladder bench/results/h200-ladder-fp16 -->
    ...generated markdown, replaced by this script...
    <!-- /gemmlab:table -->

The opening marker names a table kind (``comm``, ``ladder``, ``launch``, ``ncu``,
``overhead``, ``overhead-runs``, ``resources``, ``study``, ``stages``, ``targets``,
``targets-rounds``, ``tp`` or ``train``) and a results directory, relative to the repository
root (or absolute); the table is rendered from ``<dir>/results.json`` (``overhead-runs``: from
each ``<dir>/*/results.json``, one column per run; ``ncu``, ``targets`` and ``train``: several
directories, comma-separated, their rows in that order; ``targets-rounds``: several, their
rounds pooled) and replaces the text between the markers, which stay.

    python3 -m bench.readme_tables [--check] [FILE ...]

rewrites each FILE (default: ``DOCS``, the repository's ``README.md`` and the notebooks it links
to) in place and prints the regions it updated; ``--check`` changes nothing, prints the stale
regions and exits 1 if there are any. An unknown kind, a missing results file or an unclosed
marker is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import median

from backends.registry import CUDA_KERNELS

from .comm_bench import series
from .gemm_bench import FORMULAS, LAUNCH_BOUND
from .overhead_bench import TARGET_ADDED_US, added_text

REPO = Path(__file__).resolve().parent.parent
# The markdown files with generated tables: the README, and the run-by-run notebooks it links to.
DOCS = (REPO / "README.md", REPO / "bench" / "results" / "top-rungs.md",
        REPO / "bench" / "results" / "overhead.md")

OPEN = re.compile(r"<!--\s*gemmlab:table\s+(\S+)\s+(\S+)\s*-->")
CLOSE = re.compile(r"<!--\s*/gemmlab:table\s*-->")
# An opening marker, then anything up to the first closing marker that holds no other marker.
REGION = re.compile(OPEN.pattern + r"((?:(?!<!--\s*/?gemmlab:table).)*?)" + CLOSE.pattern,
                    re.DOTALL)

LEGEND = (f"e: timed eagerly (no CUDA graph); †: launch-bound (call time > "
          f"{1 + LAUNCH_BOUND:.1f} x kernel time).")


class TableError(Exception):
    """A README region or results file that cannot be rendered."""


def _folder(directory: str) -> Path:
    path = Path(directory)
    return path if path.is_absolute() else REPO / path


def _load(directory: str) -> dict:
    path = _folder(directory) / "results.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableError(f"no results file {path}") from None
    except json.JSONDecodeError as exc:
        raise TableError(f"{path} is not valid JSON: {exc}") from None


def _commit(meta: dict) -> str:
    """The commit a run names: ``git_commit``'s first 7 characters, marked dirty with the diff's
    hash (or, in files written before ``git_dirty`` existed, by a ``-dirty`` suffix); the
    ``declared_commit`` of a copied tree first when there is one, marked unverified, with the
    copy's own HEAD when git found a different one there. A copy whose own git found the
    declared commit as HEAD, and said whether the tree differs from it, is verified: it is
    named as a repository's run is."""
    commit, declared = meta.get("git_commit"), meta.get("declared_commit")
    verified = (declared is not None and commit is not None
                and meta.get("git_dirty") in (True, False)
                and str(commit).startswith(str(declared)))
    if declared is not None and not verified:
        text = f"declared commit `{str(declared)[:7]}` (a copied tree; not verified"
        if commit is not None and not str(declared).startswith(str(commit)[:7]):
            text += (f"; the copy's own git HEAD, stale: `{str(commit)[:7]}`"
                     + (" with changes" if meta.get("git_dirty") else ""))
        return text + ")"
    if commit is None:
        return "commit `?`"
    commit = str(commit)
    if commit.endswith("-dirty"):
        return f"commit `{commit[:7]}` (dirty)"
    if meta.get("git_dirty") is True:
        diff = meta.get("git_diff_sha256")
        return f"commit `{commit[:7]}` (dirty" + (f", diff sha256 {diff[:12]})" if diff else ")")
    return f"commit `{commit[:7]}`"


def _warmup_ms(meta: dict) -> float | None:
    """The warm-up (ms) a run's kernel times were taken after, where its file records it."""
    return (meta.get("timing") or {}).get("warmup_ms")


def _provenance(directory: str, meta: dict) -> str:
    def get(key: str) -> str:
        value = meta.get(key)
        return "?" if value is None else str(value)

    ms = _warmup_ms(meta)
    warmup = "" if ms is None else f"; kernel times after a {ms:g} ms warm-up"
    return (f"Source: `{directory}/results.json`, {_commit(meta)}, "
            f"{get('gpu')}, torch {get('torch')}, Triton {get('triton')}; "
            f"command: `{get('command')}`{warmup}.")


def _shape(row: dict) -> str:
    m, n, k = row["M"], row["N"], row["K"]
    return f"{m}³" if m == n == k else f"{m}×{n}×{k}"


def _table(header: list[str], aligns: str, rows: list[list[str]]) -> str:
    """A markdown table; ``aligns`` holds one ``l`` or ``r`` per column."""
    lines = [header, ["---" if a == "l" else "---:" for a in aligns], *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1000:.1f}"


def _ladder_cell(row: dict) -> str:
    if not row["ok"]:
        return "FAIL"
    if row.get("tflops") is None:
        return "-"
    extras = []
    if row.get("pct_best_cublas") is not None:
        extras.append(f"{row['pct_best_cublas']:.0f}%")
    if row.get("x_torch_compile") is not None:
        extras.append(f"{row['x_torch_compile']:.2f}x")
    cell = f"{row['tflops']:.1f}" + (f" ({'; '.join(extras)})" if extras else "")
    if (row.get("timing") or "").startswith("eager"):
        cell += " e"
    if row.get("launch_bound"):
        cell += " †"
    return cell


def ladder_table(directory: str) -> str:
    """TFLOP/s per backend and shape, one table per (dtype, epilogue) group."""
    data = _load(directory)
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in data["rows"]:
        groups.setdefault((row["dtype"], row["epilogue"]), []).append(row)
    parts = []
    for (dtype, epilogue), rows in groups.items():
        shapes = list(dict.fromkeys(_shape(r) for r in rows))
        backends = list(dict.fromkeys(r["backend"] for r in rows))
        cells: dict[tuple[str, str], str] = {}
        for r in rows:
            cells.setdefault((r["backend"], _shape(r)), _ladder_cell(r))
        body = [[f"`{b}`", *(cells.get((b, s), "-") for s in shapes)] for b in backends]
        parts.append(f"**{dtype}, {FORMULAS.get(epilogue, epilogue)}** — TFLOP/s from kernel "
                     "time (% of the best cuBLAS; x torch.compile)\n\n"
                     + _table(["backend", *shapes], "l" + "r" * len(shapes), body))
    parts += [LEGEND, _provenance(directory, data.get("meta", {}))]
    return "\n\n".join(parts)


def launch_table(directory: str) -> str:
    """Call time vs kernel time for the launch-bound rows of a ladder run."""
    data = _load(directory)
    body = []
    for r in data["rows"]:
        kernel, call = r.get("kernel_ms"), r.get("call_ms")
        if kernel is None or call is None or not r.get("launch_bound"):
            continue
        body.append([f"`{r['backend']}`", r["dtype"], FORMULAS.get(r["epilogue"], r["epilogue"]),
                     _shape(r), _us(kernel), _us(call), _us(call - kernel), "yes"])
    header = ["backend", "dtype", "D =", "shape", "kernel µs", "call µs", "host µs",
              "launch-bound"]
    table = _table(header, "llllrrrl", body) if body else "No row was launch-bound."
    return table + "\n\n" + _provenance(directory, data.get("meta", {}))


def overhead_table(directory: str) -> str:
    """What ``gemm()`` adds over the wrapped library call, per backend; split into its front
    and the bound launch's part where the run timed the bound launch (``front_us``)."""
    data = _load(directory)
    split = any(r.get("front_us") is not None for r in data["rows"])
    keys = ("wrapped_us", "gemm_us", "front_us", "closure_us", "tuned_us") if split else (
        "wrapped_us", "gemm_us", "tuned_us")
    body = []
    for r in data["rows"]:
        if r["ok"]:
            values = ["-" if r.get(k) is None else f"{r[k]:.1f}" for k in keys]
            values.insert(2, added_text(r))
        else:
            values = ["FAIL"] + ["-"] * len(keys)
        body.append([f"`{r['backend']}`", r["dtype"], _shape(r), *values])
    header = ["backend", "dtype", "shape", "wrapped call µs", "gemm() µs", "added µs (quartiles)",
              *(["front µs", "launch − wrapped µs"] if split else []), "tuned look-up µs"]
    return (_table(header, "lll" + "r" * (len(header) - 3), body) + "\n\n"
            + _provenance(directory, data.get("meta", {})))


# A run's row is at the host's fast speed when its wrapped call took at most this many times
# the fastest wrapped call of that row in the table (the host alternates between a fast and a
# slow speed: the README's "A cheap gemm()"); in runs that timed the host's speed itself
# (``host_ns``), when that was at most FAST_HOST times the fastest of the table's rows (its
# slower speeds, host_ns 41-47 and 64-72 against 23.2, are 1.8-2.0x and 2.8-3.1x the fastest:
# bench/results/h200-host-phases/run-7*/results.json).
FAST_SPEED = 1.3
FAST_HOST = 1.2


def overhead_runs_table(directory: str) -> str:
    """What ``gemm()`` adds per backend in each of several ``gemmlab bench --overhead`` runs
    (the subfolders of ``directory`` that hold a ``results.json``, in name order, numbers
    compared as numbers: run-9 before run-10), the wrapped call's time beside it (a host
    whose speed changes between runs shows there, and where every row timed it, the host's
    own speed, ``host_ns``), and in how many runs it met the target: of all, and of those at
    the host's fast speed (``host_ns`` within ``FAST_HOST`` times the table's fastest, where
    every row has it; else the wrapped call within ``FAST_SPEED`` times that row's fastest
    in the table)."""
    runs = sorted((path.parent.name for path in _folder(directory).glob("*/results.json")),
                  key=_natural)
    if not runs:
        raise TableError(f"no */results.json under {_folder(directory)}")
    data = {run: _load(f"{directory}/{run}") for run in runs}
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for run in runs:
        for r in data[run]["rows"]:
            cells.setdefault((r["backend"], r["dtype"]), {})[run] = r
    measured_rows = [r for run in runs for r in data[run]["rows"] if r["ok"]]
    timed_host = bool(measured_rows) and all(r.get("host_ns") for r in measured_rows)
    fastest_host = min((r["host_ns"] for r in measured_rows), default=0.0) if timed_host else 0
    body = []
    for (backend, dtype), by_run in cells.items():
        row, met = [f"`{backend}`", dtype], 0
        measured = [r for r in by_run.values() if r["ok"]]
        if timed_host:
            fast = [r for r in measured if r["host_ns"] <= FAST_HOST * fastest_host]
        else:
            fastest = min((r["wrapped_us"] for r in measured), default=0.0)
            fast = [r for r in measured if r["wrapped_us"] <= FAST_SPEED * fastest]
        for run in runs:
            r = by_run.get(run)
            if r is None:
                row.append("-")
            elif not r["ok"]:
                row.append("FAIL")
            else:
                host = f"; {r['host_ns']:.0f}" if timed_host else ""
                row.append(f"{r['added_us']:.2f} ({r['wrapped_us']:.1f}{host})")
                met += r["added_us"] <= TARGET_ADDED_US
        met_fast = sum(r["added_us"] <= TARGET_ADDED_US for r in fast)
        body.append([*row, f"{met} of {len(by_run)}", f"{met_fast} of {len(fast)}"])
    cell = "added µs (wrapped µs; host ns)" if timed_host else "added (wrapped) µs"
    header = ["backend", "dtype", *(f"{run}: {cell}" for run in runs),
              f"added ≤ {TARGET_ADDED_US:g} µs", "at the fast speed"]
    sources = [_provenance(f"{directory}/{run}", data[run].get("meta", {})) for run in runs]
    return _table(header, "ll" + "r" * (len(header) - 2), body) + "\n\n" + "\n".join(sources)


def _natural(name: str) -> list:
    """Sort key that compares the digit runs of ``name`` as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


# The targets of the ladder's top rungs (the README's targets table): per target, its shapes
# (each must meet it), epilogue, and the least ratio of the best hand-written rung to the
# best cuBLAS.
TOP_RUNG_TARGETS = (
    ("8192³ A @ B", ((8192, 8192, 8192),), "none", 1.0),
    ("4096³ A @ B", ((4096, 4096, 4096),), "none", 0.95),
    ("8192³ ReLU(A @ B + C)", ((8192, 8192, 8192),), "relu_c", 1.0),
    ("4096³ ReLU(A @ B + C)", ((4096, 4096, 4096),), "relu_c", 1.0),
    ("short K, ReLU(A @ B + C)", ((16384, 4096, 512), (4096, 4096, 256)), "relu_c", 1.0),
)


def targets_table(directories: str) -> str:
    """The top-rung targets in each of several ladder runs (``directories``: their folders,
    comma-separated, one row each): per target and dtype, the best hand-written rung's
    ratio to the best cuBLAS (the faster of ``cublas`` and ``cublaslt``) on the same problem
    in that run, the least over the target's shapes, in bold where it misses; then in how
    many of the runs that timed it each target was met."""
    folders = directories.split(",")
    dtypes = ("fp16", "bf16")
    met: dict[tuple[str, str], list[bool]] = {}
    body, sources = [], []
    for folder in folders:
        data = _load(folder)
        best: dict[tuple, float] = {}
        for r in data["rows"]:
            if r["backend"] in CUDA_KERNELS and r["ok"] and r.get("pct_best_cublas") is not None:
                key = (r["M"], r["N"], r["K"]), r["dtype"], r["epilogue"]
                best[key] = max(best.get(key, 0.0), r["pct_best_cublas"] / 100)
        meta = data.get("meta", {})
        found = re.search(r"--rounds[ =](\d+)", meta.get("command") or "")
        rounds = found.group(1) if found else "1"
        commit = str(meta.get("declared_commit") or meta.get("git_commit") or "?")[:7]
        warmup = _warmup_ms(meta)
        row = [f"`{folder.rsplit('/', 1)[-1]}` (`{commit}`, {rounds} "
               f"round{'' if rounds == '1' else 's'}"
               + ("" if warmup is None else f", {warmup:g} ms warm-up") + ")"]
        for label, shapes, epilogue, least in TOP_RUNG_TARGETS:
            cell = []
            for dtype in dtypes:
                ratios = [best.get((shape, dtype, epilogue)) for shape in shapes]
                if None in ratios:
                    continue
                ok = min(ratios) >= least
                met.setdefault((label, dtype), []).append(ok)
                text = f"{min(ratios):.3f}x {dtype}"
                cell.append(text if ok else f"**{text}**")
            row.append(", ".join(cell) or "not run")
        body.append(row)
        sources.append(_provenance(folder, meta))
    count = ["met in"]
    for label, _, _, least in TOP_RUNG_TARGETS:
        count.append(", ".join(f"{dtype} {sum(met[label, dtype])} of {len(met[label, dtype])}"
                               for dtype in dtypes if (label, dtype) in met) or "-")
    header = ["run", *(f"{label}, ≥ {least:.2f}x" for label, _, _, least in TOP_RUNG_TARGETS)]
    return (_table(header, "l" + "r" * len(TOP_RUNG_TARGETS), [*body, count]) + "\n\n"
            + "\n".join(sources))


def _round_ratios(rows: list[dict], shapes: tuple, dtype: str, epilogue: str,
                  rung: str) -> list[float] | None:
    """Per round of one run, ``rung``'s ratio to that round's faster cuBLAS (the least over
    ``shapes``); None where a row, or its per-round medians, is missing or failed."""
    by = {(r["backend"], (r["M"], r["N"], r["K"])): r for r in rows
          if r["dtype"] == dtype and r["epilogue"] == epilogue}
    per_shape = []
    for shape in shapes:
        mine = by.get((rung, shape))
        cublas = [by.get((name, shape)) for name in ("cublas", "cublaslt")]
        cublas = [r for r in cublas if r is not None and r["ok"] and r.get("kernel_ms_rounds")]
        if mine is None or not mine["ok"] or not mine.get("kernel_ms_rounds") or not cublas:
            return None
        rounds = mine["kernel_ms_rounds"]
        per_shape.append([min(r["kernel_ms_rounds"][i] for r in cublas) / rounds[i]
                          for i in range(len(rounds))])
    return [min(column) for column in zip(*per_shape)]


def targets_rounds_table(directories: str) -> str:
    """The top-rung targets pooled over the rounds of several ladder runs (``directories``:
    their folders, comma-separated; runs without per-round medians are left out): per target
    and dtype, the hand-written rung with the highest median of the per-round ratios (its
    kernel time against the faster cuBLAS of the same round, the least over the target's
    shapes), how many rounds meet the target, and the lowest and highest median of one run.
    Rounds of one run share the GPU's state, so they are not independent samples: the run
    medians show how far a whole run moves."""
    runs = [_load(folder)["rows"] for folder in directories.split(",")]
    rungs = sorted({r["backend"] for rows in runs for r in rows if r["backend"] in CUDA_KERNELS})
    body = []
    for label, shapes, epilogue, least in TOP_RUNG_TARGETS:
        for dtype in ("fp16", "bf16"):
            best = None
            for rung in rungs:
                per_run = [x for rows in runs
                           if (x := _round_ratios(rows, shapes, dtype, epilogue, rung))]
                pooled = [v for x in per_run for v in x]
                middle = median(pooled) if pooled else None
                if middle is not None and (best is None or middle > best[1]):
                    best = rung, middle, pooled, [median(x) for x in per_run]
            if best is None:
                continue
            rung, middle, pooled, run_medians = best
            met = sum(v >= least for v in pooled)
            body.append([label, f"≥ {least:.2f}x", dtype, f"`{rung}`",
                         f"{len(run_medians)} ({len(pooled)})", f"{middle:.3f}x",
                         f"{met} of {len(pooled)}",
                         f"{min(run_medians):.3f}–{max(run_medians):.3f}x",
                         f"{sum(m >= least for m in run_medians)} of {len(run_medians)}"])
    if not body:
        raise TableError(f"no per-round medians of the targets' rows in {directories}")
    header = ["target", "", "dtype", "rung", "runs (rounds)", "median round", "rounds met",
              "run medians", "runs met"]
    return _table(header, "lllrrrrrr", body)


def ncu_table(directories: str) -> str:
    """Nsight Compute's reading of several ``gemmlab profile ncu`` runs (``directories``:
    their folders, comma-separated, each named ``<rung>-<dtype>``), one row per profiled
    kernel in the order given: duration, SM and DRAM throughput (% of peak), achieved
    occupancy, registers per thread, shared memory per block (static + dynamic), DRAM bytes
    read and TFLOP/s from the counted FLOP (``profiling/ncu.py``); then each run's source."""
    body, sources = [], []
    for folder in directories.split(","):
        data = _load(folder)
        rung, _, dtype = folder.rstrip("/").rsplit("/", 1)[-1].rpartition("-")
        for r in data["rows"]:
            smem = int(r["smem_static_bytes"] + r["smem_dynamic_bytes"])
            # A C++ kernel's demangled name without its template arguments and parameters.
            kernel = re.split(r"[<(]", r["kernel"].removeprefix("void "), maxsplit=1)[0]
            body.append([f"`{rung}` {dtype}", f"`{kernel}`", f"{r['duration_us']:.1f}",
                         f"{r['sm_pct']:.1f}", f"{r['dram_pct']:.1f}",
                         f"{r['achieved_occupancy_pct']:.1f}", f"{r['registers']:.0f}",
                         str(smem), f"{r['dram_read_bytes'] / 1e6:.0f}", f"{r['tflops']:.1f}"])
        sources.append(_provenance(folder, data.get("meta", {})))
    header = ["rung, dtype", "kernel", "µs", "SM %", "DRAM %", "achieved occupancy %", "regs",
              "smem B", "DRAM read MB", "TFLOP/s"]
    return _table(header, "ll" + "r" * 8, body) + "\n\n" + "\n".join(sources)


def resources_table(directory: str) -> str:
    """Registers, shared and local memory, threads and occupancy of each CUDA C kernel and
    dtype (its configuration with the best TFLOP/s in the run), from ``--resources``."""
    data = _load(directory)
    best: dict[tuple[str, str], dict] = {}
    for r in data.get("resources", []):
        key = r["backend"], r["dtype"]
        if key not in best or (r["best_tflops"] or 0) > (best[key]["best_tflops"] or 0):
            best[key] = r
    body = [[f"`{r['backend']}`", r["dtype"], str(r["registers"]), str(r["static_smem"]),
             str(r["dynamic_smem"]), str(r["local_bytes"]), str(r["threads"]),
             str(r["blocks_per_sm"]), f"{r['occupancy']:.0%}",
             "-" if r["best_tflops"] is None else f"{r['best_tflops']:.1f}"]
            for r in best.values()]
    header = ["kernel", "dtype", "regs/thread", "static smem (B)", "dynamic smem (B)",
              "local (B)", "threads", "blocks/SM", "occupancy", "best TFLOP/s"]
    return (_table(header, "llrrrrrrrr", body) + "\n\n"
            + _provenance(directory, data.get("meta", {})))


def study_table(directory: str) -> str:
    """``gemmlab study``'s points, and a ``bench.scale_series`` run's: per workload, mode,
    backend, communicator and P the measured step, the communication alone, TFLOP/s per GPU,
    comm share, speedup and scaling efficiency (FAIL: checked wrong, never timed)."""
    data = _load(directory)
    body = []
    for r in data["rows"]:
        point = [r["workload"], r["mode"], f"`{r['backend']}`", r["comm"], str(r["P"])]
        if not r.get("ok"):
            body.append([*point, "FAIL", "-", "-", "-", "-", "-"])
            continue
        body.append([*point, f"{r['tflops_per_gpu']:.1f}", f"{r['step_ms']:.2f}",
                     f"{r['comm_ms']:.2f}", f"{r['comm_share']:.0%}",
                     *("-" if r[key] is None else f"{r[key]:.2f}"  # no checked P = 1 row
                       for key in ("speedup", "efficiency"))])
    header = ["workload", "mode", "backend", "comm", "P", "TFLOP/s per GPU", "step ms",
              "comm ms (alone)", "comm share", "speedup", "efficiency"]
    return (_table(header, "lllllrrrrrr", body) + "\n\n"
            + _provenance(directory, data.get("meta", {})))


# gemmlab comm's columns: latency up to 1 MiB (time per call), bandwidth from 16 MiB (busbw).
COMM_LATENCY = (8 << 10, 64 << 10, 256 << 10, 1 << 20)
COMM_BANDWIDTH = (16 << 20, 64 << 20, 256 << 20, 1 << 30)


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def comm_table(directory: str) -> str:
    """``gemmlab comm``'s sweep, one table per collective: for each communicator (and
    timing: eager is the call time, host included; graph the GPU's, by CUDA-graph replays)
    the time per call in µs at the small sizes and busbw in GB/s at the large ones; FAIL:
    a wrong element, never timed."""
    data = _load(directory)
    rows, parts = data["rows"], []
    for op in dict.fromkeys(r["op"] for r in rows):
        sub = {(series(r), r["bytes"]): r for r in rows if r["op"] == op}
        sizes = [s for s in (*COMM_LATENCY, *COMM_BANDWIDTH) if any(b == s for _, b in sub)]
        body = []
        for name in dict.fromkeys(n for n, _ in sub):
            cells = []
            for size in sizes:
                r = sub.get((name, size))
                value = None if r is None else r["time_us"] if size in COMM_LATENCY else r["busbw"]
                ok = r is not None and (r["ok"] if "ok" in r else not r["wrong"])  # early: no ok
                cells.append("-" if r is None else f"{value:.1f}" if ok else "FAIL")
            body.append([f"`{name}`", *cells])
        first = next(r for r in rows if r["op"] == op)
        header = ["communicator", *(f"{_size(s)} {'µs' if s in COMM_LATENCY else 'GB/s'}"
                                    for s in sizes)]
        title = (f"**{op}**, {first['ranks']} ranks, {first['dtype']}: µs per call up to 1 MiB, "
                 f"busbw (GB/s) from 16 MiB")
        parts.append(title + "\n\n" + _table(header, "l" + "r" * len(sizes), body))
    return "\n\n".join(parts) + "\n\n" + _provenance(directory, data.get("meta", {}))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def tp_table(directory: str) -> str:
    """``gemmlab tp``'s blocks (forward + backward, eager or one CUDA graph) and its overlap
    rows (compute alone, communication alone, serial, overlapped, in ms, and the share of
    the communication hidden); FAIL: checked wrong, never timed."""
    data = _load(directory)
    blocks, overlaps = [], []
    for r in data["rows"]:
        if "overlapped_ms" in r:
            timed = ([_ms(r[k]) for k in ("compute_ms", "comm_ms", "serial_ms", "overlapped_ms")]
                     + [f"{r['comm_hidden']:.0%}"] if r["ok"] else ["FAIL", "-", "-", "-", "-"])
            overlaps.append([f"`{r['layer']}`", r["phase"], str(r["chunks"]), *timed])
        elif r["phase"] == "forward+backward":
            blocks.append([f"`{r['layer']}`", str(r["tp"]), "CUDA graph" if r["cuda_graph"]
                           else "eager", _ms(r["ms"]) if r["ok"] else "FAIL"])
    return (_table(["block, forward + backward", "TP", "timing", "ms"], "lllr", blocks)
            + "\n\n" + _table(["overlap", "phase", "chunks", "compute", "comm alone", "serial",
                                "overlapped", "hidden"], "lllrrrrr", overlaps)
            + "\n\n" + _provenance(directory, data.get("meta", {})))


def stages_table(directory: str) -> str:
    """``bench.train_stages``' runtime table: one GPT trained in several stages, against the
    serial CPU run."""
    data = _load(directory)
    body = [[r["stage"], r["dtype"], str(r["ranks"]), str(r["steps"]),
             f"{r['ms_per_step']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}x",
             f"{r['final_loss']:.4f}", f"{r['max_loss_diff']:.2e}"] for r in data["rows"]]
    header = ["stage", "dtype", "ranks", "steps", "ms/step", "tokens/s", "speedup",
              "final loss", "max abs loss diff vs serial"]
    return (_table(header, "lllrrrrrr", body) + "\n\n"
            + _provenance(directory, data.get("meta", {})))


def train_table(directories: str) -> str:
    """``gemmlab train`` runs (``directories``: their folders, comma-separated, one row each):
    DP x TP, dtype, GPUs, ms per step, final loss and, against the run's reference (one
    process, same seed), the largest gap between the loss curves and the steps before it
    first exceeds 1e-3; then each run's source."""
    body, sources = [], []
    for folder in directories.split(","):
        data = _load(folder)
        s, reference = data["summary"], data.get("reference") or {}
        gap = steps = ""
        if reference.get("loss"):
            diffs = [abs(a - b) for a, b in zip(data["loss"], reference["loss"])]
            gap = f"{max(diffs):.3f}"
            steps = str(next((i for i, d in enumerate(diffs) if d > 1e-3), len(diffs)))
        body.append([s["configuration"], s["dtype"], str(s["dp"] * s["tp"]),
                     f"{s['ms_per_step']:.1f}", f"{s['final_loss']:.3f}", gap, steps])
        sources.append(_provenance(folder, data.get("meta", {})))
    header = ["run", "dtype", "GPUs", "ms/step", "final loss", "largest gap to one process",
              "steps before the gap exceeds 1e-3"]
    return _table(header, "ll" + "r" * 5, body) + "\n\n" + "\n".join(sources)


KINDS: dict[str, Callable[[str], str]] = {
    "comm": comm_table, "ladder": ladder_table, "launch": launch_table, "ncu": ncu_table,
    "overhead": overhead_table, "overhead-runs": overhead_runs_table,
    "resources": resources_table, "study": study_table,
    "stages": stages_table, "targets": targets_table, "targets-rounds": targets_rounds_table,
    "tp": tp_table, "train": train_table}


def render(kind: str, directory: str) -> str:
    """The markdown for one region: table ``kind`` from ``<directory>/results.json`` (from
    ``<directory>/*/results.json`` for ``overhead-runs``)."""
    if kind not in KINDS:
        raise TableError(f"unknown table kind {kind!r} (known: {', '.join(KINDS)})")
    return KINDS[kind](directory)


def update(text: str) -> tuple[str, list[str]]:
    """``text`` with every region regenerated, and the names (``kind dir``) of those that
    changed."""
    for match in OPEN.finditer(text):
        if not REGION.match(text, match.start()):
            line = text.count("\n", 0, match.start()) + 1
            raise TableError(f"line {line}: {match.group(0)} has no closing marker")
    regions = list(REGION.finditer(text))
    if len(CLOSE.findall(text)) != len(regions):
        raise TableError("a closing <!-- /gemmlab:table --> marker has no opening marker")
    changed = []
    pieces, end = [], 0
    for match in regions:
        kind, directory, old = match.group(1), match.group(2), match.group(3)
        new = "\n" + render(kind, directory) + "\n"
        if new != old:
            changed.append(f"{kind} {directory}")
        pieces += [text[end:match.start(3)], new]
        end = match.end(3)
    return "".join(pieces) + text[end:], changed


def main(argv: list[str] | None = None) -> int:
    """Regenerate (or with ``--check``, verify) the tables of markdown files; returns the exit
    code. Every file is read and rendered before any is written: an error leaves all as they
    were."""
    parser = argparse.ArgumentParser(prog="python3 -m bench.readme_tables",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if any region is stale")
    parser.add_argument("files", nargs="*", default=[str(path) for path in DOCS],
                        help="markdown files to update (default: the repository's README.md "
                             "and the notebooks under bench/results/ it links to)")
    args = parser.parse_args(argv)
    updates = []
    for path in map(Path, args.files):
        try:
            text = path.read_text(encoding="utf-8")
            new_text, changed = update(text)
        except (OSError, TableError) as exc:
            print(f"error: {path.name}: {exc}")
            return 2
        updates.append((path, text, new_text, changed))
    several = len(updates) > 1
    for path, text, new_text, changed in updates:
        if not args.check and new_text != text:
            path.write_text(new_text, encoding="utf-8")
        for name in changed:
            where = f" ({path.name})" if several else ""
            print(f"{'stale' if args.check else 'updated'}: {name}{where}")
    return 1 if args.check and any(changed for *_, changed in updates) else 0


if __name__ == "__main__":
    sys.exit(main())
