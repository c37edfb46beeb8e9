"""The communication layer on CPU ranks: every program runs under ``mpiexec`` in a
subprocess with a timeout, so a hang fails the test instead of blocking the suite."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

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


def mpirun(n: int, *args: str, timeout: int = 180, env: dict | None = None
           ) -> subprocess.CompletedProcess:
    """``mpiexec -n n python args...`` from the repository root, killed after ``timeout``
    (with ``env`` added to the environment)."""
    version = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    extra = ["--oversubscribe"] if "Open MPI" in version or "OpenRTE" in version else []
    return subprocess.run([MPIEXEC, *extra, "-n", str(n), sys.executable, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


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
    # The call check stops every rank before data moves, naming each rank's call.
    assert ("the ranks disagree on the call (rank 0: all_reduce float32 (1000,); "
            "rank 1: all_reduce float32 (1100,))") in result.stderr, result.stderr


@needs_mpi
@pytest.mark.parametrize("backend,code", [("ring", 3), ("mpi", 0)])
def test_a_rank_that_exits_early_aborts_the_job_within_10_s(backend, code):
    """sys.exit (any code) on one rank while the others wait in a collective: its exit
    handshake times out after 10 s (the default) and aborts the job."""
    start = time.monotonic()
    result = mpirun(3, str(PROGRAMS / "fail.py"), "--mode", "exit", "--code", str(code),
                    "--backend", backend, timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "not every rank has reached the end within 10 s" in result.stderr, result.stderr
    assert "finished" not in result.stdout
    assert elapsed < 25  # 10 s of handshake, the rest is starting and stopping the ranks


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_failed_async_op_aborts_the_job_though_never_waited(backend):
    start = time.monotonic()
    result = mpirun(2, str(PROGRAMS / "fail.py"), "--mode", "async", "--backend", backend,
                    timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 30  # the program would sleep 60 s
    # The ring's receive reports the size (through tp.mpi.abort); MPI aborts by itself on
    # a truncated message.
    assert re.search(r"different sizes|truncat", result.stderr, re.IGNORECASE), result.stderr


@needs_mpi
def test_ranks_that_end_seconds_apart_end_normally():
    result = mpirun(3, str(PROGRAMS / "fail.py"), "--mode", "late", "--backend", "ring",
                    timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"rank (\d) finished", result.stdout)) == ["0", "1", "2"]


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_receive_that_does_not_match_its_send_aborts_the_job(backend):
    result = mpirun(2, str(PROGRAMS / "fail.py"), "--mode", "p2p", "--backend", backend,
                    timeout=60)
    assert result.returncode != 0
    assert ("rank 1 receives 1000 int32 elements from rank 0, which sends 1000 float32"
            in result.stderr), result.stderr
    assert "finished" not in result.stdout


@needs_mpi
def test_a_wrong_result_is_counted_not_timed():
    result = mpirun(3, str(PROGRAMS / "broken_ring.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    wrong = int(re.search(r"wrong=(\d+)", result.stdout).group(1))
    assert wrong > 0


@needs_mpi
def test_gemmlab_comm_on_cpu_end_to_end(tmp_path):
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cpu", "-b", "1K", "-e", "64K",
                    "-f", "4", "-n", "4", "-w", "1", "-c", "2", "--call-check", "on,off", "--op",
                    "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast",
                    "--backend", "mpi,ring", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "size (B)" in result.stdout and "#wrong" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    for row in rows:
        assert row["ok"] and row["wrong"] == 0 and row["ranks"] == 2 and row["check_every"] == 2
        assert row["time_us"] > 0 and row["algbw"] > 0 and row["busbw"] > 0
    assert {(r["op"], r["backend"], r["call_check"]) for r in rows} == {
        (op, b, check) for op in cb.COLLECTIVES for b in ("mpi", "ring/mpi")
        for check in (True, False)}
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


class _FakeWorld:
    """One rank of ``size`` with mpi4py's lowercase calls: nothing to agree with."""

    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank

    def allreduce(self, value):
        return value


