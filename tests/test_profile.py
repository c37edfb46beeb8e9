"""``gemmlab profile {ncu,nsys}`` on CPU: the command lines built, the parsers on reports
captured on the H200 (``tests/fixtures/profiling/``), the overlap analysis on SQLite exports
with known kernel intervals, and the sessions end to end with stand-in ncu / nsys / mpiexec."""

import argparse
import io
import json
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from bench.commands import profile as cli
from profiling import ncu, nsys

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "profiling"
SECTIONS = ["--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", "--section",
            "Occupancy", "--section", "LaunchStats", "--section", "SpeedOfLight_RooflineChart"]
NSYS_PROFILE = ["nsys", "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--sample=none",
                "--cpuctxsw=none"]


def gemmlab_profile(*argv: str) -> tuple[int, str]:
    """``gemmlab profile ...`` through the parser bench/cli.py registers it on; (status, output)."""
    parser = argparse.ArgumentParser(prog="gemmlab")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profile", *argv])
    out = io.StringIO()
    status = args.func(args, Console(file=out, width=250))
    return status, out.getvalue()


# ---- command lines -------------------------------------------------------------------------

def test_ncu_command_line():
    argv = ncu.build_command(["gemmlab", "bench", "--backend", "cuda_regblock"], "out/report",
                             ranges=["cuda_regblock"])
    assert argv == ["ncu", "--clock-control", "none", "--nvtx",
                    "--nvtx-include", "gemmlab@cuda_regblock/", *SECTIONS,
                    "--metrics", ",".join(ncu.EXTRA_METRICS),
                    "-o", "out/report", "-f", "gemmlab", "bench", "--backend", "cuda_regblock"]


def test_ncu_command_line_options():
    argv = ncu.build_command(["python3", "x.py"], "r", ranges=["cuda_mma", "triton_fused"],
                             sections=("SpeedOfLight",), launch_count=3,
                             kernel_name="regex:gemm", metrics=())
    assert argv == ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include",
                    "gemmlab@cuda_mma/", "--nvtx-include", "gemmlab@triton_fused/", "--section",
                    "SpeedOfLight", "--launch-count", "3", "--kernel-name",
                    "regex:gemm", "-o", "r", "-f", "python3", "x.py"]


def test_ncu_default_filter_is_every_gemmlab_push_pop_range():
    argv = ncu.build_command(["gemmlab", "bench"], "r")
    assert argv[argv.index("--nvtx-include") + 1] == "regex:gemmlab@.+/"
    assert argv.count("--nvtx-include") == 1


