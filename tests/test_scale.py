"""``gemmlab scale`` (run as ``python -m bench.cli scale``) and the scaling series on CPU
ranks, every run under ``mpiexec`` with a timeout: 180 s, a guard against a hang, not a bound
on speed (on the GPU machine under 8 test workers a 60 s one cut runs of a few seconds short)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_comm import MPIEXEC, mpirun, needs_mpi

from bench import scale_series

REPOSITORY = Path(__file__).resolve().parent.parent

# hidden 32, 2 heads (head_dim 16), FFN 4 x 32; 4 sequences of 16 tokens.
TINY = ["--device", "cpu", "--tokens", "64", "--hidden", "32", "--heads", "2", "--seq", "16",
        "--iters", "2", "--warmup-iters", "1"]


def _check_rows(rows, p):
    assert [r["workload"] for r in rows] == ["mlp", "layer"]
    for r in rows:
        assert r["P"] == p and r["ok"] and r["max_rel_err"] <= 1e-5
        # comm_share is a ratio of two timings (the communication replayed alone over the
        # step): on a loaded CPU it can pass 1, so only its definition is checked.
        assert r["step_ms"] > 0 and r["comm_share"] >= 0 and r["tflops_per_gpu"] > 0
        assert r["comm_share"] == pytest.approx(r["comm_ms"] / r["step_ms"])
        assert r["tflops_per_gpu"] == pytest.approx(
            r["flops_per_gpu"] / (r["step_ms"] * 1e-3) / 1e12)
        assert (r["tokens"], r["hidden"], r["dtype"]) == (64, 32, "fp32")
    mlp, layer = rows
    if p == 1:  # one rank: the layers call no collective
        assert mlp["comm_ms"] == layer["comm_ms"] == mlp["collectives"] == 0
    else:
        # MLP: fc2's 4 chunk all-reduces of (64, 32) + fc1's dX all-reduce, fp32.
        assert mlp["collectives"] == 5 and mlp["comm_bytes"] == 2 * 64 * 32 * 4
        # Layer: fc_o's and fc2's chunks + the dX all-reduces of fc_q, fc_k, fc_v and fc1.
        assert layer["collectives"] == 12 and layer["comm_bytes"] == 6 * 64 * 32 * 4
        assert mlp["comm_ms"] > 0 and layer["comm_ms"] > 0


@needs_mpi
def test_weak_scaling_grows_ffn_and_heads_with_p(tmp_path):
    rows = {}
    for p in (1, 2):
        result = mpirun(p, "-m", "bench.cli", "scale", "weak", *TINY, "--out",
                        str(tmp_path / f"P{p}"))
        assert result.returncode == 0, result.stdout + result.stderr
        rows[p] = json.loads((tmp_path / f"P{p}" / "results.json").read_text())["rows"]
        _check_rows(rows[p], p)
        mlp, layer = rows[p]
        assert mlp["ffn"] == layer["ffn"] == 4 * 32 * p
        assert (layer["heads"], layer["head_dim"], layer["seq"]) == (2 * p, 16, 16)
        assert mlp["mode"] == "weak" and "ffn = r*h*P" in mlp["rule"]
    for a, b in zip(rows[1], rows[2]):  # each rank does the P = 1 work
        assert a["flops_per_gpu"] == b["flops_per_gpu"]


def test_strong_series_merges_speedup_and_efficiency(tmp_path, capsys):
    status = scale_series.main(["strong", "--ranks", "1,2", "--out", str(tmp_path),
                                "--timeout", "180", "--", *TINY])
    printed = capsys.readouterr().out
    assert status == 0, printed + "".join(
        (tmp_path / f"P{p}" / "log.txt").read_text() for p in (1, 2))
    assert "TP strong scaling" in printed and "efficiency" in printed
    per_p = {p: json.loads((tmp_path / f"P{p}" / "results.json").read_text())["rows"]
             for p in (1, 2)}
    for p, rows in per_p.items():
        _check_rows(rows, p)
        for r in rows:  # the global problem does not change with P
            assert r["ffn"] == 128 and r["heads"] == (None if r["workload"] == "mlp" else 2)
    merged = json.loads((tmp_path / "results.json").read_text())
    assert [run["status"] for run in merged["runs"]] == ["ok", "ok"]
    assert [(r["workload"], r["P"]) for r in merged["rows"]] == [
        ("mlp", 1), ("layer", 1), ("mlp", 2), ("layer", 2)]
    for r in merged["rows"]:
        t1 = next(x["step_ms"] for x in per_p[1] if x["workload"] == r["workload"])
        tp = next(x["step_ms"] for x in per_p[r["P"]] if x["workload"] == r["workload"])
        assert r["step_ms"] == tp
        assert r["speedup"] == pytest.approx(t1 / tp)
        assert r["efficiency"] == pytest.approx(t1 / tp / r["P"])
    assert (tmp_path / "results.csv").read_text().splitlines()[0].count("speedup") == 1
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_weak_merge_formulas():
    rows = {p: [{"workload": "mlp", "P": p, "step_ms": t}] for p, t in ((1, 2.0), (2, 2.5),
                                                                       (4, 4.0))}
    merged = scale_series.merge("weak", rows)
    assert [r["efficiency"] for r in merged] == pytest.approx([1.0, 0.8, 0.5])
    assert [r["speedup"] for r in merged] == pytest.approx([1.0, 1.6, 2.0])
    assert scale_series.merge("weak", {2: rows[2]})[0]["speedup"] is None  # no P = 1


@needs_mpi
@pytest.mark.parametrize("comm", ["symm", "mpi"])
def test_sequence_parallel_workloads_match_the_dense_ones(tmp_path, comm):
    """With --sequence-parallel each rank holds a block of the tokens: the output and dX
    blocks and every gradient are checked against the TP = 1 reference before timing, and
    the recorded communication is the chunked all-gathers and reduce-scatters."""
    result = mpirun(2, "-m", "bench.cli", "scale", "strong", *TINY, "--comm", comm,
                    "--sequence-parallel", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sequence parallel" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["workload"] for r in rows] == ["mlp", "layer"]
    for r in rows:
        assert r["ok"] and r["max_rel_err"] <= 1e-5 and r["step_ms"] > 0 and r["comm_ms"] > 0
        assert r["sequence_parallel"] and not r["cuda_graph"]
    mlp, layer = rows
    # MLP, 4 chunks of each 32-token block: fc1's all-gathers (8 x 32) and fc2's
    # reduce-scatters (16 x 32) forward, the same backward, and fc2's bias all-reduce.
    assert mlp["collectives"] == 17
    assert mlp["comm_bytes"] == 4 * (2 * 8 * 32 + 2 * 16 * 32) * 4 + 32 * 4
    # Layer: 8 per TP linear (6 of them), the row biases (2) and the LayerNorms' 4 params.
    assert layer["collectives"] == 6 * 8 + 2 + 4


@needs_mpi
def test_sequence_parallel_and_cuda_graph_refuse_what_they_cannot_run():
    odd = mpirun(2, "-m", "bench.cli", "scale", "strong", *TINY, "--tokens", "33", "--seq",
                 "11", "--sequence-parallel")
    assert odd.returncode == 2, odd.stdout + odd.stderr
    assert "sequence parallelism needs --tokens (33) divisible by the TP size 2" in odd.stdout
    graph = mpirun(2, "-m", "bench.cli", "scale", "strong", *TINY, "--cuda-graph")
    assert graph.returncode == 2, graph.stdout + graph.stderr
    assert "--cuda-graph needs --device cuda and a stream-ordered communicator" in graph.stdout


@needs_mpi
def test_a_size_the_tp_degree_does_not_divide_is_an_error():
    result = mpirun(2, "-m", "bench.cli", "scale", "strong", *TINY, "--hidden", "33",
                    "--ffn-ratio", "1", "--workload", "mlp")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "FFN width 33 (--ffn-ratio 1 x --hidden 33) is not a multiple of the TP size 2" \
        in result.stdout


@needs_mpi
def test_series_skips_what_the_machine_cannot_run_and_stops_at_a_failure(tmp_path, capsys):
    # A launcher that runs P = 1, says P = 2 cannot run (as gemmlab scale does with more
    # ranks than GPUs) and fails at P = 4; P = 8 must not be tried.
    script = (f'case "$2" in 2) echo "cannot run: fake"; exit 3;; 4) echo boom; exit 5;; '
              f'*) exec {shlex.quote(MPIEXEC)} "$@";; esac')
    status = scale_series.main(["weak", "--ranks", "1,2,4,8", "--out", str(tmp_path),
                                "--timeout", "180", "--mpiexec", f"sh -c {shlex.quote(script)} sh",
                                "--", *TINY, "--workload", "mlp"])
    printed = capsys.readouterr().out
    assert status == 1
    assert "P=2: skipped: the machine cannot run it: cannot run: fake" in printed
    assert "P=4: failed: exit status 5" in printed and "boom" in printed
    assert "keeping P = [1]" in printed and not (tmp_path / "P8").exists()
    merged = json.loads((tmp_path / "results.json").read_text())
    assert [(run["P"], run["status"]) for run in merged["runs"]] == [
        (1, "ok"), (2, "skipped"), (4, "failed")]
    assert [(r["workload"], r["P"], r["efficiency"]) for r in merged["rows"]] == [
        ("mlp", 1, 1.0)]


def test_series_checks_its_out_before_any_run(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exited:
        scale_series.main(["strong", "--ranks", "1", "--out", str(tmp_path / "file"), "--",
                           *TINY])
    assert exited.value.code == 2
    assert f"--out {tmp_path / 'file'} exists and is not a directory" in capsys.readouterr().err


def test_series_kills_a_run_past_its_timeout(tmp_path, capsys):
    status = scale_series.main(["strong", "--ranks", "2", "--out", str(tmp_path), "--timeout",
                                "1", "--mpiexec", "sh -c 'sleep 30' sh", "--", *TINY])
    printed = capsys.readouterr().out
    assert status == 1 and "P=2: failed: timed out after 1 s" in printed


@needs_mpi
def test_a_series_stopped_by_sigterm_keeps_the_ps_that_finished(tmp_path):
    """SIGTERM while P = 2 runs: its launcher (a process group of its own) is killed, P = 1
    is merged and written as interrupted, exit status 130."""
    marker = tmp_path / "p2.pid"
    script = (f'case "$2" in 2) echo $$ > {shlex.quote(str(marker))}; exec sleep 120;; '
              f'*) exec {shlex.quote(MPIEXEC)} "$@";; esac')
    series = subprocess.Popen(
        [sys.executable, "-m", "bench.scale_series", "strong", "--ranks", "1,2", "--out",
         str(tmp_path / "out"), "--timeout", "180", "--mpiexec", f"sh -c {shlex.quote(script)} sh",
         "--", *TINY, "--workload", "mlp"], cwd=REPOSITORY, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        assert series.poll() is None, series.communicate()[0]
        time.sleep(0.2)
    launcher = int(marker.read_text())
    series.send_signal(signal.SIGTERM)
    printed = series.communicate(timeout=60)[0]
    assert series.returncode == 130, printed
    assert "interrupted: keeping P = [1]" in printed
    with pytest.raises(ProcessLookupError):
        os.kill(launcher, 0)
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    assert merged["meta"]["interrupted"] is True
    assert [(r["workload"], r["P"]) for r in merged["rows"]] == [("mlp", 1)]


def _measure_in_process(dtype_name, **sizes):
    """One layer row at P = 1 in this process (TP group and reference on COMM_SELF)."""
    import torch
    from mpi4py import MPI

    import tp.comm
    from bench import scale

    cpu = torch.device("cpu")
    comm, self_comm = (tp.comm.create(name, MPI.COMM_SELF, cpu) for name in ("ring", "mpi"))
    prob = scale.problem("layer", "strong", 1, sizes["tokens"], sizes["hidden"], 4, 2,
                         sizes["seq"])
    settings = {"backend": "cublas", "overlap": True, "chunks": 4, "sm_margin": 0,
                "sequence_parallel": False}
    return scale.measure(prob, "strong", MPI.COMM_SELF, comm, self_comm, cpu, dtype_name,
                         settings, 1, 0)


@needs_mpi
def test_bf16_is_judged_by_what_tp_adds_to_the_dense_bf16_error():
    """In bf16 the LayerNorms' gradients, sums over 1024 tokens that largely cancel, are off
    the fp32 reference by more than the tolerance with no TP at all: the row passes because
    each tensor's error is within twice the dense bf16 run's (at P = 1 they are the same
    computation, so the ratio is exactly 1/2), and is timed."""
    row = _measure_in_process("bf16", tokens=1024, hidden=32, seq=256)
    assert row["max_rel_err"] > 1e-2  # bf16's tolerance: the old check failed this row
    assert row["max_rel_err"] == row["dense_max_rel_err"]
    assert row["check_ratio"] == 0.5 and row["ok"] and row["step_ms"] > 0


@needs_mpi
def test_a_tp_run_off_the_dense_one_fails_and_is_not_timed(monkeypatch):
    """A TP workload whose fc1 weight is 1% off (the model under test, not the dense runs)
    fails in fp32 and in bf16, where the dense run's own error is large."""
    import torch

    from bench import scale

    build = scale.build

    def off(prob, comm, **kwargs):
        module = build(prob, comm, **kwargs)
        if comm.name.startswith("ring"):  # the TP group's, not the dense runs' (mpi)
            with torch.no_grad():
                module.fc1.weight.mul_(1.01)
        return module

    monkeypatch.setattr(scale, "build", off)
    for dtype_name in ("fp32", "bf16"):
        row = _measure_in_process(dtype_name, tokens=1024, hidden=32, seq=256)
        assert not row["ok"] and row["check_ratio"] > 1 and "step_ms" not in row, dtype_name


