"""The communication layer on CPU ranks: every program runs under ``mpiexec`` in a
subprocess with a timeout, so a hang fails the test instead of blocking the suite."""

import functools
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

from backends import dtypes
from bench import comm_bench as cb
from tp.comm.nccl_backend import NCCL_SUM, nccl_code
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


@functools.cache
def open_mpi() -> bool:
    """Whether ``mpiexec`` is Open MPI's (else MPICH's Hydra, the CI's)."""
    version = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    return "Open MPI" in version or "OpenRTE" in version


def mpirun(n: int, *args: str, timeout: int = 180, env: dict | None = None
           ) -> subprocess.CompletedProcess:
    """``mpiexec -n n python args...`` from the repository root, killed after ``timeout``
    (with ``env`` added to the environment). Under Open MPI with ``--quiet``: its own notices
    (a rank that exits non-zero gets a framed one on stderr) would hide whether the program
    wrote anything there."""
    extra = ["--oversubscribe", "--quiet"] if open_mpi() else []
    return subprocess.run([MPIEXEC, *extra, "-n", str(n), sys.executable, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def seconds_since_stamps(stamp: Path) -> float:
    """Seconds from the latest time fail.py wrote to a file ``stamp.<rank>`` (its ``--stamp``:
    just before a rank's failing step) to now: how long the job took to end after the failure,
    without the ranks' start, which a loaded machine stretches (on the GPU machine, under 8
    test workers, a two-rank job of the async test took 31.6-33.4 s in all)."""
    stamps = [float(p.read_text()) for p in stamp.parent.glob(stamp.name + ".*")]
    assert stamps, "no rank reached its failing step"
    return time.time() - max(stamps)


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_every_operation_matches_numpy(ranks):
    result = mpirun(ranks, str(PROGRAMS / "collectives.py"), "--comm", "mpi,ring,symm")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"OK mpi on {ranks} ranks (cpu)" in result.stdout
    assert f"OK ring/mpi on {ranks} ranks (cpu)" in result.stdout
    # symm: its heap, then the same matrix in 520-byte pieces on each all-reduce path, the
    # same bits on every rank, and sizes above the 8 MiB heap and around the one-shot limit.
    assert f"OK symm on {ranks} ranks (cpu)" in result.stdout
    assert re.search(rf"OK symm in 520-byte pieces, one-shot on {ranks} ranks \(cpu\): \d+ "
                     rf"checks, one-shot [1-9]\d* calls, two-shot 0 calls", result.stdout)
    assert re.search(rf"OK symm in 520-byte pieces, two-shot on {ranks} ranks \(cpu\): \d+ "
                     rf"checks, one-shot 0 calls, two-shot [1-9]\d* calls", result.stdout)
    assert f"OK symm same bits on every rank and path on {ranks} ranks (cpu)" in result.stdout
    # two ranks take one-shot at every size (symm.crossover); more take both
    two_shot = "0" if ranks == 2 else r"[1-9]\d*"
    assert re.search(rf"OK symm above its 8388608-byte capacity on {ranks} ranks \(cpu\): "
                     rf"\d+ checks, one-shot [1-9]\d* calls, two-shot {two_shot} calls",
                     result.stdout)


@pytest.mark.gpu
@needs_mpi
def test_symm_on_one_gpu_shared_by_two_ranks():
    """Two processes on one GPU: CUDA IPC between processes of one device, the spin-kernel
    barrier and the one-shot kernel's per-block barriers under the GPU's time slicing, every
    operation and dtype against numpy."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    result = mpirun(2, str(PROGRAMS / "collectives.py"), "--comm", "symm", "--device", "cuda",
                    env={"CUDA_VISIBLE_DEVICES": first}, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK symm on 2 ranks (cuda)" in result.stdout
    assert "OK symm above its 67108864-byte capacity on 2 ranks (cuda)" in result.stdout
    # on each of the 2 ranks, in 3 dtypes: all_reduce in 4 operand layouts x 2 calls,
    # reduce_scatter in 3; all_gather in 2 layouts in all 6 dtypes; checks in all 6 dtypes
    assert ("OK symm one-shot kernels (all_reduce 48, reduce_scatter 18, all_gather 24 calls) "
            "on 2 ranks (cuda): 156 checks") in result.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_symm_gpu_barrier_kernel_compiles_to_volatile_flags_and_system_fences(tmp_path):
    """The GPU heap's barrier, compiled without a GPU: the flag store and the spinning load
    are volatile (the load is repeated, not hoisted out of the loop) and both fences are
    system-wide (the peers are other processes)."""
    from tp.comm.symm_heap import _SIGNAL_AND_WAIT

    source, ptx = tmp_path / "signal.cu", tmp_path / "signal.ptx"
    source.write_text(_SIGNAL_AND_WAIT)
    result = subprocess.run([shutil.which("nvcc"), "-ptx", "-arch=sm_90", "-o", str(ptx),
                             str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = ptx.read_text()
    assert "st.volatile.global.u32" in text and "ld.volatile.global.u32" in text
    assert text.count("membar.sys") == 2


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_symm_reduce_kernels_compile_with_system_fences_around_volatile_flags(tmp_path):
    """The one-shot all-reduce / reduce-scatter kernels, compiled without a GPU with the
    heap's defines: one per dtype and load width, each with two barriers of two system-wide
    fences around a volatile flag store and spin, and the call counter read volatile (not
    cached from an earlier call)."""
    from tp.comm import symm_heap

    ptx = tmp_path / "reduce.ptx"
    result = subprocess.run([shutil.which("nvcc"), "-ptx", "-arch=sm_90", "-std=c++17",
                             *symm_heap._REDUCE_DEFINES, "-o", str(ptx),
                             str(symm_heap._REDUCE_SOURCE)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = ptx.read_text()
    entries = re.findall(r"\.entry (\w+)\(", text)
    assert entries == [f"symm_reduce_{name}_v{width}"
                       for name, width in symm_heap._REDUCE_KERNELS]
    for body in text.split(".entry ")[1:]:
        assert body.count("membar.sys") == 4
        assert body.count("st.volatile") == 2 and body.count("ld.volatile") == 3


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
@pytest.mark.parametrize("backend", ["mpi", "ring", "symm"])
def test_an_exception_on_one_rank_aborts_the_job(backend):
    result = mpirun(3, str(PROGRAMS / "fail.py"), "--mode", "raise", "--backend", backend,
                    timeout=60)
    assert result.returncode != 0
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in result.stderr
    assert "finished" not in result.stdout


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring", "symm"])
def test_ranks_disagreeing_on_the_size_abort_the_job(backend):
    result = mpirun(2, str(PROGRAMS / "fail.py"), "--mode", "mismatch", "--backend", backend,
                    timeout=60)
    assert result.returncode != 0
    # The call check stops every rank before data moves, naming each rank's call.
    assert ("the ranks disagree on the call (rank 0: all_reduce float32 (1000,); "
            "rank 1: all_reduce float32 (1100,))") in result.stderr, result.stderr


@needs_mpi
@pytest.mark.parametrize("backend,code", [("ring", 3), ("mpi", 0), ("symm", 3)])
def test_a_rank_that_exits_early_aborts_the_job_within_10_s(backend, code, tmp_path):
    """sys.exit (any code) on one rank while the others wait in a collective: its exit
    handshake times out after 10 s (the default) and aborts the job."""
    result = mpirun(3, str(PROGRAMS / "fail.py"), "--mode", "exit", "--code", str(code),
                    "--backend", backend, "--stamp", str(tmp_path / "exit"))
    assert result.returncode != 0
    assert "not every rank has reached the end within 10 s" in result.stderr, result.stderr
    assert "finished" not in result.stdout
    assert seconds_since_stamps(tmp_path / "exit") < 20  # 10 s of handshake, then the abort


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_failed_async_op_aborts_the_job_though_never_waited(backend, tmp_path):
    result = mpirun(2, str(PROGRAMS / "fail.py"), "--mode", "async", "--backend", backend,
                    "--stamp", str(tmp_path / "async"))
    assert result.returncode != 0
    assert seconds_since_stamps(tmp_path / "async") < 30  # the program would sleep 60 s
    # The ring's receive reports the size (through tp.mpi.abort); MPI aborts by itself on
    # a truncated message.
    assert re.search(r"different sizes|truncat", result.stderr, re.IGNORECASE), result.stderr


class _FakeNcclComm:
    """Counts ``destroy`` calls, as cupy's NcclCommunicator would run ncclCommDestroy."""

    def __init__(self):
        self.destroyed = 0

    def destroy(self):
        self.destroyed += 1


# Tests of communication between GPUs: run where two are visible (the GPU suite on a 2-GPU
# machine), skipped elsewhere.
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


@pytest.mark.gpu
@needs_mpi
@needs_two_gpus
def test_every_collective_between_two_gpus():
    """symm (IPC between devices, its kernels, the copy-engine all-gather, pieces above the
    64 MiB heap), nccl and ring/nccl: every operation and dtype against numpy."""
    result = mpirun(2, str(PROGRAMS / "collectives.py"), "--comm", "symm,nccl,ring",
                    "--device", "cuda", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("OK symm on 2 ranks (cuda)", "OK symm above its 67108864-byte capacity on 2 "
                 "ranks (cuda)", "OK nccl on 2 ranks (cuda)", "OK ring/nccl on 2 ranks (cuda)"):
        assert line in result.stdout


@pytest.mark.gpu
@needs_mpi
@needs_two_gpus
def test_gemmlab_comm_between_two_gpus_ends_normally(tmp_path):
    """Every GPU communicator, eager and as CUDA-graph replays, each row checked; the ranks
    end together (an NCCL communicator left to garbage collection held one back)."""
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cuda", "--dtype", "bf16",
                    "--comm", "nccl_direct,nccl,ring,symm", "--op",
                    "all_reduce,all_gather,reduce_scatter", "-b", "8K", "-e", "2M", "-f", "16",
                    "-n", "4", "-w", "1", "--timing", "eager,graph", "--out", str(tmp_path),
                    timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == 4 * 3 * 2 * 3
    assert all(r["ok"] and r["wrong"] == 0 and r["time_us"] > 0 for r in rows)


def test_nccl_communicators_destroy_their_nccl_comm_once_on_close():
    """ncclCommDestroy is collective: left to garbage collection it runs whenever each
    process frees the object, and one rank waited there while the other had reached its exit
    (gemmlab comm on 2 GPUs). close(), which every rank calls in the same order, runs it."""
    from tp.comm.base import Communicator
    from tp.comm.nccl_backend import NcclCommunicator
    from tp.comm.ring import RingCommunicator
    from tp.comm.transport import NcclTransport

    nccl = object.__new__(NcclCommunicator)  # __init__ would need a GPU and peers
    Communicator.__init__(nccl, 0, 2)
    nccl.comm = first = _FakeNcclComm()
    ring = RingCommunicator(NcclTransport(second := _FakeNcclComm(), 0, 2))
    for communicator in (nccl, ring):
        communicator.close()
        communicator.close()
    assert first.destroyed == second.destroyed == 1
    assert nccl.comm is None and ring.transport.comm is None


@needs_mpi
def test_the_ranks_wait_for_rank_0_to_write_its_results(tmp_path):
    """A chart that takes rank 0 longer than the exit timeout does not abort the job."""
    result = mpirun(2, str(PROGRAMS / "slow_writer.py"), str(tmp_path / "out"),
                    env={"GEMMLAB_EXIT_TIMEOUT": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0 finished, 3 files written" in result.stdout
    assert "rank 1 finished, 0 files written" in result.stdout
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"] == [{"rank": 0}]


@needs_mpi
def test_ranks_that_end_seconds_apart_end_normally():
    result = mpirun(3, str(PROGRAMS / "fail.py"), "--mode", "late", "--backend", "ring",
                    timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"rank (\d) finished", result.stdout)) == ["0", "1", "2"]


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", "ring", "symm"])
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
                    "--comm", "mpi,ring", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "size (B)" in result.stdout and "#wrong" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    for row in rows:
        assert row["ok"] and row["wrong"] == 0 and row["ranks"] == 2 and row["check_every"] == 2
        assert row["dtype"] == "fp32"
        assert row["time_us"] > 0 and row["algbw"] > 0 and row["busbw"] > 0
    assert {(r["op"], r["backend"], r["call_check"]) for r in rows} == {
        (op, b, check) for op in cb.COLLECTIVES for b in ("mpi", "ring/mpi")
        for check in (True, False)}
    assert sorted({r["bytes"] for r in rows if r["op"] == "all_reduce"}) == [1024, 4096, 16384,
                                                                             65536]
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"


@needs_mpi
def test_gemmlab_comm_sweeps_symm_on_cpu(tmp_path):
    """2 ranks, every collective at 1 KiB, 96 KiB and 9 MiB (above the 8 MiB heap: in
    pieces), each call checked."""
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cpu", "-b", "1K", "-e", "9M",
                    "-f", "96", "-n", "2", "-w", "1", "-c", "1", "--op",
                    "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast",
                    "--comm", "symm", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all_reduce | symm | eager | 2 ranks | fp32 | cpu" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["op"], r["backend"], r["bytes"]) for r in rows} == {
        (op, "symm", size) for op in cb.COLLECTIVES for size in (1024, 96 << 10, 9 << 20)}
    for row in rows:
        assert row["ok"] and row["wrong"] == 0 and row["ranks"] == 2 and row["time_us"] > 0


@needs_mpi
def test_gemmlab_comm_sweeps_both_symm_all_reduce_algorithms_at_every_size(tmp_path):
    """The crossover's measurement: symm/one-shot and symm/two-shot on both sides of the
    default 256 KiB limit and above the heap, every call checked."""
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cpu", "-b", "1K", "-e", "9M",
                    "-f", "96", "-n", "2", "-w", "1", "-c", "1", "--op", "all_reduce",
                    "--comm", "symm/one-shot,symm/two-shot", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["backend"], r["bytes"]) for r in rows} == {
        (name, size) for name in ("symm/one-shot", "symm/two-shot")
        for size in (1024, 96 << 10, 9 << 20)}
    assert all(r["ok"] and r["wrong"] == 0 and r["time_us"] > 0 for r in rows)


@needs_mpi
@pytest.mark.parametrize("name,path", [("symm", "one_shot"), ("symm/one-shot", "one_shot"),
                                       ("symm/two-shot", "two_shot")])
def test_each_symm_name_takes_its_all_reduce_algorithm(name, path):
    """In-process, one rank: which algorithm an all_reduce of 1 KiB and of 1 MiB (above
    ONE_SHOT_MAX_BYTES) runs, by the communicator's name: symm's crossover on one rank is
    that of two, every size one-shot."""
    import tp.comm

    comm = tp.comm.create(name, None, "cpu")
    try:
        assert comm.name == name
        taken = []
        for algorithm in ("one_shot", "two_shot"):
            method = getattr(comm, f"_{algorithm}")
            setattr(comm, f"_{algorithm}", lambda src, dst, a=algorithm, m=method: (
                taken.append(a), m(src, dst)))
        for count in (256, 1 << 18):
            x = torch.arange(count, dtype=torch.float32)
            assert torch.equal(comm.all_reduce(x.clone()), x)  # one rank: the sum is x
        assert taken == [path, path]
    finally:
        comm.close()


def test_symm_crossover_is_one_shot_at_every_size_on_two_ranks_only():
    """At two ranks one-shot reads as many bytes as two-shot and meets one barrier less."""
    from tp.comm.symm import ONE_SHOT_MAX_BYTES, crossover

    assert crossover(2) == crossover(1) > 1 << 60
    assert crossover(3) == crossover(8) == ONE_SHOT_MAX_BYTES


def test_gemmlab_comm_sweeps_symm_by_default():
    from bench.commands.comm import default_comms

    assert default_comms("cpu") == "mpi,ring,symm"
    assert "symm" in default_comms("cuda").split(",")


@needs_mpi
def test_gemmlab_comm_takes_the_long_options_and_the_short_dtype_names(tmp_path):
    """bf16 on 3 ranks: ring sums it, native MPI has no bf16 type and is skipped."""
    result = mpirun(3, "-m", "bench.cli", "comm", "--device", "cpu", "--min-bytes", "1K",
                    "--max-bytes", "8K", "--step-factor", "8", "--iters", "3",
                    "--warmup-iters", "1", "--check-every", "1", "--comm", "mpi,ring",
                    "--dtype", "bf16", "--op", "all_reduce,all_gather", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipped all_reduce on mpi, eager: not supported for bf16" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["op"], r["backend"]) for r in rows} == {
        ("all_reduce", "ring/mpi"), ("all_gather", "mpi"), ("all_gather", "ring/mpi")}
    for row in rows:
        assert row["ok"] and row["dtype"] == "bf16" and row["ranks"] == 3
        assert row["iters"] == 3 and row["check_every"] == 1
    assert sorted({r["bytes"] for r in rows if r["op"] == "all_reduce"}) == [1024, 8192]


@needs_mpi
@pytest.mark.parametrize("argv,message", [
    (("--op", "all_reduce,scan"), "error: unknown op scan; known: all_reduce, all_gather, "
                                  "reduce_scatter, all_to_all, broadcast"),
    (("--comm", "mpi,gloo"), "error: unknown communicator gloo; known: mpi, ring, ring/mpi, "
                             "ring/nccl, nccl, symm, symm/one-shot, symm/two-shot, nccl_direct"),
    (("--dtype", "float32"), "error: unknown dtype float32; known: fp32, fp64, fp16, bf16, "
                             "int32, int64"),
    (("--comm", "nccl"), "error: --comm nccl needs GPUs (--device cuda)"),
    (("--timing", "eager,wall"), "error: unknown --timing wall; known: eager, graph"),
    (("--timing", "graph"), "error: --timing graph captures CUDA graphs: it needs --device "
                            "cuda"),
    (("-e", "1K", "-b", "4K"), "error: need 1 <= min bytes <= max bytes"),
])
def test_gemmlab_comm_rejects_unknown_names(argv, message):
    result = mpirun(1, "-m", "bench.cli", "comm", "--device", "cpu", *argv)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stdout, result.stdout


@needs_mpi
def test_graph_timing_needs_cuda():
    from mpi4py import MPI

    with pytest.raises(ValueError, match="graph on CUDA only"):
        cb.measure(None, "all_reduce", 64, torch.float32, torch.device("cpu"), MPI.COMM_SELF,
                   2, 0, timing="graph")


@pytest.mark.gpu
@needs_mpi
def test_gemmlab_comm_times_captured_calls_on_one_gpu(tmp_path):
    """Two ranks sharing one GPU, symm (nccl refuses two ranks on one GPU): every size eager
    and as CUDA-graph replays, each checked (poisoned, after the first and the last replay)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cuda", "--comm", "symm",
                    "--op", "all_reduce,all_gather,reduce_scatter", "-b", "8K", "-e", "2M",
                    "-f", "16", "-n", "4", "-w", "1", "--timing", "eager,graph", "--dtype",
                    "bf16", "--out", str(tmp_path), env={"CUDA_VISIBLE_DEVICES": first},
                    timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all_gather | symm | graph | 2 ranks | bf16 | cuda" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["op"], r["timing"], r["bytes"]) for r in rows} == {
        (op, timing, size) for op in ("all_reduce", "all_gather", "reduce_scatter")
        for timing in ("eager", "graph") for size in (8 << 10, 128 << 10, 2 << 20)}
    assert all(r["ok"] and r["wrong"] == 0 and r["time_us"] > 0 for r in rows)


def test_gemmlab_comm_options_keep_nccl_tests_letters():
    """``--comm`` is the communicator (``--backend`` is the GEMM backend everywhere else)."""
    from bench.cli import build_parser

    parser = build_parser()
    long = parser.parse_args(["comm", "--min-bytes", "2K", "--max-bytes", "4M",
                              "--step-factor", "4", "--iters", "7", "--warmup-iters", "2",
                              "--check-every", "3", "--comm", "ring", "--dtype", "int64"])
    short = parser.parse_args(["comm", "-b", "2K", "-e", "4M", "-f", "4", "-n", "7", "-w", "2",
                               "-c", "3", "--comm", "ring", "--dtype", "int64"])
    fields = ("min_bytes", "max_bytes", "step_factor", "iters", "warmup_iters", "check_every",
              "comm", "dtype")
    assert [getattr(long, f) for f in fields] == [getattr(short, f) for f in fields] == [
        "2K", "4M", 4, 7, 2, 3, "ring", "int64"]
    assert parser.parse_args(["comm"]).dtype == "fp32"
    for old in ("--backend", "--minbytes", "--maxbytes", "--stepfactor", "--warmup_iters"):
        with pytest.raises(SystemExit):
            parser.parse_args(["comm", old, "1"])


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


def test_comm_rows_name_their_dtype_in_the_shared_vocabulary(monkeypatch):
    monkeypatch.setattr(cb, "seconds_per_call", lambda fn, n, device, world: 1e-6)
    for name in dtypes.COMM:
        dtype = dtypes.DTYPES[name].torch
        truth = _true_all_reduce(2, 1024, 1024 // dtype.itemsize).to(dtype)
        row = cb.measure(_FakeComm(lambda i: truth), "all_reduce", 1024, dtype,
                         torch.device("cpu"), _FakeWorld(2, 0), iters=2, warmup=0)
        assert row["ok"] and row["dtype"] == name and row["count"] == 1024 // dtype.itemsize


def test_the_dtype_vocabulary():
    assert dtypes.GEMM == dtypes.GEMM_GPU == ("fp32", "tf32", "fp16", "bf16")
    assert dtypes.GEMM_CPU == ("fp32", "fp16", "bf16") == dtypes.TP
    assert dtypes.COMM == ("fp32", "fp64", "fp16", "bf16", "int32", "int64")
    assert dtypes.TOLERANCES == {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 1e-2}
    assert [dtypes.name_of(d.torch) for d in dtypes.DTYPES.values() if not d.tf32] == [
        n for n in dtypes.DTYPES if n != "tf32"]
    assert dtypes.name_of(torch.float32, tf32=True) == "tf32"
    assert dtypes.parse("tf32", dtypes.GEMM).torch == torch.float32
    assert dtypes.parse("tf32", dtypes.GEMM).tf32 and not dtypes.parse("fp32").tf32
    with pytest.raises(ValueError, match=r"^unknown dtype tf32; known: fp32, fp16, bf16$"):
        dtypes.parse("tf32", dtypes.TP)
    with pytest.raises(ValueError, match="unknown dtype float32; known: fp32, fp64"):
        dtypes.parse("float32", dtypes.COMM)
    with pytest.raises(ValueError, match="tf32 applies to torch.float32 only"):
        dtypes.name_of(torch.float16, tf32=True)
    with pytest.raises(ValueError, match="no gemmlab name for torch.complex64"):
        dtypes.name_of(torch.complex64)
    with pytest.raises(AttributeError):
        dtypes.DTYPES["fp32"].tolerance = 1.0  # frozen


def test_nccl_and_mpi_codes_are_the_abi_values():
    """ncclDataType_t of nccl.h (ncclInt8 0, ncclUint8 1, ncclInt32 2, ncclInt64 4,
    ncclFloat16 6, ncclFloat32 7, ncclFloat64 8, ncclBfloat16 9), and the MPI datatypes the
    mpi communicator sums with (none for fp16 and bf16)."""
    assert {n: d.nccl for n, d in dtypes.DTYPES.items()} == {
        "fp32": 7, "tf32": None, "fp16": 6, "bf16": 9, "fp64": 8, "int32": 2, "int64": 4,
        "int8": 0, "uint8": 1}
    assert [nccl_code(dtypes.DTYPES[n].torch) for n in dtypes.COMM] == [7, 8, 6, 9, 2, 4]
    assert NCCL_SUM == 0
    with pytest.raises(TypeError, match="nccl has no data type for torch.bool"):
        nccl_code(torch.bool)
    assert {n: d.mpi for n, d in dtypes.DTYPES.items() if d.mpi} == {
        "fp32": "FLOAT", "fp64": "DOUBLE", "int32": "INT32_T", "int64": "INT64_T"}


@needs_mpi
def test_each_communicator_says_what_it_can_sum_without_being_created():
    import tp.comm
    from tp.comm.mpi_backend import MpiCommunicator

    assert tp.comm.reduce_dtypes("mpi") == MpiCommunicator.reduce_dtypes == (
        torch.float32, torch.float64, torch.int32, torch.int64)
    assert tp.comm.reduce_dtypes("ring") is None and tp.comm.reduce_dtypes("ring", "cuda") is None
    assert tp.comm.reduce_dtypes("symm") is None and tp.comm.reduce_dtypes("symm", "cuda") is None
    assert set(tp.comm.reduce_dtypes("nccl", "cuda")) == {
        d.torch for d in dtypes.DTYPES.values() if d.nccl is not None}
    with pytest.raises(ValueError, match="unknown communicator 'gloo'"):
        tp.comm.reduce_dtypes("gloo")


@needs_mpi
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without a GPU")
def test_symm_on_a_gpu_says_why_it_cannot_run_here():
    import tp.comm
    from tp.comm.symm_heap import ipc_unavailable_reason

    assert ipc_unavailable_reason() == "no CUDA GPU visible to torch"
    with pytest.raises(RuntimeError, match="^symm: no CUDA GPU visible to torch$"):
        tp.comm.create("symm", None, "cuda")
