"""``gemmlab profile {ncu,nsys} [options] -- <command...>``: Nsight sessions around any gemmlab
command (``profiling.ncu``, ``profiling.nsys``), each writing ``results.json`` / ``.csv`` /
``.png`` (``bench.recording.write_results``) beside the reports in ``--out``."""

from __future__ import annotations

import argparse
import re

from rich.console import Console
from rich.table import Table

from profiling import ncu, nsys

from ..recording import out_problem
from ..session import UsageError, csv_list


def _command(args: argparse.Namespace) -> list[str]:
    """The profiled command: what followed ``--`` (argparse may keep the ``--`` itself)."""
    return args.command[1:] if args.command[:1] == ["--"] else args.command


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {exc}") from exc
    return text


def _session(console: Console, session):
    """``session()``'s result, or an exit status after one ``error:`` line: 2 when the tool
    is missing or the command is bad, 1 when the session ran and failed."""
    try:
        return session()
    except (ncu.ToolMissing, ValueError) as exc:
        console.print(f"error: {exc}")
        return 2
    except RuntimeError as exc:
        console.print(f"error: {exc}")
        return 1


def _check_out(args) -> None:
    """``--out`` before the session starts (a report is never written into old results).

    Raises:
        UsageError: ``bench.recording.out_problem``'s reason.
    """
    if (why := out_problem(args.out, args.overwrite)) is not None:
        raise UsageError(why)


def run_ncu(args: argparse.Namespace, console: Console) -> int:
    """Returns the profiled command's exit status, 2 when ncu is missing or the command is
    empty, 1 when no kernel was profiled."""
    _check_out(args)
    result = _session(console, lambda: ncu.run(
        _command(args), args.out, ranges=args.ranges, sections=tuple(csv_list(args.sections)),
        launch_count=args.launch_count, kernel_name=args.kernel_name,
        metrics=(*ncu.EXTRA_METRICS, *csv_list(args.metrics))))
    if isinstance(result, int):
        return result
    status, rows, commands = result
    if not rows:
        console.print(f"error: no kernel in the report {args.out}/report.ncu-rep")
        return 1
    from bench.recording import collect_meta, write_results

    table = Table(title="ncu: one row per profiled kernel")
    for col in ("id", "range", "kernel", "grid", "block", "µs", "SM %", "DRAM %", "occupancy %",
                "regs", "smem static+dyn B", "TFLOP/s", "DRAM read MB", "DRAM write MB"):
        table.add_column(col, justify="left" if col in ("range", "kernel") else "right")
    for r in rows:
        smem = (None if r["smem_static_bytes"] is None
                else r["smem_static_bytes"] + (r["smem_dynamic_bytes"] or 0))
        megabytes = [None if r[key] is None else r[key] / 1e6
                     for key in ("dram_read_bytes", "dram_write_bytes")]
        table.add_row(str(r["id"]), r["range"] or "-", ncu.short_name(r["kernel"]),
                      _fmt(r["grid_size"], ".0f"), _fmt(r["block_size"], ".0f"),
                      _fmt(r["duration_us"], ".1f"), _fmt(r["sm_pct"], ".1f"),
                      _fmt(r["dram_pct"], ".1f"), _fmt(r["achieved_occupancy_pct"], ".1f"),
                      _fmt(r["registers"], ".0f"), _fmt(smem, ".0f"), _fmt(r["tflops"], ".2f"),
                      *(_fmt(mb, ".2f") for mb in megabytes))
    console.print(table)
    for path in write_results(args.out, collect_meta(), rows, ncu.plot, **commands,
                              profiled_status=status):
        console.print(f"wrote {path}")
    return status