class _FakeComm:
    """all_reduce that writes what ``result(call_index)`` returns."""

    name = "fake"

    def __init__(self, result):
        self.result, self.calls = result, 0

    def all_reduce(self, x, out):
        out.copy_(self.result(self.calls))
        self.calls += 1


def _true_all_reduce(p: int, nbytes: int, count: int):
    """The sum of the P ranks' inputs, regenerated from their seeds."""
    return sum(cb.random_input(q, "all_reduce", nbytes, count, torch.device("cpu"))
               for q in range(p))


def test_comm_rows_report_the_measured_time_as_bandwidths(monkeypatch):
    """4 KiB of fp32 on rank 1 of 4, every timed stretch 5 µs per call: algbw 4096 B / 5 µs =
    0.8192 GB/s, busbw 0.8192 * 2 * 3 / 4 = 1.2288 GB/s (nccl-tests' all_reduce factor)."""
    monkeypatch.setattr(cb, "seconds_per_call", lambda fn, n, device, world: 5e-6)
    truth = _true_all_reduce(4, 4096, 1024).float()
    row = cb.measure(_FakeComm(lambda i: truth), "all_reduce", 4096, torch.float32,
                     torch.device("cpu"), _FakeWorld(4, 1), iters=6, warmup=1)
    assert row["ok"] and row["wrong"] == 0
    assert row["time_us"] == pytest.approx(5.0)
    assert row["algbw"] == pytest.approx(0.8192)
    assert row["busbw"] == pytest.approx(1.2288)


def test_a_wrong_comm_row_is_fail_and_never_timed(monkeypatch):
    def never(*args):
        raise AssertionError("a FAIL row was timed")

    monkeypatch.setattr(cb, "seconds_per_call", never)
    row = cb.measure(_FakeComm(lambda i: torch.zeros(256)), "all_reduce", 1024, torch.float32,
                     torch.device("cpu"), _FakeWorld(2, 0), iters=5, warmup=1)
    truth = _true_all_reduce(2, 1024, 256)
    assert not row["ok"] and row["wrong"] == int((truth != 0).sum()) > 0
    assert row["time_us"] is None and row["algbw"] is None and row["busbw"] is None


@pytest.mark.parametrize("check_every,caught", [(0, False), (3, True)])
def test_check_every_n_iterations_catches_a_result_that_goes_wrong_later(
        monkeypatch, check_every, caught):
    """Right for the first call and the warm-up, wrong from the 5th call on: only checks
    during the timed iterations (-c N) see it."""
    def run_and_time(fn, n, device, world):
        for _ in range(n):
            fn()
        return 1e-6

    monkeypatch.setattr(cb, "seconds_per_call", run_and_time)
    truth = _true_all_reduce(2, 1024, 256).float()
    row = cb.measure(_FakeComm(lambda i: truth if i < 4 else truth + 1), "all_reduce", 1024,
                     torch.float32, torch.device("cpu"), _FakeWorld(2, 0), iters=9, warmup=1,
                     check_every=check_every)
    assert row["ok"] is not caught
    assert (row["time_us"] is None) is caught


def test_comm_inputs_are_fresh_per_rank_and_size_and_reproducible():
    cpu = torch.device("cpu")
    a = cb.random_input(0, "all_reduce", 1024, 256, cpu)
    assert torch.equal(a, cb.random_input(0, "all_reduce", 1024, 256, cpu))
    assert a.min() >= -2 and a.max() <= 2 and len(set(a.tolist())) == 5
    for other in (cb.random_input(1, "all_reduce", 1024, 256, cpu),
                  cb.random_input(0, "all_reduce", 2048, 512, cpu)[:256],
                  cb.random_input(0, "all_gather", 1024, 256, cpu)):
        assert (other != a).float().mean() > 0.5  # unrelated draws agree on ~1/5