@needs_mpi
def test_a_dense_run_that_overflows_loosens_nothing(monkeypatch):
    """When the dense bf16 run's own results are not finite, the dtype's tolerance alone
    applies: the same bf16 row that passes against a finite dense run then fails."""
    import torch

    from bench import scale

    build = scale.build

    def overflowing_dense(prob, comm, **kwargs):
        module = build(prob, comm, **kwargs)
        if not comm.name.startswith("ring") and kwargs["dtype"] == torch.bfloat16:
            with torch.no_grad():
                module.fc1.weight.fill_(float("inf"))
        return module

    monkeypatch.setattr(scale, "build", overflowing_dense)
    row = _measure_in_process("bf16", tokens=1024, hidden=32, seq=256)
    assert row["dense_max_rel_err"] == float("inf")
    assert not row["ok"] and row["check_ratio"] > 1 and "step_ms" not in row


def test_parameter_gradient_errors_are_relative_with_a_floor_for_zero_gradients():
    """A weight gradient off by 10% reports 0.1; a gradient that is zero in exact arithmetic
    (both sides rounding noise of 1e-9) is judged against the gradients' typical size (RMS
    of the references together: sqrt((4 * 1 + 4 * 0) / 8))."""
    import math

    import torch

    from bench.scale import _parameter_errors

    weight, zero = torch.ones(4), torch.zeros(4)
    errors = _parameter_errors([weight * 1.1, zero + 1e-9], [weight, zero])
    assert errors[0] == pytest.approx(0.1)
    assert errors[1] == pytest.approx(1e-9 / math.sqrt(0.5))
    assert _parameter_errors([weight * float("nan"), zero], [weight, zero])[0] == math.inf


