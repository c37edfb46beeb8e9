"""The ``gemmlab`` command as a user meets it: results kept on Ctrl-C, ``--out`` checked before
any work, one ``error:`` line for a mistake (under mpiexec too), an empty selection explained,
one vocabulary, one colour per backend, torch threads set per rank, no output at import, and
progress lines without a terminal. Subprocesses run on the CPU."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_comm import MPIEXEC, mpirun, needs_mpi, open_mpi

import backends
from bench import style
from bench.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
# What a machine without a GPU prints and refuses (a GPU runs tf32 and the CUDA C kernels).
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
# Small enough for seconds per row, several rows so that a signal lands mid-sweep.
SWEEP = ("bench", "--backend", "cublas,torch_unfused", "--dtype", "fp32",
         "--shape", "64,65,66,67,68,69,70,71,72,73,74,75", "--warmup-ms", "1", "--rep-ms",
         "1", "--min-reps", "1")


def gemmlab(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=timeout)


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def _wait_for_rows(proc: subprocess.Popen, lines: Path, rows: int, seconds: float) -> None:
    """Until ``lines`` (a run's results.jsonl) holds ``rows`` rows; ``proc`` must still run."""
    deadline = time.monotonic() + seconds
    while not (lines.exists() and lines.read_text().count("\n") >= rows):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"not {rows} rows in {seconds:g} s"
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_bench_keeps_the_rows_that_finished(tmp_path, signum):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", *SWEEP, "--rep-ms", "200",
                             "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = out / "results.jsonl"
    _wait_for_rows(proc, lines, 2, seconds=300)
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "interrupted: what finished is in" in output
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["interrupted"] is True
    assert result["meta"]["timing"]["warmup_ms"] == 1.0  # the knobs, interrupted or not
    kept = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(result["rows"]) == len(kept) >= 2
    assert result["rows"] == kept
    assert all(r["ok"] for r in kept) and len(kept) < 24  # stopped before the end
    assert (out / "results.csv").read_text().count("\n") == len(kept) + 1


def test_a_finished_bench_writes_every_file_and_a_progress_line_per_row(tmp_path):
    result = gemmlab(*SWEEP[:5], "--shape", "64,65", *SWEEP[7:], "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split("]")[0] for line in result.stdout.splitlines()
            if line.startswith("[")] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    files = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert files == ["results.csv", "results.json", "results.jsonl", "results.png"]
    meta = json.loads((tmp_path / "r" / "results.json").read_text())["meta"]
    assert "interrupted" not in meta and meta["torch_threads"] == os.cpu_count()
    assert meta["timing"] == {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1, "rounds": 1,
                              "timing": "graph"}  # the knobs the times were taken with


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_text("x"), "exists and is not a directory"),
    (lambda p: (p.mkdir(), (p / "old.txt").write_text("x")), "is not empty; pass --overwrite"),
])
def test_a_bad_out_fails_before_any_work(tmp_path, make, message):
    out = tmp_path / "out"
    make(out)
    start = time.monotonic()
    result = gemmlab(*SWEEP, "--out", str(out))
    assert result.returncode == 2
    assert _errors(result.stdout) == [_errors(result.stdout)[0]]
    assert message in result.stdout and "Traceback" not in result.stdout + result.stderr
    assert "rows passed" not in result.stdout and time.monotonic() - start < 60


def test_overwrite_replaces_the_results_only(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "results.png").write_text("stale")
    result = gemmlab(*SWEEP[:5], "--shape", "64", *SWEEP[7:], "--out", str(out), "--overwrite")
    assert result.returncode == 0, result.stdout
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "results.png").read_bytes().startswith(b"\x89PNG")


def test_a_file_where_a_parent_directory_should_be_is_refused(tmp_path):
    """What a user can hit as root too (where the test below, of permissions, is skipped)."""
    (tmp_path / "f").write_text("not a directory")
    result = gemmlab(*SWEEP, "--out", str(tmp_path / "f" / "sub" / "run"))
    assert result.returncode == 2 and "cannot be created" in result.stdout, result.stdout


def test_an_unwritable_parent_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = gemmlab(*SWEEP, "--out", str(locked / "sub" / "run"))
    assert result.returncode == 2 and "cannot be created" in result.stdout


@cpu_only
@pytest.mark.parametrize("argv,reasons", [
    (("--dtype", "tf32"), ["cublas tf32:", "triton_fused tf32:"]),
    (("--backend", "triton_fused", "--dtype", "bf16"), ["triton_fused bf16:"]),
    (("--backend", "cuda_naive",), ["cuda_naive:"]),
])
def test_an_empty_selection_is_an_error_with_the_reasons(argv, reasons):
    result = gemmlab("bench", "--shape", "64", *argv)
    assert result.returncode == 2, result.stdout
    (error,) = _errors(result.stdout)
    assert error.startswith("error: nothing to run here; ")
    for reason in reasons:
        assert reason in error