def run_nsys(args: argparse.Namespace, console: Console) -> int:
    """Returns the profiled command's exit status, 2 when nsys is missing or the command is
    bad, 1 when no report came out or its analysis failed."""
    _check_out(args)
    result = _session(console, lambda: nsys.run(_command(args), args.out, name=args.name,
                                                comm_regex=args.comm_regex,
                                                rank_env=args.rank_env))
    if isinstance(result, int):
        return result
    status, reports = result
    from bench.recording import collect_meta, write_results

    for result in reports:
        who = result["report"]
        kernels = Table(title=f"{who}: GPU kernels (top 10 by time)")
        for col in ("kernel", "instances", "total ms", "avg µs", "time %"):
            kernels.add_column(col, justify="left" if col == "kernel" else "right")
        for row in result["stats"]["cuda_gpu_kern_sum"][:10]:
            kernels.add_row(ncu.short_name(str(row["Name"]), 60), str(row["Instances"]),
                            f"{row['Total Time (ns)'] / 1e6:.3f}", f"{row['Avg (ns)'] / 1e3:.1f}",
                            f"{row['Time (%)']:.1f}")
        console.print(kernels)
        ranges = Table(title=f"{who}: NVTX ranges, CPU time and GPU projection")
        for col in ("range", "instances", "CPU total ms", "GPU projected ms"):
            ranges.add_column(col, justify="left" if col == "range" else "right")
        projected = {row["Range"]: row for row in result["stats"]["nvtx_gpu_proj_sum"]}
        for row in result["stats"]["nvtx_sum"]:
            proj = projected.get(row["Range"])
            ranges.add_row(str(row["Range"]), str(row["Instances"]),
                           f"{row['Total Time (ns)'] / 1e6:.3f}",
                           "-" if proj is None else f"{proj['Total Proj Time (ns)'] / 1e6:.3f}")
        console.print(ranges)
    rows = [row for result in reports for row in result["overlap"]]
    lapped = Table(title=f"communication ({args.comm_regex}) and copy engines against compute "
                   f"kernels, per rank")
    for col in ("rank", "GPU", "comm kernels", "compute kernels", "comm ms", "compute ms",
                "overlapped ms", "exposed comm ms", "comm overlapped", "copies", "copy GB",
                "copy ms", "copy beside compute"):
        lapped.add_column(col, justify="right")
    for r in rows:
        lapped.add_row("-" if r["rank"] is None else str(r["rank"]), str(r["device"]),
                       str(r["comm_kernels"]), str(r["compute_kernels"]), f"{r['comm_ms']:.3f}",
                       f"{r['compute_ms']:.3f}", f"{r['overlapped_ms']:.3f}",
                       f"{r['exposed_comm_ms']:.3f}", _fmt(r["overlap_share"], ".0%"),
                       str(r["copies"]), f"{r['copy_gb']:.3f}", f"{r['copy_ms']:.3f}",
                       _fmt(r["copy_share"], ".0%"))
    console.print(lapped)
    stats = {result["report"]: result["stats"] for result in reports}
    for path in write_results(args.out, collect_meta(), rows, nsys.plot, stats=stats,
                              comm_regex=args.comm_regex, profiled_status=status):
        console.print(f"wrote {path}")
    return status


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab profile {ncu,nsys}`` on the ``gemmlab`` command's subparsers."""
    profile = subparsers.add_parser(
        "profile", help="run a gemmlab command under Nsight Compute or Nsight Systems",
        description="Run a command under ncu (per-kernel table) or nsys (per-rank reports, "
        "summaries, communication/compute overlap); the command follows --.")
    tools = profile.add_subparsers(dest="tool", required=True)

    nc = tools.add_parser(
        "ncu", help="Nsight Compute: per-kernel speed of light, occupancy, resources, FLOP/s",
        description="Profile the kernels launched inside gemmlab NVTX ranges with "
        "--clock-control none and the kernel-study sections, and tabulate them per kernel.")
    nc.add_argument("--range", dest="ranges", action="append", metavar="NAME",
                    help="NVTX range of domain gemmlab to profile, e.g. a backend name "
                    "(cuda_regblock); repeat for several (default: every gemmlab range)")
    nc.add_argument("--sections", default=",".join(ncu.SECTIONS),
                    help=f"comma list of ncu sections (default: {','.join(ncu.SECTIONS)})")
    nc.add_argument("--metrics", help="comma list of metrics to collect on top of the sections "
                    "and the FLOP counters (they land in raw.csv)")
    nc.add_argument("-c", "--launch-count", type=int,
                    help="profile at most this many kernels (default: all that match)")
    nc.add_argument("--kernel-name", help="ncu --kernel-name filter: a name or regex:...")
    nc.add_argument("--out", default="profiles/ncu",
                    help="directory for report.ncu-rep, raw.csv, results.json/.csv/.png "
                    "(default: profiles/ncu)")
    nc.add_argument("--overwrite", action="store_true",
                    help="write into a non-empty --out (its files are replaced)")
    nc.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- then the command to profile, e.g. gemmlab bench ...")
    nc.set_defaults(func=run_ncu)

    ns = tools.add_parser(
        "nsys", help="Nsight Systems: one report per rank, summaries, comm/compute overlap",
        description="Trace CUDA and NVTX under nsys (after mpiexec -n P: one report per rank), "
        "write the cuda_gpu_kern_sum, nvtx_sum and nvtx_gpu_proj_sum summaries and measure "
        "how much communication-kernel time ran under compute kernels.")
    ns.add_argument("--out", default="profiles/nsys",
                    help="directory for the reports, their SQLite exports and summaries, "
                    "results.json/.csv/.png (default: profiles/nsys)")
    ns.add_argument("--overwrite", action="store_true",
                    help="write into a non-empty --out (its files are replaced)")
    ns.add_argument("--name", default="report",
                    help="report name; under mpiexec each rank's is NAME.rankR (default: report)")
    ns.add_argument("--comm-regex", type=_regex, default=nsys.COMM_REGEX,
                    help="Python regex over kernel names marking communication kernels "
                    f"(default: {nsys.COMM_REGEX})")
    ns.add_argument("--rank-env", help="environment variable with the MPI rank (default: from "
                    "mpiexec --version: OMPI_COMM_WORLD_RANK or PMI_RANK)")
    ns.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- then the command, e.g. mpiexec -n 2 gemmlab tp ...")
    ns.set_defaults(func=run_nsys)
    return profile
