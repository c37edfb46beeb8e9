"""The ``gemmlab`` command line: ``gemmlab bench`` (the main job) and ``gemmlab info``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from profiling import cli as profile

from . import scale, tune

NO_GPU_BANNER = ("No CUDA GPU found: running the CPU functional check only (small shapes; "
                 "cublas and torch_unfused run torch's CPU BLAS, triton_fused runs under the "
                 "Triton interpreter). Times below are CPU times, not GPU performance.")


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _prepare_backends(console: Console) -> bool:
    """Say whether a GPU is here, first; without one, turn the Triton interpreter on
    before the backends (and with them the Triton kernel) are imported."""
    gpu = torch.cuda.is_available()
    if gpu:
        console.print(f"GPU: {torch.cuda.get_device_name()} (torch {torch.__version__}, "
                      f"CUDA {torch.version.cuda})")
    else:
        console.print(NO_GPU_BANNER)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return gpu


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    gpu = _prepare_backends(console)
    import backends
    from backends.cuda import LAUNCHERS, pycuda_unavailable_reason

    from . import gemm_bench as gb
    from .results import collect_meta, write_results

    device = torch.device("cuda" if gpu else "cpu")
    try:
        shapes = [gb.parse_shape(s) for s in _csv(args.shapes)] if args.shapes else (
            gb.GPU_SHAPES if gpu else gb.CPU_SHAPES)
    except ValueError as exc:
        console.print(f"error: {exc}")
        return 2
    dtype_names = _csv(args.dtypes) if args.dtypes else (gb.GPU_DTYPES if gpu else gb.CPU_DTYPES)
    epilogues = tuple(_csv(args.epilogues))
    unknown = [d for d in dtype_names if d not in gb.DTYPES]
    unknown += [e for e in epilogues if e not in gb.EPILOGUES]
    names = _csv(args.backends) if args.backends else list(backends.BACKENDS)
    unknown += [n for n in names if n not in backends.BACKENDS]
    if unknown:
        console.print(f"error: unknown {', '.join(unknown)}; backends: "
                      f"{', '.join(backends.BACKENDS)}; dtypes: {', '.join(gb.DTYPES)}; "
                      f"epilogues: {', '.join(gb.EPILOGUES)}")
        return 2
    if dtype_names and (why := gb.too_large(shapes, dtype_names, device, epilogues or
                                             ("relu_c",))) is not None:
        console.print(f"error: {why}")
        return 2
    names = gb.runnable(names, console.print)

    launchers = tuple(_csv(args.launcher))
    if unknown := [x for x in launchers if x not in LAUNCHERS]:
        console.print(f"error: unknown launcher {', '.join(unknown)}; known: "
                      f"{', '.join(LAUNCHERS)}")
        return 2
    if "pycuda" in launchers and (why := pycuda_unavailable_reason()) is not None:
        console.print(f"skipped launcher pycuda: {why}")
        launchers = tuple(x for x in launchers if x != "pycuda")
    if not launchers:
        launchers = ("cupy",)

    if args.rounds < 1:
        console.print(f"error: --rounds must be >= 1, got {args.rounds}")
        return 2
    if args.overhead:
        return _overhead(args, names, dtype_names, shapes if args.shapes else None, device,
                         console)
    timing = gb.Timing(args.warmup_ms, args.rep_ms, args.min_reps, args.rounds, args.timing)
    with Progress(console=console, transient=True) as progress:
        total = gb.count_rows(names, shapes, dtype_names, device, epilogues, launchers)
        task = progress.add_task("bench", total=total)

        def step(description: str) -> None:
            progress.update(task, description=description, advance=1)

        rows = gb.run_sweep(names, shapes, dtype_names, device, timing, args.seed, epilogues, step,
                            launchers)
    extra = {}
    if args.resources:
        extra["resources"] = _resources_table(rows, device, console)
    if args.roofline:
        from profiling.roofline import CEILING_SHAPE, measure_ceilings

        if device.type != "cuda":
            console.print("--roofline: no GPU here; the ceilings are measured on a GPU only")
        else:
            extra["ceilings"] = measure_ceilings(dtype_names, device, gb.DTYPES)
            peaks = ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in
                              extra["ceilings"]["peak_tflops"].items())
            console.print(f"ceilings, this run: copy {extra['ceilings']['bandwidth_gbps']:.0f} "
                          f"GB/s; cuBLAS at {CEILING_SHAPE}^3: {peaks}")

    title = "gemmlab bench" + ("" if gpu else "  [CPU functional check: wall times]")
    table = Table(title=title, caption="kernel ms: CUDA-graph replay, L2 flushed (eager where "
                  "marked e); call ms: one eager call to an idle GPU; * launch-bound (call > "
                  f"{1 + gb.LAUNCH_BOUND:.1f} x kernel); % of the best of cublas and cublaslt"
                  if gpu else None)
    for col in ("backend", "dtype", "D =", "M", "N", "K", "kernel ms", "call ms", "TFLOP/s",
                "% best cuBLAS", "x compile", "rel err", "check"):
        numeric = col not in ("backend", "dtype", "D =", "check")
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        label = r["backend"] + (f" ({r['launcher']})" if len(launchers) > 1 and r["launcher"]
                                else "")
        kernel = gb.fmt(r["kernel_ms"], ".4f") + (" e" if r["timing"].startswith("eager")
                                                  else "")
        call = gb.fmt(r["call_ms"], ".4f") + ("*" if r["launch_bound"] else "")
        table.add_row(label, r["dtype"], gb.FORMULAS[r["epilogue"]],
                      str(r["M"]), str(r["N"]), str(r["K"]), kernel, call,
                      gb.fmt(r["tflops"], ".2f"), gb.fmt(r["pct_best_cublas"], ".1f"),
                      gb.fmt(r["x_torch_compile"], ".2f"), gb.fmt(r["rel_err"], ".1e"),
                      "PASS" if r["ok"] else "FAIL")
    console.print(table)
    failed = [r for r in rows if not r["ok"]]
    for r in rows:
        if r["timing"].startswith("eager: "):
            console.print(f"timed eagerly, {r['backend']} {r['dtype']} {r['M']}x{r['N']}x"
                          f"{r['K']}: the CUDA graph capture failed ({r['timing'][7:]})")
    for r in failed:
        why = r["error"] or f"relative error {r['rel_err']:.2e} > tolerance {r['tol']:.0e}"
        console.print(f"FAIL {r['backend']} {r['dtype']} {gb.FORMULAS[r['epilogue']]} "
                      f"{r['M']}x{r['N']}x{r['K']}: {why}")
    if args.out:
        for path in write_results(args.out, collect_meta(), rows, gb.plot, **extra):
            console.print(f"wrote {path}")
        if "ceilings" in extra:
            from profiling.roofline import plot as plot_roofline

            path = Path(args.out) / "roofline.png"
            plot_roofline(rows, extra["ceilings"], gb.DTYPES, gb.EPILOGUES, path)
            console.print(f"wrote {path}")
    console.print(f"{len(rows) - len(failed)} of {len(rows)} rows passed the float64 check")
    return 1 if failed else 0


def _overhead(args, names: list[str], dtype_names: list[str], shapes, device: torch.device,
              console: Console) -> int:
    """``gemmlab bench --overhead``: host µs per call of gemm() against the call it wraps."""
    import backends

    from . import gemm_bench as gb
    from . import overhead_bench as ob
    from .results import collect_meta, write_results

    shapes = shapes or [ob.SHAPE]
    rows = []
    for shape in shapes:
        for name in names:
            impl = backends.BACKENDS[name]
            for dtype_name in dtype_names:
                if gb.supports(impl, dtype_name, device):
                    rows.append(ob.measure(name, dtype_name, device, shape, seed=args.seed))
                    break  # one dtype per backend: the first of --dtypes it supports
    table = Table(title="gemm() host overhead, µs per call (median of timeit loops)",
                  caption=f"targets: gemm() adds <= {ob.TARGET_ADDED_US:g} µs; triton_fused "
                  f"<= {ob.TARGET_TRITON_US:g}, CUDA C <= {ob.TARGET_CUDA_US:g} µs per call; "
                  f"tuned look-up <= {ob.TARGET_TUNED_US:g} µs")
    for col in ("backend", "dtype", "M", "N", "K", "wrapped call", "gemm()", "added",
                "untuned gemm()", "tuned look-up", "check", "targets"):
        table.add_column(col, justify="left" if col in ("backend", "dtype", "check", "targets")
                         else "right")
    for r in rows:
        missed = ob.targets_missed(r) if r["ok"] else []
        r["targets_missed"] = missed
        table.add_row(r["backend"], r["dtype"], str(r["M"]), str(r["N"]), str(r["K"]),
                      gb.fmt(r["wrapped_us"], ".2f"), gb.fmt(r["gemm_us"], ".2f"),
                      gb.fmt(r["added_us"], ".2f"), gb.fmt(r["untuned_us"], ".2f"),
                      gb.fmt(r["tuned_us"], ".2f"), "PASS" if r["ok"] else "FAIL",
                      "; ".join(missed) or ("met" if r["ok"] else "-"))
    console.print(table)
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        console.print(f"FAIL {r['backend']} {r['dtype']}: {r['error']}")
    if args.out:
        for path in write_results(args.out, collect_meta(), rows, ob.plot):
            console.print(f"wrote {path}")
    console.print(f"{len(rows) - len(failed)} of {len(rows)} backends passed the float64 check")
    return 1 if failed else 0


def _resources_table(rows: list[dict], device: torch.device, console: Console) -> list[dict]:
    """Registers, shared and local memory, threads and theoretical occupancy of every CUDA C
    kernel configuration the rows ran (the tuned one where the table had an entry), beside its
    best TFLOP/s; printed, and returned for results.json."""
    import backends
    from backends import tuning
    from backends.cuda.resources import resources
    from backends.registry import CUDA_KERNELS

    from . import gemm_bench as gb

    if device.type != "cuda":
        console.print("--resources: no GPU here; resources are read from the compiled kernels "
                      "on a GPU only")
        return []
    ran: dict[tuple, tuple] = {}  # (backend, dtype, tile sizes) -> (kernel, rows)
    for r in rows:
        if r["backend"] not in CUDA_KERNELS:
            continue
        dtype = gb.DTYPES[r["dtype"]][0]
        choice = tuning.resolve(backends.BACKENDS[r["backend"]], device, dtype, False,
                                r["M"], r["N"], r["K"])
        kernel = choice.config or CUDA_KERNELS[r["backend"]]
        key = r["backend"], r["dtype"], tuple(sorted(kernel.params.items()))
        ran.setdefault(key, (kernel, []))[1].append(r)
    report = []
    for (name, dtype_name, _), (kernel, used) in ran.items():
        dtype = gb.DTYPES[dtype_name][0]
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


def cmd_comm(args: argparse.Namespace, console: Console) -> int:
    """Run under ``mpiexec -n P``; rank 0 prints and writes, every rank measures."""
    import tp.comm

    from . import comm_bench as cb
    from .results import collect_meta, write_results

    world, device, say = _mpi_setup(args, console)
    default_backends = "nccl_direct,nccl,ring,ring/mpi,mpi" if device.type == "cuda" else "mpi,ring"
    names = _csv(args.backend or default_backends)
    ops = _csv(args.op)
    try:
        steps = cb.sizes(cb.parse_bytes(args.minbytes), cb.parse_bytes(args.maxbytes),
                         args.stepfactor)
        unknown = [x for x in ops if x not in cb.COLLECTIVES]
        unknown += [x for x in names if x not in (*tp.comm.BACKENDS, "nccl_direct")]
        unknown += [] if args.dtype in cb.DTYPES else [args.dtype]
        call_checks = _csv(args.call_check)
        unknown += [x for x in call_checks if x not in ("on", "off")]
        if args.check_every < 0:
            raise ValueError(f"-c must be >= 0; got {args.check_every}")
        if unknown:
            raise ValueError(f"unknown {', '.join(unknown)}; ops: {', '.join(cb.COLLECTIVES)}; "
                             f"backends: {', '.join((*tp.comm.BACKENDS, 'nccl_direct'))}; "
                             f"dtypes: {', '.join(cb.DTYPES)}; --call-check: on, off")
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    dtype = cb.DTYPES[args.dtype]
    say(f"gemmlab comm: {world.Get_size()} ranks, {device.type}, {args.dtype}, "
        f"{args.iters} iterations after {args.warmup_iters} warm-up")
    comms = {}
    for name in names:
        if name == "nccl_direct":
            comms[name] = cb.DirectNccl(world, device)
            continue
        for setting in call_checks:
            label = name if call_checks == ["on"] else f"{name} (call check {setting})"
            comms[label] = tp.comm.create(name, world, device, check=setting == "on")
    rows = []
    for op in ops:
        for label, comm in comms.items():
            if not cb.supports(comm, op, dtype):
                say(f"skipped {op} on {label}: not supported for {args.dtype}")
                continue
            block = [row for size in steps
                     if (row := cb.measure(comm, op, size, dtype, device, world, args.iters,
                                           args.warmup_iters, args.check_every,
                                           args.seed)) is not None]
            rows += block
            table = Table(title=f"{op} | {label} | {world.Get_size()} ranks | {args.dtype} | "
                          f"{device.type}")
            for col in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)",
                        "busbw (GB/s)", "#wrong"):
                table.add_column(col, justify="right")
            for r in block:
                timed = ((f"{r['time_us']:.1f}", f"{r['algbw']:.2f}", f"{r['busbw']:.2f}")
                         if r["ok"] else ("FAIL", "-", "-"))
                table.add_row(str(r["bytes"]), str(r["count"]), r["dtype"], *timed,
                              str(r["wrong"]))
            say(table)
    for comm in comms.values():
        comm.close()
    wrong = sum(r["wrong"] for r in rows)
    if world.Get_rank() == 0 and args.out:
        for path in write_results(args.out, collect_meta(), rows, cb.plot):
            say(f"wrote {path}")
    say(f"{len(rows)} measurements, {wrong} wrong elements")
    return 1 if wrong else 0


def _launch_in_order() -> None:
    """Make the GPU start kernels in launch order (``CUDA_DEVICE_MAX_CONNECTIONS=1``), as
    Megatron-LM does for TP overlap: a communication kernel launched before a GEMM then gets
    its SMs first, instead of waiting until the GEMM has taken all of them. CUDA reads it when
    it initialises, so this must run before anything touches CUDA, MPI_Init included (set
    after MPI_Init on the H200 machines, it had no effect: 29% overlap efficiency, not 67%). An
    explicit setting is left alone."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")