@cpu_only
def test_an_empty_tune_selection_is_an_error_with_the_reasons(tmp_path):
    result = gemmlab("tune", "--backend", "triton_fused", "--dtype", "bf16", "--shape", "32",
                     "--out", str(tmp_path / "table.json"))
    assert result.returncode == 2, result.stdout
    (error,) = _errors(result.stdout)
    assert error.startswith("error: nothing to run here; triton_fused bf16: ")
    assert not (tmp_path / "table.json").exists()


@pytest.mark.parametrize("tool", ["ncu", "nsys"])
def test_profile_checks_its_out_before_the_session(tmp_path, tool):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.txt").write_text("x")
    result = gemmlab("profile", tool, "--out", str(tmp_path / "old"), "--", "true")
    assert result.returncode == 2
    assert _errors(result.stdout) == [f"error: --out {tmp_path / 'old'} is not empty; pass "
                                      f"--overwrite to replace its results"]


@needs_mpi
@pytest.mark.parametrize("argv,message", [
    (("tp", "--dtype", "bf16", "--comm", "mpi"), "the mpi communicator cannot sum bf16"),
    (("tp", "--hidden", "3", "--ffn-ratio", "3"), "must be a whole multiple of the TP size 2"),
    (("tp", "--backend", "cuda_naive"), "backend cuda_naive "),  # no GPU, or not on a CPU
    (("train", "--tp", "3"), "--tp 3 does not divide the 2 ranks"),
    (("train", "--tp", "1", "--dp", "3"), "--tp 1 x --dp 3 must equal the 2 ranks"),
    (("train", "--heads", "3"), "--heads 3 must divide --hidden 128"),
    (("train", "--lr", "-1"), "--lr must be a finite number > 0; got -1.0"),
    (("tp", "--ffn-ratio", "nan"), "--ffn-ratio a finite number > 0"),
    (("scale", "strong", "--hidden", "33"), "is not a multiple"),
    (("scale", "strong", "--workload", ","), "--workload ',' lists no workload"),
    (("comm", "--dtype", "float32"), "unknown"),
])
def test_user_mistakes_under_mpiexec_are_one_error_line(argv, message, tmp_path):
    result = mpirun(2, "-m", "bench.cli", *argv, "--device", "cpu", timeout=240)
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    errors = _errors(result.stdout)
    assert len(errors) == 1 and message in errors[0], text
    # mpiexec's own notice of a non-zero exit may follow; no rank called MPI_Abort
    assert "Traceback" not in text and "MPI_Abort" not in text and "MPI_ABORT" not in text