def test_ncu_export_command():
    assert ncu.export_command("out/report.ncu-rep") == [
        "ncu", "--import", "out/report.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]


def test_ncu_needs_a_command():
    with pytest.raises(ValueError, match="no command to profile"):
        ncu.build_command([], "r")


def test_nsys_command_line_one_process():
    assert nsys.build_command(["gemmlab", "bench", "--shape", "1024"], "out") == [
        *NSYS_PROFILE, "--output=out/report", "--force-overwrite=true",
        "gemmlab", "bench", "--shape", "1024"]


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_RANK", "PMI_RANK"])
def test_nsys_goes_after_mpiexec_with_one_report_per_rank(variable):
    argv = nsys.build_command(["mpiexec", "-n", "2", "gemmlab", "tp", "--dtype", "bf16"], "out",
                              "tp", rank_env=variable)
    assert argv == ["mpiexec", "-n", "2", *NSYS_PROFILE, f"--output=out/tp.rank%q{{{variable}}}",
                    "--force-overwrite=true", "gemmlab", "tp", "--dtype", "bf16"]


@pytest.mark.parametrize("command,launcher", [
    (["mpirun", "-np", "4", "--bind-to", "none", "-x", "NCCL_DEBUG=INFO", "--oversubscribe",
      "python3", "-m", "bench.cli", "tp"], 8),
    (["/usr/bin/mpiexec", "--mca", "btl", "^openib", "-n", "2", "gemmlab", "-n", "3"], 6),
    (["mpiexec", "-genv", "A", "1", "-ppn", "2", "--n=2", "gemmlab", "tp"], 7),
    (["gemmlab", "tp", "-n", "2"], 0),
])
def test_split_launcher(command, launcher):
    assert nsys.split_launcher(command) == (command[:launcher], command[launcher:])


@pytest.mark.parametrize("command,message", [
    ([], "no command to profile"), (["mpiexec", "-n", "2"], "no program after mpiexec -n 2")])
def test_split_launcher_rejects(command, message):
    with pytest.raises(ValueError, match=message):
        nsys.split_launcher(command)


def test_an_mpi_command_needs_the_rank_variable():
    with pytest.raises(ValueError, match="rank variable"):
        nsys.build_command(["mpiexec", "-n", "2", "gemmlab", "tp"], "out")


@pytest.mark.parametrize("text,variable", [
    ("mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/",
     "OMPI_COMM_WORLD_RANK"),
    ("mpiexec (Open MPI) 5.0.3\n", "OMPI_COMM_WORLD_RANK"),
    ("HYDRA build details:\n    Version:                                 4.2.2\n", "PMI_RANK"),
])
def test_rank_variable_from_the_mpi_flavour(text, variable):
    assert nsys.rank_variable(text) == variable


def test_rank_variable_of_an_unknown_mpi():
    with pytest.raises(ValueError, match="unknown MPI flavour .*--rank-env"):
        nsys.rank_variable("SomeMPI 1.0\n")


def test_nsys_stats_and_export_command_lines():
    assert nsys.stats_command("o/r.rank1.sqlite", "o/r.rank1") == [
        "nsys", "stats", "--report=cuda_gpu_kern_sum", "--report=nvtx_sum",
        "--report=nvtx_gpu_proj_sum", "--format=csv", "--output=o/r.rank1",
        "--force-overwrite=true", "o/r.rank1.sqlite"]
    assert nsys.export_command("o/r.nsys-rep", "o/r.sqlite") == [
        "nsys", "export", "--type=sqlite", "--force-overwrite=true", "--output=o/r.sqlite",
        "o/r.nsys-rep"]


@pytest.mark.parametrize("name,rank", [("tp.rank0.nsys-rep", 0), ("tp.rank13.nsys-rep", 13),
                                       ("report.nsys-rep", None)])
def test_rank_of_a_report(name, rank):
    assert nsys.rank_of(Path(name)) == rank


# ---- parsers on the H200 captures ----------------------------------------------------------

def test_ncu_raw_page_parsed_per_kernel():
    rows = ncu.parse_raw_csv((FIXTURES / "ncu_raw.csv").read_text())
    assert [(r["id"], r["range"], r["kernel"][:17]) for r in rows] == [
        (0, "cuda_regblock", "gemm_regblock"), (1, "cuda_mma", "gemm_mma"),
        (2, "cuda_mma", "gemm_mma"), (3, "triton_fused", "fused_gemm_kernel"),
        (4, "cublas", "sm90_xmma_gemm_f3"), (5, "cublas", "void at::vectoriz")]
    regblock = rows[0]
    assert regblock["duration_us"] == pytest.approx(574.72)
    assert (regblock["sm_pct"], regblock["memory_pct"], regblock["dram_pct"]) == (68.15, 44.64,
                                                                                  1.92)
    assert (regblock["achieved_occupancy_pct"], regblock["theoretical_occupancy_pct"]) == (24.22,
                                                                                          25)
    assert (regblock["registers"], regblock["smem_static_bytes"],
            regblock["smem_dynamic_bytes"]) == (128, 8320, 0)
    assert (regblock["grid_size"], regblock["block_size"]) == (256, 256)
    assert (regblock["dram_read_bytes"], regblock["dram_write_bytes"]) == (50_415_872, 2_659_584)
    # 2048^3 FFMA (2 FLOP each) and 2048^2 FADD (+C); no tensor work.
    assert regblock["flop_fp32"] == 2 * 2048**3 + 2048**2
    assert regblock["flop_tensor"] == 0
    assert regblock["flop"] == 2 * 2048**3 + 2048**2
    assert regblock["tflops"] == pytest.approx((2 * 2048**3 + 2048**2) / 574.72e-6 / 1e12)


def test_ncu_tensor_core_flops_count_mma_sync_and_wgmma():
    rows = ncu.parse_raw_csv((FIXTURES / "ncu_raw.csv").read_text())
    for row in rows[1:5]:  # cuda_mma fp16 and bf16, triton_fused fp16, cuBLAS TF32
        assert row["flop_tensor"] == 2 * 2048**3
    triton = rows[3]
    assert triton["duration_us"] == pytest.approx(29.824)
    assert (triton["registers"], triton["smem_dynamic_bytes"]) == (220, 98_304)
    # fp32 FADD of +C, 2048^2 HADD (2 FLOP each, as the half roofline counts them), tensor ops.
    assert triton["flop"] == 2 * 2048**3 + 2048**2 + 2 * 2048**2
    assert triton["tflops"] == pytest.approx(576.46, abs=0.01)
    relu = rows[5]
    assert relu["flop"] == 0 and relu["tflops"] == 0
    assert relu["achieved_occupancy_pct"] == 69.53


def test_flop_formula():
    counters = {ncu._OP.format("ffma"): 10, ncu._OP.format("fadd"): 1,
                ncu._OP.format("fmul"): None, ncu._OP.format("hfma"): 2,
                "sm__ops_path_tensor_src_bf16_dst_fp32.sum": 100}
    assert ncu.flops(counters) == {"flop_fp32": 21, "flop_fp16": 8, "flop_fp64": None,
                                   "flop_tensor": 100, "flop": 129}
    assert ncu.flops({})["flop"] is None


def test_ncu_nested_nvtx_ranges():
    cell = '712  "gemmlab:fc1 backward:none:none:RGB:0xff:REGISTERED:fc1 backward" ' \
           '"other:x:none" "gemmlab:compute dX:none:none:RGB:0xff:REGISTERED:compute dX" '
    assert ncu._nvtx_range({"thread Domain:Push/Pop_Range:PL_Type": cell}) == \
        "fc1 backward > compute dX"
    assert ncu._nvtx_range({"thread Domain:Push/Pop_Range:PL_Type": ""}) is None


def test_ncu_parser_rejects_scaled_units_and_other_text():
    text = (FIXTURES / "ncu_raw.csv").read_text()
    header, units, *rest = text.splitlines()
    column = header.split(",").index('"gpu__time_duration.sum"')
    scaled = units.split(",")
    scaled[column] = '"usecond"'
    with pytest.raises(ValueError, match="--print-units base"):
        ncu.parse_raw_csv("\n".join([header, ",".join(scaled), *rest]))
    with pytest.raises(ValueError, match="not an ncu raw-page CSV"):
        ncu.parse_raw_csv("Time (%),Name\n1,k\n")


def test_nsys_stats_parsed():
    kernels = nsys.parse_stats_csv((FIXTURES / "report_cuda_gpu_kern_sum.csv").read_text())
    assert len(kernels) == 8
    assert kernels[0]["Name"].startswith("void at::native::vectorized_elementwise_kernel<")
    assert (kernels[0]["Total Time (ns)"], kernels[0]["Instances"], kernels[0]["Time (%)"]) == (
        7_364_298, 128, 58.3)
    triton = next(k for k in kernels if k["Name"] == "fused_gemm_kernel")
    assert (triton["Total Time (ns)"], triton["Instances"], triton["Avg (ns)"]) == (
        1_906_969, 65, 29338.0)

    ranges = nsys.parse_stats_csv((FIXTURES / "report_nvtx_sum.csv").read_text())
    assert [(r["Range"], r["Style"], r["Instances"], r["Total Time (ns)"]) for r in ranges] == [
        ("gemmlab:triton_fused", "PushPop", 65, 525_688_863),
        ("gemmlab:cublas", "PushPop", 89, 144_208_066)]

    projected = nsys.parse_stats_csv((FIXTURES / "report_nvtx_gpu_proj_sum.csv").read_text())
    by_range = {r["Range"]: r for r in projected}
    assert by_range["gemmlab:cublas"]["Total Proj Time (ns)"] == 142_748_060
    assert by_range["gemmlab:cublas"]["Total GPU Ops"] == 267
    # The GPU projection of the triton_fused range is exactly its one kernel's time.
    assert by_range["gemmlab:triton_fused"]["Total Proj Time (ns)"] == triton["Total Time (ns)"]


# ---- overlap -------------------------------------------------------------------------------

def test_interval_union_and_intersection():
    assert nsys.union([(5, 8), (0, 2), (1, 3), (8, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert nsys.measure([(0, 10), (5, 15), (20, 21)]) == 16
    assert nsys.intersection([(0, 10), (20, 30)], [(5, 25), (28, 40)]) == [(5, 10), (20, 25),
                                                                           (28, 30)]
    assert nsys.intersection([(0, 10)], []) == []


def test_overlap_of_partly_hidden_communication():
    result = nsys.overlap(comm=[(50, 120), (200, 260), (320, 350)],
                          compute=[(0, 100), (150, 300)])
    assert (result.comm_ns, result.compute_ns, result.overlapped_ns, result.exposed_comm_ns) == (
        160, 250, 110, 50)
    assert result.share == pytest.approx(110 / 160)
    assert nsys.overlap([], [(0, 5)]) == nsys.Overlap(0, 5, 0, 0, None)


SCHEMA = (FIXTURES / "nsys_kernel_schema.sql").read_text()
ALLREDUCE = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
             "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096UL>)")
SENDRECV = ("ncclDevKernel_SendRecv", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096UL>)")
GEMM = ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",) * 2
TRITON = ("fused_gemm_kernel",) * 2


def kernel_db(path: Path, kernels: list[tuple]) -> Path:
    """An SQLite file with nsys's kernel table (the captured schema) holding ``kernels``:
    (start ns, end ns, device, stream, (short name, demangled name))."""
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    ids: dict[str, int] = {}
    for *_, names in kernels:
        for name in names:
            ids.setdefault(name, len(ids))
    db.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)",
                   [(i, name) for name, i in ids.items()])
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
        "demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
        "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, "
        "localMemoryTotal, gridId) VALUES (?, ?, ?, 1, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, "
        "0, 0, ?)",
        [(start, end, device, stream, ids[demangled], ids[short], grid)
         for grid, (start, end, device, stream, (short, demangled)) in enumerate(kernels)])
    db.commit()
    db.close()
    return path