def _mpi_setup(args, console):
    """Abort-on-exception, the device (bound GPU or CPU), and a printer for rank 0 only."""
    from mpi4py import MPI

    from tp.mpi import abort_on_exception, bind_device

    abort_on_exception()
    world = MPI.COMM_WORLD
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA GPU is visible")
    device = bind_device(world) if device_type == "cuda" else torch.device("cpu")
    say = console.print if world.Get_rank() == 0 else (lambda *a, **k: None)
    return world, device, say


def cmd_tp(args: argparse.Namespace, console: Console) -> int:
    """Run under ``mpiexec -n P``: every rank is one TP rank of the layers."""
    _launch_in_order()  # before MPI_Init, which may already initialise CUDA
    from mpi4py import MPI

    import tp.comm

    from . import tp_bench
    from .results import collect_meta, write_results

    world, device, say = _mpi_setup(args, console)
    comm_name = args.comm or ("nccl" if device.type == "cuda" else "mpi")
    comm = tp.comm.create(comm_name, world, device)
    self_comm = tp.comm.create("mpi", MPI.COMM_SELF, device)
    say(f"gemmlab tp: TP={world.Get_size()}, {device.type}, {args.dtype}, backend {args.backend}, "
        f"{comm.name}; M={args.tokens} tokens, hidden {args.hidden}, ratio {args.ratio}, "
        f"{args.chunks} chunks, SM margin {args.sm_margin}")
    rows = tp_bench.run(world, comm, self_comm, device, args.dtype, args.tokens, args.hidden,
                        args.ratio, args.backend, args.chunks, args.iters, args.warmup,
                        sm_margin=args.sm_margin)
    timed = Table(title="TP layers against the dense layers")
    for col in ("layer", "phase", "TP", "M", "N", "K", "dtype", "ms", "max rel err", "check"):
        timed.add_column(col, justify="left" if col in ("layer", "phase", "check") else "right")
    for r in rows:
        if "ms" in r:
            timed.add_row(r["layer"], r["phase"], str(r["tp"]), str(r["M"]), str(r["N"]),
                          str(r["K"]), r["dtype"], "-" if r["ms"] is None else f"{r['ms']:.3f}",
                          f"{r['max_rel_err']:.1e}", "PASS" if r["ok"] else "FAIL")
    say(timed)
    lapped = Table(title="compute/communication overlap (ms)")
    for col in ("layer", "phase", "chunks", "compute", "comm", "serial", "overlapped",
                "efficiency", "comm hidden", "max rel err", "check"):
        lapped.add_column(col, justify="left" if col in ("layer", "phase", "check") else "right")
    for r in rows:
        if "overlap_efficiency" in r:
            times = ((f"{r[k]:.3f}" for k in ("compute_ms", "comm_ms", "serial_ms",
                                              "overlapped_ms")) if r["ok"] else ["-"] * 4)
            shares = ((f"{r['overlap_efficiency']:.0%}", f"{r['comm_hidden']:.0%}")
                      if r["ok"] else ("-", "-"))
            lapped.add_row(r["layer"], r["phase"], str(r["chunks"]), *times, *shares,
                           f"{r['max_rel_err']:.1e}", "PASS" if r["ok"] else "FAIL")
    say(lapped)
    if world.Get_rank() == 0 and args.out:
        for path in write_results(args.out, collect_meta(), rows, tp_bench.plot):
            say(f"wrote {path}")
    failed = [r for r in rows if not r.get("ok", True)]
    say(f"{len(rows)} rows, {len(failed)} failed the check against the dense layers")
    return 1 if failed else 0