def _rank_pids(marker: str) -> list[int]:
    """The Python processes whose command line holds ``marker`` (the ranks, not mpiexec)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and marker.encode() in argv and b"bench.cli" in argv and \
                Path(argv[0].decode()).name.startswith("python"):
            pids.append(int(entry.name))
    return sorted(pids)


@needs_mpi
@pytest.mark.parametrize("target", ["one rank", "mpiexec"])
@pytest.mark.parametrize("device,comm", [
    ("cpu", "mpi"),
    # two ranks share the first GPU through CUDA IPC; NCCL would need a GPU per rank
    pytest.param("cuda", "symm", marks=pytest.mark.gpu),
])
def test_ctrl_c_under_mpiexec_stops_every_rank_at_one_row(tmp_path, target, device, comm):
    """SIGINT to one rank (or to mpiexec, which passes it on): every rank stops at the same
    row, rank 0 writes the results marked interrupted, status 130; no rank is left in a
    collective its peers have left (the exit guard's abort). Open MPI's mpiexec passes a
    SIGINT on as SIGTERM and exits with 1 itself (seen with 4.1.6)."""
    out = tmp_path / "run"
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    proc = subprocess.Popen(
        [MPIEXEC, "-n", "2", sys.executable, "-m", "bench.cli", "train", "--device", device,
         "--comm", comm, "--tp", "2", "--steps", "100000", "--hidden", "32", "--seq", "16",
         "--batch", "2", "--layers", "1", "--out", str(out)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": first})
    lines = out / "results.jsonl"
    _wait_for_rows(proc, lines, 3, seconds=180)
    ranks = _rank_pids(str(out))
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1] if target == "one rank" else proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    launcher_status = target == "mpiexec" and open_mpi()
    assert proc.returncode == (1 if launcher_status else 130), output
    assert "MPI_Abort" not in output and "not every rank has reached the end" not in output
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["interrupted"] is True
    kept = [json.loads(line) for line in lines.read_text().splitlines()]
    assert result["rows"] == kept and len(kept) >= 3


@needs_mpi
@pytest.mark.parametrize("device,comm,iters", [
    ("cpu", "mpi", "200"),
    # two ranks share the first GPU; more iterations keep its sizes from ending first
    pytest.param("cuda", "symm", "2000", marks=pytest.mark.gpu),
])
def test_ctrl_c_stops_a_comm_sweep_within_its_block_of_sizes(tmp_path, device, comm, iters):
    """``gemmlab comm`` records each size as it finishes, so a Ctrl-C stops every rank at the
    next size, not at the end of the (op, communicator) block, and prints what finished."""
    out = tmp_path / "run"
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    proc = subprocess.Popen(
        [MPIEXEC, "-n", "2", sys.executable, "-m", "bench.cli", "comm", "--device", device,
         "--comm", comm, "-b", "1K", "-e", "64M", "-n", iters, "-w", "1", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": first})
    lines = out / "results.jsonl"
    _wait_for_rows(proc, lines, 1, seconds=180)
    ranks = _rank_pids(str(out))
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1], signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    kept = [json.loads(line) for line in lines.read_text().splitlines()]
    assert 1 <= len(kept) < 17, output  # 1K to 64M is 17 sizes
    assert json.loads((out / "results.json").read_text())["rows"] == kept
    assert f"all_reduce | {comm} | eager | 2 ranks" in output and "1024" in output


@needs_mpi
def test_ranks_started_with_different_arguments_are_one_error_line():
    """An MPMD start where the ranks' arguments differ would run different collectives and
    hang: refused before any work, on every rank."""
    common = ["-m", "bench.cli", "tp", "--device", "cpu", "--tokens", "64", "--hidden", "32",
              "--warmup-iters", "0"]
    result = subprocess.run(
        [MPIEXEC, "-n", "1", sys.executable, *common, "--iters", "1", ":", "-n", "1",
         sys.executable, *common, "--iters", "3"], capture_output=True, text=True, cwd=REPO,
        timeout=120)
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    errors = _errors(result.stdout)
    assert len(errors) == 1 and "the ranks were started with different arguments" in errors[0]
    assert "--iters 1; rank 1:" in errors[0] and errors[0].endswith("--iters 3)"), text


@needs_mpi
def test_a_bad_out_under_mpiexec_is_refused_on_every_rank(tmp_path):
    (tmp_path / "file").write_text("x")
    result = mpirun(2, "-m", "bench.cli", "comm", "--device", "cpu", "-e", "1K",
                    "--out", str(tmp_path / "file"), timeout=240)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(_errors(result.stdout)) == 1 and "Traceback" not in result.stderr


@cpu_only  # the policy is for CPU machines (and Triton 3.6's interpreter fails on numpy 2)
@needs_mpi
def test_triton_fused_runs_in_tp_without_setting_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a user's shell
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "bench.cli", "tp",
                             "--device", "cpu", "--backend", "triton_fused", "--tokens", "32",
                             "--hidden", "16", "--iters", "1", "--warmup-iters", "0"],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed the check" in result.stdout


@needs_mpi
def test_torch_threads_are_the_same_with_and_without_mpiexec(tmp_path):
    flags = ("train", "--device", "cpu", "--steps", "2", "--hidden", "32", "--seq", "16",
             "--batch", "2", "--layers", "1")
    alone = gemmlab(*flags, "--out", str(tmp_path / "alone"))
    launched = mpirun(1, "-m", "bench.cli", *flags, "--out", str(tmp_path / "mpi"))
    assert alone.returncode == 0 and launched.returncode == 0, alone.stdout + launched.stdout
    meta = [json.loads((tmp_path / d / "results.json").read_text())["meta"]
            for d in ("alone", "mpi")]
    assert meta[0]["torch_threads"] == meta[1]["torch_threads"] == os.cpu_count()
    pinned = gemmlab(*flags, "--threads", "1", "--out", str(tmp_path / "one"))
    assert pinned.returncode == 0
    one = json.loads((tmp_path / "one" / "results.json").read_text())["meta"]
    assert one["torch_threads"] == 1


def _options(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {flag for action in sub._actions for flag in action.option_strings}


def test_one_vocabulary_across_the_commands():
    for command in ("bench", "tune", "tp", "train", "scale"):
        options = _options(command)
        assert "--backend" in options and "--backends" not in options, command
        assert "--dtypes" not in options and "--warmup" not in options, command
    for command in ("bench", "comm", "tp", "train", "scale"):
        assert {"--out", "--overwrite", "--threads"} <= _options(command), command
    comm = _options("comm")
    assert "--comm" in comm and "--backend" not in comm
    assert {"-b", "-e", "-f", "-n", "-w", "--min-bytes", "--max-bytes", "--step-factor",
            "--iters", "--warmup-iters"} <= comm
    for command in ("tp", "scale"):
        assert "--warmup-iters" in _options(command)


def test_each_backend_has_its_own_colour_in_every_chart(tmp_path, monkeypatch):
    colours = [style.backend_color(b.name) for b in backends.LADDER]
    assert len(set(colours)) == len(colours)
    from matplotlib.axes import Axes

    from bench import gemm_bench as gb

    drawn = {}
    real_bar = Axes.bar

    def bar(self, x, height, *args, label=None, color=None, **kwargs):
        drawn[label] = color
        return real_bar(self, x, height, *args, label=label, color=color, **kwargs)

    monkeypatch.setattr(Axes, "bar", bar)
    rows = [{"backend": b.name, "dtype": "fp32", "epilogue": "relu_c", "M": 8, "N": 8,
             "K": 8, "tflops": 1.0 + i} for i, b in enumerate(backends.LADDER)]
    gb.plot(rows, tmp_path / "p.png")
    assert drawn == {b.name: style.backend_color(b.name) for b in backends.LADDER}


@pytest.mark.parametrize("tflops,text", [(622.8, "623 TFLOP/s"), (1.2, "1.20 TFLOP/s"),
                                         (0.99, "990 GFLOP/s"), (0.00771, "7.71 GFLOP/s"),
                                         (7.712e-06, "0.00771 GFLOP/s"), (None, "-")])
def test_flops_print_with_three_significant_digits(tflops, text):
    assert style.flops(tflops) == text


@cpu_only
def test_cpu_tables_name_no_gpu_and_no_cublas():
    result = gemmlab(*SWEEP[:5], "--shape", "64", *SWEEP[7:])
    assert result.returncode == 0
    table = result.stdout.split("gemmlab bench", 1)[1]
    assert "cuBLAS" not in table and "GPU" not in table and "TFLOP/s" not in table
    assert "% torch BLAS" in table and "GFLOP/s" in table


def test_nothing_is_printed_at_import_or_by_help():
    # torch.utils.benchmark and cpp_extension warn about CUDA_HOME on a CPU machine with a
    # CUDA build of torch: building the parser must not import them.
    code = ("import sys, bench.cli, backends, tp, profiling.nvtx; bench.cli.build_parser(); "
            "print(sorted(m for m in ('torch.utils.benchmark', 'torch.utils.cpp_extension') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0 and result.stdout == "[]\n" and result.stderr == ""
    for argv in (["--help"], ["bench", "--help"], ["comm", "--help"]):
        result = gemmlab(*argv)
        assert result.returncode == 0 and result.stderr == "", result.stderr


def test_nccl_with_two_ranks_on_one_gpu_cannot_run(monkeypatch):
    """NCCL refuses two ranks on one device at start-up: the command says so first, as
    something the machine cannot run (exit status CANNOT_RUN: a series skips that P)."""
    from bench import session

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for comm in (None, "nccl", "symm,ring/nccl"):
        with pytest.raises(session.CannotRun, match="NCCL needs a GPU per rank: 2 ranks "
                                                    "share 1 GPU"):
            session._check_gpu_per_nccl_rank(comm, "cuda", 2)
    session._check_gpu_per_nccl_rank("symm", "cuda", 2)  # no NCCL: fine
    session._check_gpu_per_nccl_rank("nccl", "cuda", 1)
    session._check_gpu_per_nccl_rank(None, "cpu", 2)


class _World:
    """``allgather`` of a world of ranks whose checks gave ``errors`` (rank order)."""

    def __init__(self, errors):
        self.errors = errors

    def allgather(self, mine):
        return [mine if e is ... else e for e in self.errors]


def test_ranks_agree_on_the_first_ranks_error_and_its_kind():
    from bench import session

    def cannot_run():
        raise session.CannotRun("a GPU per rank")

    assert session.agree(_World([...]), lambda: None) is None
    error = session.agree(_World([None, ...]), cannot_run)
    assert type(error) is session.CannotRun and str(error) == "a GPU per rank"
    error = session.agree(_World([(False, "--out is not writable"), ...]), cannot_run)
    assert type(error) is session.UsageError and str(error) == "--out is not writable"