# Rank 0, times in ns: GEMMs on stream 7, NCCL on streams 13 and 14 (a send/receive inside an
# all-reduce's interval counts once); a second GPU with communication alone.
RANK0 = [(1000, 1100, 0, 7, GEMM), (1150, 1300, 0, 7, TRITON),
         (1050, 1120, 0, 13, ALLREDUCE),   # 50 under the GEMM, 20 exposed
         (1200, 1260, 0, 13, ALLREDUCE),   # hidden under the Triton kernel
         (1210, 1240, 0, 14, SENDRECV),    # inside the one above
         (1320, 1350, 0, 13, ALLREDUCE),   # exposed
         (5000, 5400, 1, 21, ALLREDUCE)]
RANK1 = [(2000, 2500, 0, 7, GEMM), (2400, 2600, 0, 9, TRITON)]


NO_COPIES = {"copies": 0, "copy_gb": 0, "copy_ms": 0, "copy_under_compute_ms": 0,
             "copy_share": None}


def test_overlap_from_the_sqlite_export(tmp_path):
    kernels = nsys.read_kernels(kernel_db(tmp_path / "tp.rank0.sqlite", RANK0))
    assert len(kernels) == 7
    assert [k["start"] for k in kernels] == sorted(k[0] for k in RANK0)
    assert kernels[1] == {"start": 1050, "end": 1120, "device": 0, "stream": 13,
                          "name": ALLREDUCE[0], "demangled": ALLREDUCE[1]}
    gpu0, gpu1 = nsys.overlap_by_device(kernels)
    assert gpu0 == {"device": 0, "comm_kernels": 4, "compute_kernels": 2,
                    "comm_ms": 160e-6, "compute_ms": 250e-6, "overlapped_ms": 110e-6,
                    "exposed_comm_ms": 50e-6, "overlap_share": pytest.approx(110 / 160),
                    **NO_COPIES}
    assert gpu1 == {"device": 1, "comm_kernels": 1, "compute_kernels": 0, "comm_ms": 400e-6,
                    "compute_ms": 0, "overlapped_ms": 0, "exposed_comm_ms": 400e-6,
                    "overlap_share": 0, **NO_COPIES}