def cmd_train(args: argparse.Namespace, console: Console) -> int:
    """``gemmlab train`` (one process) or ``mpiexec -n P gemmlab train --tp T --dp D``."""
    _launch_in_order()  # before MPI_Init, which may already initialise CUDA
    import json
    import statistics

    import tp.comm
    from tp.grid import ProcessGrid
    from tp.train import train
    from tp.transformer import GPTConfig

    from .results import collect_meta, write_results

    world, device, say = _mpi_setup(args, console)
    size = world.Get_size()
    dp = args.dp or size // max(args.tp, 1)
    if args.tp < 1 or args.tp * dp != size:
        say(f"error: --tp {args.tp} x --dp {dp} must equal the {size} ranks")
        return 2
    grid = ProcessGrid.create(args.tp, world)
    comm_name = args.comm or ("nccl" if device.type == "cuda" else "mpi")
    tp_comm = tp.comm.create(comm_name, grid.tp_comm, device)
    dp_comm = tp.comm.create(comm_name, grid.dp_comm, device)
    config = GPTConfig(seq_len=args.seq, hidden=args.hidden, heads=args.heads, layers=args.layers)
    label = f"DP {dp} x TP {args.tp}"
    say(f"gemmlab train: {label}, {device.type}, {args.dtype}, backend {args.backend}, "
        f"{tp_comm.name}; {config}")
    every = max(1, args.steps // 10)

    def log(step, loss, ms):
        if step % every == 0 or step == args.steps - 1:
            say(f"step {step:5d}  loss {loss:.4f}  {ms:8.1f} ms")

    result = train(config, tp_comm, dp_comm, steps=args.steps, batch=args.batch, lr=args.lr,
                   seed=args.seed, device=device, dtype={"fp32": torch.float32,
                                                         "bf16": torch.bfloat16}[args.dtype],
                   backend=args.backend, overlap=not args.no_overlap, log=log)
    timed = result.step_ms[1:] or result.step_ms  # the first step includes compilation
    summary = {"configuration": label, "tp": args.tp, "dp": dp, "device": device.type,
               "dtype": args.dtype, "backend": args.backend, "comm": tp_comm.name,
               "steps": args.steps, "ms_per_step": statistics.median(timed),
               "tokens_per_s": args.batch * args.seq / (statistics.median(timed) / 1e3),
               "final_loss": result.loss[-1]}
    runs = [summary]
    reference = None
    if args.reference:
        reference = json.loads(Path(args.reference).read_text())
        runs.append(reference["summary"])
        diff = max(abs(a - b) for a, b in zip(result.loss, reference["loss"]))
        summary["max_loss_diff_vs_reference"] = diff
    table = Table(title="run time per configuration")
    for col in ("configuration", "device", "dtype", "backend", "comm", "steps", "ms/step",
                "tokens/s", "final loss"):
        table.add_column(col, justify="left" if col in ("configuration", "device", "dtype",
                                                        "backend", "comm") else "right")
    for run in runs:
        table.add_row(run["configuration"], run["device"], run["dtype"], run["backend"],
                      run["comm"], str(run["steps"]), f"{run['ms_per_step']:.1f}",
                      f"{run['tokens_per_s']:.0f}", f"{run['final_loss']:.4f}")
    say(table)
    if reference is not None:
        say(f"largest |loss - reference loss| over {len(reference['loss'])} steps: "
            f"{summary['max_loss_diff_vs_reference']:.2e}")
    if world.Get_rank() == 0 and args.out:
        from .train_plot import plot_loss

        rows = [{"step": i, "loss": loss, "ms": ms}
                for i, (loss, ms) in enumerate(zip(result.loss, result.step_ms))]
        extra = {"loss": result.loss, "summary": summary}
        if reference is not None:
            extra["reference"] = {"configuration": reference["summary"]["configuration"],
                                  "loss": reference["loss"]}
        plot = functools.partial(plot_loss, label=label, reference=extra.get("reference"))
        for path in write_results(args.out, collect_meta(), rows, plot, **extra):
            say(f"wrote {path}")
    return 0


def cmd_info(args: argparse.Namespace, console: Console) -> int:
    _prepare_backends(console)
    import backends
    from backends.reference import DTYPE_NAMES

    table = Table(title="gemmlab backends, in ladder order")
    for col in ("backend", "technique", "dtypes", "devices", "fused +C/ReLU", "TF32", "runs here"):
        table.add_column(col)
    for backend, status in zip(backends.LADDER, backends.available()):
        table.add_row(backend.name, backend.summary,
                      ",".join(DTYPE_NAMES[d] for d in backend.dtypes), ",".join(backend.devices),
                      "yes" if backend.fused_epilogue else "no", "yes" if backend.tf32 else "no",
                      "yes" if status.runs else f"no: {status.reason}")
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemmlab", description=(
        "gemmlab: D = ReLU(A @ B + C) from a naive CUDA kernel to cuBLAS, measured."))
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="check every backend against float64, then time it",
                           description="Check every backend against a float64 reference on "
                           "poisoned outputs, then time the ones that pass: kernel time (CUDA-"
                           "graph replay) and call time (eager), medians, L2 flushed.")
    bench.add_argument("--backends", help="comma list (default: every backend that runs here)")
    bench.add_argument("--shapes", help="comma list of N (square) or MxNxK "
                       "(default on GPU: 1024,2048,4096,8192,8192x8192x1024,16384x4096x512,"
                       "4096x4096x256; on CPU: 127x129x65,256)")
    bench.add_argument("--dtypes", help="comma list of fp32, tf32, fp16, bf16 "
                       "(default on GPU: all four; on CPU: fp32,fp16,bf16)")
    bench.add_argument("--epilogues", default="relu_c",
                       help="comma list of relu_c (ReLU(A@B+C), default), c (A@B+C), relu_bias, "
                       "bias (C a length-N bias), none (plain A@B)")
    bench.add_argument("--warmup-ms", type=float, default=25, help="warm-up per row (ms)")
    bench.add_argument("--rep-ms", type=float, default=100, help="timed repeats per row (ms)")
    bench.add_argument("--min-reps", type=int, default=10, help="fewest timed repeats per row")
    bench.add_argument("--rounds", type=int, default=1,
                       help="time the rows of each shape and dtype this many times, taking "
                            "turns, and report each row's median (evens out clock drift in "
                            "ratios; default 1)")
    bench.add_argument("--timing", choices=("graph", "eager"), default="graph",
                       help="what TFLOP/s and the ratios come from: graph (kernel time, CUDA-"
                       "graph replay, default) or eager (do_bench of the eager call); the call "
                       "time is measured either way")
    bench.add_argument("--overhead", action="store_true",
                       help="instead of the sweep: host µs per call of gemm() against the call "
                       "each backend wraps, on a tiny shape (default 128; --shapes, --backends "
                       "and --dtypes select)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    bench.add_argument("--launcher", default="cupy",
                       help="comma list of cupy, pycuda: what launches the CUDA C kernels "
                       "(each gives its own rows)")
    bench.add_argument("--resources", action="store_true",
                       help="print registers, shared/local memory and occupancy per CUDA kernel")
    bench.add_argument("--roofline", action="store_true",
                       help="measure the ceilings in this run and draw roofline.png in --out")
    bench.add_argument("--out", help="directory for results.json, results.csv, results.png")
    bench.set_defaults(func=cmd_bench)

    comm = sub.add_parser("comm", help="nccl-tests-style sweep of the collectives "
                          "(start with mpiexec -n P gemmlab comm ...)",
                          description="Check, then time, collectives over a size sweep on every "
                          "rank of MPI_COMM_WORLD; rank 0 prints and writes the results.")
    comm.add_argument("-b", "--minbytes", default="1K", help="smallest size (default 1K)")
    comm.add_argument("-e", "--maxbytes", default="16M", help="largest size (default 16M)")
    comm.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier")
    comm.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    comm.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations")
    comm.add_argument("--op", default="all_reduce",
                      help="comma list of all_reduce, all_gather, reduce_scatter, all_to_all, "
                      "broadcast")
    comm.add_argument("--backend", help="comma list of mpi, ring, ring/mpi, ring/nccl, nccl, "
                      "nccl_direct (default: all that run on the device)")
    comm.add_argument("--dtype", default="float32", help="float32, float64, float16, "
                      "bfloat16, int32 or int64")
    comm.add_argument("--device", choices=("cpu", "cuda"),
                      help="where the buffers live (default: cuda when a GPU is visible)")
    comm.add_argument("-c", "--check-every", type=int, default=0, metavar="N",
                      help="check the output again after every N timed iterations, outside "
                      "the timing (default 0: the first call only, which is always checked)")
    comm.add_argument("--call-check", default="on",
                      help="comma list of on, off: gemmlab communicators with and without "
                      "the ranks' call check (tp.comm.create's check=); both measure its cost")
    comm.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    comm.add_argument("--out", help="directory for results.json, results.csv, results.png")
    comm.set_defaults(func=cmd_comm)

    tpp = sub.add_parser("tp", help="check and time the TP layers, with the overlap report "
                         "(start with mpiexec -n P gemmlab tp ...)")
    tpp.add_argument("--tokens", type=int, default=1024, help="rows M of the activations")
    tpp.add_argument("--hidden", type=int, default=512, help="model width")
    tpp.add_argument("--ratio", type=float, default=4, help="MLP expansion: fc1 is hidden -> "
                     "ratio * hidden")
    tpp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    tpp.add_argument("--backend", default="cublas", help="backends.gemm backend")
    tpp.add_argument("--comm", help="mpi, ring or nccl (default nccl on GPUs, mpi on CPUs)")
    tpp.add_argument("--chunks", type=int, default=4, help="row chunks of the row-parallel GEMM")
    tpp.add_argument("--sm-margin", type=int, default=0,
                     help="SMs the overlapped cuBLAS GEMMs leave free for NCCL (cuBLASLt SM "
                     "count target; 0: all SMs)")
    tpp.add_argument("--iters", type=int, default=10)
    tpp.add_argument("--warmup", type=int, default=3)
    tpp.add_argument("--device", choices=("cpu", "cuda"))
    tpp.add_argument("--out", help="directory for results.json, results.csv, results.png")
    tpp.set_defaults(func=cmd_tp)

    tr = sub.add_parser("train", help="train a small GPT with DP x TP "
                        "(mpiexec -n P gemmlab train --tp T --dp D)")
    tr.add_argument("--tp", type=int, default=1, help="TP size")
    tr.add_argument("--dp", type=int, help="DP size (default: ranks / TP)")
    tr.add_argument("--steps", type=int, default=50)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    tr.add_argument("--seq", type=int, default=64, help="sequence length (bytes)")
    tr.add_argument("--hidden", type=int, default=128)
    tr.add_argument("--heads", type=int, default=4)
    tr.add_argument("--layers", type=int, default=2)
    tr.add_argument("--lr", type=float, default=3e-3)
    tr.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    tr.add_argument("--backend", default="cublas", help="backends.gemm backend of the TP layers")
    tr.add_argument("--comm", help="mpi, ring or nccl (default nccl on GPUs, mpi on CPUs)")
    tr.add_argument("--no-overlap", action="store_true", help="no compute/communication overlap")
    tr.add_argument("--device", choices=("cpu", "cuda"))
    tr.add_argument("--reference", help="results.json of another run to compare the loss with")
    tr.add_argument("--out", help="directory for results.json (with a loss list), .csv, .png")
    tr.set_defaults(func=cmd_train)

    tune.add_parser(sub)
    scale.add_parser(sub)
    profile.add_parser(sub)

    info = sub.add_parser("info", help="which backends run on this machine, and why not")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Tables stay unwrapped when the output is a file or a pipe (rich assumes 80 columns).
    return args.func(args, Console(width=None if sys.stdout.isatty() else 160))


if __name__ == "__main__":
    sys.exit(main())