@needs_mpi
def test_recording_keeps_no_tensor_it_was_given_and_replay_gets_its_own():
    """A recorded ``out=`` chunk of a sequence-parallel layer's output kept that output, its
    autograd graph and every parameter's AccumulateGrad node alive; on 2 GPUs the step's
    CUDA-graph capture then failed. The recording keeps shapes and dtypes only."""
    import weakref

    import torch
    from mpi4py import MPI

    import tp.comm
    from bench.scale import recording, replay

    comm = tp.comm.create("mpi", MPI.COMM_SELF, "cpu")
    weight = torch.ones(6, requires_grad=True)
    output = weight * 2  # an autograd graph hangs on it
    alive = weakref.ref(output)
    calls = []
    with recording(comm, calls):
        with torch.no_grad():  # as inside a TP layer's autograd Function
            comm.all_reduce(torch.full((4,), 3.0), out=output[1:5])
    assert torch.equal(output.detach(), torch.tensor([2.0, 3, 3, 3, 3, 2]))
    del output
    assert alive() is None, "the recording kept the output (and its graph) alive"
    (op, shape, dtype, args, kwargs), = calls
    assert (op, shape, dtype, args) == ("all_reduce", (4,), torch.float32, ())
    assert kwargs["out"].device.type == "meta" and kwargs["out"].shape == (4,)
    replay(comm, calls, torch.device("cpu"))()  # buffers of its own, on the device
    comm.close()


@pytest.mark.gpu
@needs_mpi
@pytest.mark.parametrize("comm", ["nccl", "symm"])
def test_the_sequence_parallel_step_is_captured_between_two_gpus(tmp_path, comm):
    """The SP MLP block and transformer layer at P = 2, eager and captured into a CUDA graph,
    each checked against the dense workload (the capture failed while gemmlab scale's record
    of the collectives kept the step's autograd graph alive)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    result = mpirun(2, "-m", "bench.cli", "scale", "strong", "--workload", "mlp,layer",
                    "--tokens", "1024", "--hidden", "256", "--heads", "4", "--seq", "256",
                    "--iters", "2", "--warmup-iters", "1", "--dtype", "bf16", "--device",
                    "cuda", "--comm", comm, "--sequence-parallel", "--cuda-graph", "--out",
                    str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["workload"] for r in rows] == ["mlp", "layer"]
    assert all(r["ok"] and r["graph_step_ms"] > 0 for r in rows), rows