def test_a_rank_without_communication(tmp_path):
    kernels = nsys.read_kernels(kernel_db(tmp_path / "tp.rank1.sqlite", RANK1))
    assert nsys.overlap_by_device(kernels) == [
        {"device": 0, "comm_kernels": 0, "compute_kernels": 2, "comm_ms": 0,
         "compute_ms": 600e-6, "overlapped_ms": 0, "exposed_comm_ms": 0, "overlap_share": None,
         **NO_COPIES}]


def test_comm_regex_decides_what_is_communication(tmp_path):
    kernels = nsys.read_kernels(kernel_db(tmp_path / "r.sqlite", RANK1))
    (row,) = nsys.overlap_by_device(kernels, comm_regex=r"^fused_gemm")
    assert (row["comm_kernels"], row["comm_ms"], row["overlapped_ms"]) == (1, 200e-6, 100e-6)


def test_a_report_without_kernels(tmp_path):
    path = tmp_path / "empty.sqlite"
    sqlite3.connect(path).close()
    assert nsys.read_kernels(path) == []
    assert nsys.overlap_by_device([]) == []
    assert nsys.read_copies(path) == []


def test_copy_engine_time_beside_compute(tmp_path):
    """Copies (a symm all-gather's): their union, and how much of it ran beside compute
    kernels. The memcpy table holds the columns read, as nsys's SQLite export names them."""
    path = kernel_db(tmp_path / "sp.rank0.sqlite", RANK1)  # compute 2000-2600 on GPU 0
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER "
               "NOT NULL, deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, bytes INTEGER "
               "NOT NULL, copyKind INTEGER NOT NULL)")
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 30, ?, 10)",
                   [(1900, 2100, 0, 1 << 20), (2050, 2150, 0, 1 << 20),  # 2000-2150 beside
                    (2700, 2800, 0, 4096), (3000, 3100, 1, 8192)])
    db.commit()
    db.close()
    copies = nsys.read_copies(path)
    assert copies[0] == {"start": 1900, "end": 2100, "device": 0, "bytes": 1 << 20}
    gpu0, gpu1 = nsys.overlap_by_device(nsys.read_kernels(path), copies=copies)
    assert (gpu0["copies"], gpu0["copy_gb"]) == (3, ((2 << 20) + 4096) / 1e9)
    assert (gpu0["copy_ms"], gpu0["copy_under_compute_ms"]) == (350e-6, 150e-6)
    assert gpu0["copy_share"] == pytest.approx(150 / 350)
    assert (gpu1["compute_kernels"], gpu1["copies"], gpu1["copy_share"]) == (0, 1, 0)


