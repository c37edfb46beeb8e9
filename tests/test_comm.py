"""The communication layer on CPU ranks: every program runs under ``mpiexec`` in a
subprocess with a timeout, so a hang fails the test instead of blocking the suite."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import comm_bench as cb
from tp.comm.ring import chunk_bounds

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "mpi_programs"
MPIEXEC = shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401
    HAS_MPI4PY = True
except ImportError:
    HAS_MPI4PY = False
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not HAS_MPI4PY,
                               reason="needs mpiexec and mpi4py (pip install .[mpi])")


def mpirun(n: int, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """``mpiexec -n n python args...`` from the repository root, killed after ``timeout``."""
    version = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    extra = ["--oversubscribe"] if "Open MPI" in version or "OpenRTE" in version else []
    return subprocess.run([MPIEXEC, *extra, "-n", str(n), sys.executable, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_every_operation_matches_numpy(ranks):
    result = mpirun(ranks, str(PROGRAMS / "collectives.py"), "--backends", "mpi,ring")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"OK mpi on {ranks} ranks (cpu)" in result.stdout
    assert f"OK ring/mpi on {ranks} ranks (cpu)" in result.stdout


@needs_mpi
def test_grid_layouts_on_four_ranks():
    result = mpirun(4, str(PROGRAMS / "grid.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK DP x TP = 2 x 2: [(0, 0), (0, 1), (1, 0), (1, 1)]" in result.stdout
    assert "OK DP x TP = 1 x 4: [(0, 0), (0, 1), (0, 2), (0, 3)]" in result.stdout
    assert "OK tp=3 rejected on all ranks: TP size 3 must be >= 1 and divide the world size 4" \
        in result.stdout


@needs_mpi
def test_bad_calls_raise_before_communicating():
    result = mpirun(2, str(PROGRAMS / "errors.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"OK \d+ errors raised as expected", result.stdout)


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_an_exception_on_one_rank_aborts_the_job(backend):
    result = mpirun(3, str(PROGRAMS / "fail.py"), "--mode", "raise", "--backend", backend,
                    timeout=60)
    assert result.returncode != 0
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in result.stderr
    assert "finished" not in result.stdout


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_ranks_disagreeing_on_the_size_abort_the_job(backend):
    result = mpirun(2, str(PROGRAMS / "fail.py"), "--mode", "mismatch", "--backend", backend,
                    timeout=60)
    assert result.returncode != 0
    # The rank that receives too little reports it (the ring checks every message); the one
    # that receives too much fails inside MPI. Whichever aborts first names the problem.
    assert re.search(r"called the operation with different sizes|truncat", result.stderr,
                     re.IGNORECASE), result.stderr


@needs_mpi
def test_a_wrong_result_is_counted_not_timed():
    result = mpirun(3, str(PROGRAMS / "broken_ring.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    wrong = int(re.search(r"wrong=(\d+)", result.stdout).group(1))
    assert wrong > 0


@needs_mpi
def test_gemmlab_comm_on_cpu_end_to_end(tmp_path):
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cpu", "-b", "1K", "-e", "64K",
                    "-f", "4", "-n", "3", "-w", "1", "--op",
                    "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast",
                    "--backend", "mpi,ring", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "size (B)" in result.stdout and "#wrong" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    for row in rows:
        for key in ("backend", "op", "dtype", "device", "ranks", "bytes", "time_us", "algbw",
                    "busbw", "wrong"):
            assert key in row
        assert row["wrong"] == 0 and row["time_us"] > 0 and row["ranks"] == 2
        factor = 2 * (2 - 1) / 2 if row["op"] == "all_reduce" else (
            1.0 if row["op"] == "broadcast" else (2 - 1) / 2)
        assert row["busbw"] == pytest.approx(row["algbw"] * factor)
        assert row["algbw"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
    assert {(r["op"], r["backend"]) for r in rows} == {
        (op, b) for op in cb.COLLECTIVES for b in ("mpi", "ring/mpi")}
    assert sorted({r["bytes"] for r in rows if r["op"] == "all_reduce"}) == [1024, 4096, 16384,
                                                                             65536]
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"


@needs_mpi
def test_gemmlab_comm_rejects_unknown_names():
    result = mpirun(1, "-m", "bench.cli", "comm", "--device", "cpu", "--op", "all_reduce,scan",
                    "--backend", "gloo")
    assert result.returncode == 2
    assert "unknown scan, gloo" in result.stdout


@pytest.mark.parametrize("n,parts,want", [(10, 3, [0, 4, 7, 10]), (2, 4, [0, 1, 2, 2, 2]),
                                          (0, 2, [0, 0, 0]), (8, 4, [0, 2, 4, 6, 8])])
def test_chunk_bounds_follow_array_split(n, parts, want):
    assert chunk_bounds(n, parts) == want


def test_byte_sizes_parse_like_nccl_tests():
    assert [cb.parse_bytes(t) for t in ("64", "1K", "16M", "1G", "2kb")] == [
        64, 1024, 16 << 20, 1 << 30, 2048]
    assert cb.sizes(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    with pytest.raises(ValueError, match="not a byte count"):
        cb.parse_bytes("1T")
    with pytest.raises(ValueError, match="step factor"):
        cb.sizes(1024, 512, 2)
