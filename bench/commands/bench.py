"""``gemmlab bench``: check every backend against float64, then time it (the main job); with
``--overhead``, what ``gemm()`` costs the host per call."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from backends.dtypes import DTYPES, GEMM, GEMM_CPU, GEMM_GPU

from ..session import (
    UsageError,
    add_run_options,
    check_run_options,
    check_timing_options,
    csv_list,
    prepare_backends,
    row_printer,
    set_threads,
)
from ..style import flops
from ..timing import SETTLE_MS


def _selection(args, gpu: bool):
    """(backend names, shapes, dtype names, epilogues, launchers) the arguments ask for.

    Raises:
        UsageError: a name that does not exist, a malformed shape, ``--rounds`` < 1.
    """
    import backends
    from backends.cuda import LAUNCHERS

    from .. import gemm_bench as gb

    try:
        shapes = ([gb.parse_shape(s) for s in csv_list(args.shape)] if args.shape
                  else (gb.GPU_SHAPES if gpu else gb.CPU_SHAPES))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not shapes:
        raise UsageError(f"--shape {args.shape!r} lists no shape")
    dtype_names = csv_list(args.dtype) or list(GEMM_GPU if gpu else GEMM_CPU)
    epilogues = tuple(csv_list(args.epilogue))
    names = csv_list(args.backend) or list(backends.BACKENDS)
    launchers = tuple(csv_list(args.launcher)) or ("cupy",)
    wrong = [f"unknown {kind} {', '.join(bad)} (known: {', '.join(known)})"
             for kind, given, known in (("backend", names, tuple(backends.BACKENDS)),
                                        ("dtype", dtype_names, GEMM),
                                        ("epilogue", epilogues, tuple(gb.EPILOGUES)),
                                        ("launcher", launchers, LAUNCHERS))
             if (bad := [x for x in given if x not in known])]
    if wrong:
        raise UsageError("; ".join(wrong))
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    check_timing_options(args.warmup_ms, args.rep_ms, args.min_reps)
    return names, shapes, dtype_names, epilogues or ("relu_c",), launchers


def run(args: argparse.Namespace, console: Console) -> int:
    """0 when every row passed its float64 check, 1 when one failed; a mistake in the
    arguments (checked before any work) raises UsageError."""
    check_run_options(args)
    set_threads(args.threads)
    gpu = prepare_backends(console)
    from backends.cuda import pycuda_unavailable_reason

    from .. import gemm_bench as gb
    from ..recording import Recorder

    device = torch.device("cuda" if gpu else "cpu")
    requested, shapes, dtype_names, epilogues, launchers = _selection(args, gpu)
    if (why := gb.too_large(shapes, dtype_names, device, epilogues)) is not None:
        raise UsageError(why)
    if "pycuda" in launchers and (why := pycuda_unavailable_reason()) is not None:
        console.print(f"skipped launcher pycuda: {why}")
        launchers = tuple(x for x in launchers if x != "pycuda") or ("cupy",)
    names = gb.runnable(requested, console.print)
    total = gb.count_rows(names, shapes, dtype_names, device, epilogues, launchers)
    if total == 0:
        raise UsageError(gb.nothing_runs(requested, dtype_names, device))
    if args.overhead:
        return _overhead(args, names, dtype_names, shapes if args.shape else None, device,
                         console)
    timing = gb.Timing(args.warmup_ms, args.rep_ms, args.min_reps, args.rounds, args.timing)
    recorder = Recorder(args.out, gb.plot, row_printer(console, gb.describe, total),
                        meta={"timing": dataclasses.asdict(timing)})
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("bench", total=total)

        def step(description: str) -> None:
            progress.update(task, description=description, advance=1)

        gb.run_sweep(names, shapes, dtype_names, device, timing, args.seed, epilogues, step,
                     launchers, record=recorder.extend)
    rows = recorder.rows
    extra = {}
    if args.resources:
        extra["resources"] = _resources_table(rows, device, console)
    if args.roofline:
        from ..roofline import CEILING_SHAPE, measure_ceilings

        if device.type != "cuda":
            console.print("--roofline: no GPU here; the ceilings are measured on a GPU only")
        else:
            extra["ceilings"] = measure_ceilings(dtype_names, device)
            peaks = ", ".join(f"{k} {flops(v)}" for k, v in
                              extra["ceilings"]["peak_tflops"].items())
            console.print(f"ceilings, this run: copy {extra['ceilings']['bandwidth_gbps']:.0f} "
                          f"GB/s; cuBLAS at {CEILING_SHAPE}^3: {peaks}")
    console.print(_table(rows, launchers, gpu))
    failed = [r for r in rows if not r["ok"]]
    for r in rows:
        if r["timing"].startswith("eager: "):
            console.print(f"timed eagerly, {r['backend']} {r['dtype']} {r['M']}x{r['N']}x"
                          f"{r['K']}: the CUDA graph capture failed ({r['timing'][7:]})")
    for r in failed:
        why = r["error"] or f"relative error {r['rel_err']:.2e} > tolerance {r['tol']:.0e}"
        console.print(f"FAIL {r['backend']} {r['dtype']} {gb.FORMULAS[r['epilogue']]} "
                      f"{r['M']}x{r['N']}x{r['K']}: {why}")
    for path in recorder.finish(**extra):
        console.print(f"wrote {path}")
    if "ceilings" in extra and args.out:
        from ..roofline import plot as plot_roofline

        path = Path(args.out) / "roofline.png"
        plot_roofline(rows, extra["ceilings"], gb.EPILOGUES, path)
        console.print(f"wrote {path}")
    console.print(f"{len(rows) - len(failed)} of {len(rows)} rows passed the float64 check")
    return 1 if failed else 0


def _table(rows: list[dict], launchers: tuple[str, ...], gpu: bool) -> Table:
    """The sweep's table. On a CPU the baselines are torch's CPU BLAS, not cuBLAS, and the
    times are wall times of a functional check: the labels say so."""
    from .. import gemm_bench as gb

    title = "gemmlab bench" + ("" if gpu else "  [CPU functional check: wall times]")
    table = Table(title=title, caption="kernel ms: CUDA-graph replay, L2 flushed (eager where "
                  "marked e); call ms: one eager call to an idle GPU; * launch-bound (call > "
                  f"{1 + gb.LAUNCH_BOUND:.1f} x kernel); % of the best of cublas and cublaslt"
                  if gpu else None)
    best = "% best cuBLAS" if gpu else "% torch BLAS"
    kernel, call = ("kernel ms", "call ms") if gpu else ("ms", "call ms")
    for col in ("backend", "dtype", "D =", "M", "N", "K", kernel, call, "FLOP/s", best,
                "x compile", "rel err", "check"):
        numeric = col not in ("backend", "dtype", "D =", "check")
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        label = r["backend"] + (f" ({r['launcher']})" if len(launchers) > 1 and r["launcher"]
                                else "")
        eager = " e" if gpu and r["timing"].startswith("eager") else ""
        table.add_row(label, r["dtype"], gb.FORMULAS[r["epilogue"]],
                      str(r["M"]), str(r["N"]), str(r["K"]),
                      gb.fmt(r["kernel_ms"], ".4f") + eager,
                      gb.fmt(r["call_ms"], ".4f") + ("*" if r["launch_bound"] else ""),
                      flops(r["tflops"]), gb.fmt(r["pct_best_cublas"], ".1f"),
                      gb.fmt(r["x_torch_compile"], ".2f"), gb.fmt(r["rel_err"], ".1e"),
                      "PASS" if r["ok"] else "FAIL")
    return table


def _overhead(args, names: list[str], dtype_names: list[str], shapes, device: torch.device,
              console: Console) -> int:
    """``gemmlab bench --overhead``: host µs per call of gemm() against the call it wraps."""
    import backends

    from .. import gemm_bench as gb
    from .. import overhead_bench as ob
    from ..recording import Recorder

    shapes = shapes or [ob.SHAPE]
    recorder = Recorder(args.out, ob.plot, row_printer(console, lambda r: (
        f"{r['backend']} {r['dtype']}: {gb.fmt(r['gemm_us'], '.2f')} µs per gemm() call")))
    for shape in shapes:
        for name in names:
            impl = backends.BACKENDS[name]
            for dtype_name in dtype_names:
                if gb.supports(impl, dtype_name, device):
                    row = ob.measure(name, dtype_name, device, shape, seed=args.seed)
                    row["targets_missed"] = ob.targets_missed(row) if row["ok"] else []
                    recorder.add(row)
                    break  # one dtype per backend: the first of --dtype it supports
    rows = recorder.rows
    table = Table(title="gemm() host overhead, µs per call (median of timeit loops)",
                  caption="added = front (gemm()'s own look-up: gemm() minus its bound launch) "
                  "+ launch - wrapped (the bound launch minus the library call), each a "
                  f"median of per-round differences; targets: gemm() adds <= "
                  f"{ob.TARGET_ADDED_US:g} µs; triton_fused "
                  f"<= {ob.TARGET_TRITON_US:g}, CUDA C <= {ob.TARGET_CUDA_US:g} µs per call; "
                  f"tuned look-up <= {ob.TARGET_TUNED_US:g} µs; host ns: the host's speed "
                  "during the row (ns per call of an empty Python function)")
    for col in ("backend", "dtype", "M", "N", "K", "wrapped call", "gemm()", "added (quartiles)",
                "front", "launch - wrapped", "untuned gemm()", "tuned look-up", "host ns",
                "check", "targets"):
        table.add_column(col, justify="left" if col in ("backend", "dtype", "check", "targets")
                         else "right")
    for r in rows:
        table.add_row(r["backend"], r["dtype"], str(r["M"]), str(r["N"]), str(r["K"]),
                      gb.fmt(r["wrapped_us"], ".2f"), gb.fmt(r["gemm_us"], ".2f"),
                      ob.added_text(r, ".2f"), gb.fmt(r["front_us"], ".2f"),
                      gb.fmt(r["closure_us"], ".2f"), gb.fmt(r["untuned_us"], ".2f"),
                      gb.fmt(r["tuned_us"], ".2f"), gb.fmt(r["host_ns"], ".1f"),
                      "PASS" if r["ok"] else "FAIL",
                      "; ".join(r["targets_missed"]) or ("met" if r["ok"] else "-"))
    console.print(table)
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        console.print(f"FAIL {r['backend']} {r['dtype']}: {r['error']}")
    for path in recorder.finish():
        console.print(f"wrote {path}")
    console.print(f"{len(rows) - len(failed)} of {len(rows)} backends passed the float64 check")
    return 1 if failed else 0


def _resources_table(rows: list[dict], device: torch.device, console: Console) -> list[dict]:
    """Registers, shared and local memory, threads and theoretical occupancy of every CUDA C
    kernel configuration the rows ran (the tuned one where the table had an entry, as each
    row's ``config`` names it), beside its best TFLOP/s; printed, and returned for
    results.json. Rows that raised before their kernel ran (no ``config``) are left out."""
    from backends.cuda.resources import resources
    from backends.registry import CUDA_KERNELS

    from .. import gemm_bench as gb

    if device.type != "cuda":
        console.print("--resources: no GPU here; resources are read from the compiled kernels "
                      "on a GPU only")
        return []
    ran: dict[tuple, tuple] = {}  # (backend, dtype, tile sizes) -> (kernel, rows)
    for r in rows:
        if r["backend"] not in CUDA_KERNELS or not r["config"]:
            continue
        kernel = CUDA_KERNELS[r["backend"]].described(r["config"])
        key = r["backend"], r["dtype"], tuple(sorted(kernel.params.items()))
        ran.setdefault(key, (kernel, []))[1].append(r)
    report = []
    for (name, dtype_name, _), (kernel, used) in ran.items():
        dtype = DTYPES[dtype_name].torch
        best = max((r["tflops"] for r in used if r["tflops"] is not None), default=None)
        report.append({"backend": name, "dtype": dtype_name,
                       "config": " ".join(d[2:] for d in kernel.defines()),
                       **resources(kernel, dtype, device.index or 0),
                       "shapes": sorted({f"{r['M']}x{r['N']}x{r['K']}" for r in used}),
                       "best_tflops": best})
    table = Table(title="CUDA C kernels: resources of each configuration run, and its best "
                        "TFLOP/s")
    for col in ("backend", "dtype", "regs/thread", "static smem", "dynamic smem", "local B",
                "threads", "blocks/SM", "occupancy", "best TFLOP/s", "config"):
        table.add_column(col, justify="left" if col in ("backend", "dtype", "config") else "right")
    for r in report:
        table.add_row(r["backend"], r["dtype"], str(r["registers"]), str(r["static_smem"]),
                      str(r["dynamic_smem"]), str(r["local_bytes"]), str(r["threads"]),
                      str(r["blocks_per_sm"]), f"{r['occupancy']:.0%}",
                      gb.fmt(r["best_tflops"], ".2f"), r["config"])
    console.print(table)
    return report


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab bench``."""
    bench = subparsers.add_parser(
        "bench", help="check every backend against float64, then time it",
        description="Check every backend against a float64 reference on poisoned outputs, "
        "then time the ones that pass: kernel time (CUDA-graph replay) and call time (eager), "
        "medians, L2 flushed.")
    bench.add_argument("--backend", help="comma list of GEMM backends (default: every backend "
                       "that runs here; gemmlab info lists them)")
    bench.add_argument("--shape", help="comma list of N (square) or MxNxK "
                       "(default on GPU: 1024,2048,4096,8192,8192x8192x1024,16384x4096x512,"
                       "4096x4096x256; on CPU: 127x129x65,256)")
    bench.add_argument("--dtype", help="comma list of fp32, tf32, fp16, bf16 "
                       "(default on GPU: all four; on CPU: fp32,fp16,bf16)")
    bench.add_argument("--epilogue", default="relu_c",
                       help="comma list of relu_c (ReLU(A@B+C), default), c (A@B+C), relu_bias, "
                       "bias (C a length-N bias), none (plain A@B)")
    bench.add_argument("--warmup-ms", type=float, default=SETTLE_MS,
                       help="back-to-back calls before each row's kernel-time samples, in "
                       f"every round (ms; default {SETTLE_MS:.0f}: long enough for a GPU at "
                       "its power limit to reach its sustained clock)")
    bench.add_argument("--rep-ms", type=float, default=100, help="timed repeats per row (ms)")
    bench.add_argument("--min-reps", type=int, default=10, help="fewest timed repeats per row")
    bench.add_argument("--rounds", type=int, default=1,
                       help="time the rows of each shape and dtype this many times, taking "
                            "turns (in the sweep's order, then shuffled), and report each "
                            "row's median (evens out clock drift in ratios; default 1)")
    bench.add_argument("--timing", choices=("graph", "eager"), default="graph",
                       help="what FLOP/s and the ratios come from: graph (kernel time, CUDA-"
                       "graph replay, default) or eager (do_bench of the eager call); the call "
                       "time is measured either way")
    bench.add_argument("--overhead", action="store_true",
                       help="instead of the sweep: host µs per call of gemm() against the call "
                       "each backend wraps, on a tiny shape (default 32; --shape, --backend "
                       "and --dtype select)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    bench.add_argument("--launcher", default="cupy",
                       help="comma list of cupy, pycuda: what launches the CUDA C kernels "
                       "(each gives its own rows)")
    bench.add_argument("--resources", action="store_true",
                       help="print registers, shared/local memory and occupancy per CUDA kernel")
    bench.add_argument("--roofline", action="store_true",
                       help="measure the ceilings in this run and draw roofline.png in --out")
    add_run_options(bench)
    bench.set_defaults(func=run)
    return bench