# ---- sessions end to end with stand-in tools -----------------------------------------------

def fake_tool(bin_dir: Path, name: str, body: str) -> None:
    """An executable ``bin_dir/name`` running Python ``body`` (``argv`` = its arguments)."""
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\nimport os, re, shutil, subprocess, sys\n"
                    f"argv = sys.argv[1:]\nFIXTURES = {str(FIXTURES)!r}\n"
                    + textwrap.dedent(body))
    path.chmod(0o755)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """Stand-ins for ncu, nsys and an Open MPI mpiexec, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir, "ncu", """
        if "--import" in argv:
            print(open(os.path.join(FIXTURES, "ncu_raw.csv")).read(), end="")
        else:
            open(argv[argv.index("-o") + 1] + ".ncu-rep", "w").write("report")
    """)
    fake_tool(bin_dir, "nsys", """
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        if argv[0] == "profile":
            out = re.sub(r"%q\\{(\\w+)\\}", lambda m: os.environ[m.group(1)], opts["output"])
            open(out + ".nsys-rep", "w").write("report")
        elif argv[0] == "export":
            rank = re.search(r"rank(\\d+)", opts["output"])
            shutil.copy(os.environ["FAKE_DB_" + (rank.group(1) if rank else "0")], opts["output"])
        elif argv[0] == "stats":
            for a in argv:
                if a.startswith("--report="):
                    name = a.split("=")[1]
                    shutil.copy(os.path.join(FIXTURES, "report_" + name + ".csv"),
                                opts["output"] + "_" + name + ".csv")
    """)
    fake_tool(bin_dir, "mpiexec", """
        if argv == ["--version"]:
            print("mpiexec (OpenRTE) 4.1.6")
            sys.exit(0)
        n = int(argv[argv.index("-n") + 1])
        for rank in range(n):
            subprocess.run(argv[2:], env=dict(os.environ, OMPI_COMM_WORLD_RANK=str(rank)),
                           check=True)
    """)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("GEMMLAB_GIT_COMMIT", "test")
    return tmp_path


def test_ncu_session_end_to_end(tools):
    out = tools / "ncu"
    status, text = gemmlab_profile("ncu", "--range", "cuda_regblock", "--out", str(out), "--",
                                   "gemmlab", "bench")
    assert status == 0, text
    assert "gemm_regblock" in text and "29.90" in text
    data = json.loads((out / "results.json").read_text())
    assert [r["kernel"][:13] for r in data["rows"]][:2] == ["gemm_regblock", "gemm_mma"]
    assert data["ncu_command"][-5:] == ["-o", str(out / "report"), "-f", "gemmlab", "bench"]
    assert "gemmlab@cuda_regblock/" in data["ncu_command"]
    assert (out / "raw.csv").read_text() == (FIXTURES / "ncu_raw.csv").read_text()
    assert (out / "results.csv").exists() and (out / "results.png").exists()


def test_nsys_session_under_mpiexec_end_to_end(tools, monkeypatch):
    monkeypatch.setenv("FAKE_DB_0", str(kernel_db(tools / "db0.sqlite", RANK0)))
    monkeypatch.setenv("FAKE_DB_1", str(kernel_db(tools / "db1.sqlite", RANK1)))
    out = tools / "nsys"
    status, text = gemmlab_profile("nsys", "--out", str(out), "--name", "tp", "--",
                                   "mpiexec", "-n", "2", "gemmlab", "tp")
    assert status == 0, text
    assert sorted(p.name for p in out.glob("*.nsys-rep")) == ["tp.rank0.nsys-rep",
                                                             "tp.rank1.nsys-rep"]
    data = json.loads((out / "results.json").read_text())
    assert [(r["rank"], r["device"], r["overlap_share"]) for r in data["rows"]] == [
        (0, 0, pytest.approx(110 / 160)), (0, 1, 0), (1, 0, None)]
    assert data["rows"][0]["exposed_comm_ms"] == pytest.approx(50e-6)
    assert data["stats"]["tp.rank1.nsys-rep"]["nvtx_sum"][1]["Range"] == "gemmlab:cublas"
    assert "69%" in text  # rank 0's share of communication under compute


@pytest.mark.parametrize("tool", ["ncu", "nsys"])
def test_missing_tool_is_one_clear_line(tool, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    status, text = gemmlab_profile(tool, "--out", str(tmp_path / "o"), "--", "gemmlab", "bench")
    assert status == 2
    assert len(text.strip().splitlines()) == 1
    assert text.startswith(f"error: {tool} not found on PATH")
    assert not (tmp_path / "o").exists()


def test_empty_command_is_an_error(tools):
    status, text = gemmlab_profile("nsys", "--out", str(tools / "o"))
    assert status == 2 and "no command to profile" in text
