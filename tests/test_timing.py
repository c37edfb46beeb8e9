"""bench.timing: which path a kernel time takes (CUDA-graph replay, eager on request, eager
when the capture fails, CPU), what the graph's output must pass, and the sample counts;
and ``gemmlab bench --overhead`` end to end. The GPU paths run here with fake CUDA pieces:
the device is a label, the graph and the timer are stand-ins."""

import json

import pytest
import torch
from conftest import HAS_GPU

from bench import overhead_bench, timing

CUDA = torch.device("cuda")


class FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """``capture`` returns a FakeGraph (and the call's result); the eager timer reports the
    function it was given and 12 samples; synchronize is a no-op."""
    state = {"graph": FakeGraph(), "timed": [], "capture_error": None}

    def capture(fn):
        if state["capture_error"] is not None:
            raise state["capture_error"]
        return state["graph"], fn()

    def eager(fn, warmup_ms, rep_ms, min_reps):
        state["timed"].append(fn)
        state["warmup_ms"] = warmup_ms
        return [1.0] * max(min_reps, 12)

    monkeypatch.setattr(timing, "capture", capture)
    monkeypatch.setattr(timing, "_eager_samples", eager)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return state


def test_graph_timing_replays_the_captured_call_and_checks_its_output(fake_cuda):
    seen = []
    samples, how = timing.kernel_samples(lambda: "D", CUDA, min_reps=20,
                                         verify=lambda d: seen.append(d))
    assert how == "graph" and len(samples) == 20
    assert seen == ["D"] and fake_cuda["graph"].replays == 1  # replayed once, then verified
    assert fake_cuda["timed"] == [fake_cuda["graph"].replay]  # the replay is what is timed


@pytest.mark.parametrize("mode", timing.TIMINGS)
def test_kernel_samples_start_after_the_settling_warm_up_by_default(fake_cuda, mode):
    # A GPU at its power limit is still slowing down 100 ms into a load: the default warm-up
    # must outlast that (bench.timing's module doc), and a given one is passed through.
    timing.kernel_samples(lambda: "D", CUDA, timing=mode)
    assert fake_cuda["warmup_ms"] == timing.SETTLE_MS >= 1000
    timing.kernel_samples(lambda: "D", CUDA, timing=mode, warmup_ms=3)
    assert fake_cuda["warmup_ms"] == 3


def test_a_wrong_graph_output_raises(fake_cuda):
    with pytest.raises(ValueError, match="graph's replay gave a wrong result: off by one"):
        timing.kernel_samples(lambda: "D", CUDA, verify=lambda d: "off by one")
    assert fake_cuda["timed"] == []


def test_a_call_that_cannot_be_captured_is_timed_eagerly_and_says_why(fake_cuda):
    fake_cuda["capture_error"] = RuntimeError("operation not permitted when stream is\n"
                                              "capturing")

    def call():
        return "D"
    samples, how = timing.kernel_samples(call, CUDA)
    assert how == "eager: RuntimeError: operation not permitted when stream is capturing"
    assert fake_cuda["timed"] == [call] and len(samples) >= 10


def test_eager_timing_on_request(fake_cuda):
    def call():
        return "D"
    samples, how = timing.kernel_samples(call, CUDA, timing="eager")
    assert how == "eager" and fake_cuda["timed"] == [call]
    assert fake_cuda["graph"].replays == 0
    with pytest.raises(ValueError, match="timing must be one of graph, eager; got 'warm'"):
        timing.kernel_samples(call, CUDA, timing="warm")


def test_cpu_samples_are_measured_and_at_least_min_reps():
    calls = []
    samples, how = timing.kernel_samples(lambda: calls.append(1), torch.device("cpu"),
                                         rep_ms=1, min_reps=25)
    assert how == "cpu" and len(samples) >= 25 and all(s > 0 for s in samples)
    assert len(calls) >= len(samples)  # every sample is a block of real calls
    assert len(timing.call_samples(lambda: None, torch.device("cpu"), rep_ms=1,
                                   min_reps=7)) >= 7


@pytest.mark.skipif(HAS_GPU, reason="the CPU run of the overhead benchmark")
def test_overhead_benchmark_end_to_end_on_cpu(tmp_path):
    from test_bench import gemmlab

    result = gemmlab("bench", "--overhead", "--backend",
                     "cublas,torch_compile,torch_unfused,triton_fused",
                     "--dtype", "fp32", "--shape", "16", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gemm() host overhead" in result.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["backend"] for r in rows] == ["cublas", "torch_compile", "torch_unfused",
                                            "triton_fused"]
    for r in rows:
        assert r["ok"] and (r["M"], r["N"], r["K"]) == (16, 16, 16)
        assert r["wrapped_us"] > 0 and r["gemm_us"] > 0 and r["untuned_us"] > 0
        assert r["launch_us"] > 0
        # their values: the fake clock's test below
        assert all(isinstance(r[k], float) for k in ("added_us", "front_us", "closure_us"))
    assert rows[0]["tuned_us"] is None  # cublas has nothing to tune
    assert isinstance(rows[3]["tuned_us"], float)
    assert all(r["host_ns"] > 0 for r in rows)  # the host's speed, timed in every row
    assert rows[0]["config"] == "cuBLAS heuristics"
    assert rows[3]["config"].startswith("BLOCK_M: ")  # what ran: the tiles, the kernel
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_overhead_call_handing_back_an_earlier_d_fails_its_check(monkeypatch):
    """A wrapped call that returns a D made before (as one that never wrote the D it was
    given would): the operands are refilled before each call's check, so it is caught."""
    import backends

    def stale_wrapped(name, p, a, b, c, d):
        earlier = backends.gemm(a, b, c, activation="relu", backend=name)
        return lambda: earlier

    monkeypatch.setattr(overhead_bench, "_wrapped", stale_wrapped)
    device = torch.device("cuda" if HAS_GPU else "cpu")
    row = overhead_bench.measure("cublas", "fp32", device, (8, 8, 8), rounds=1, number=1)
    assert not row["ok"] and row["error"].startswith("ValueError: wrapped call: relative error")
    assert row["wrapped_us"] is None and row["gemm_us"] is None  # never timed


@pytest.mark.parametrize("name", ["cublas", "triton_fused"])
def test_overhead_figures_come_from_the_timed_calls(monkeypatch, name):
    """A fake clock that runs each timed function once, sees which call it was (the wrapped
    call, gemm() tuned, gemm() untuned, the bound launch) and reports that call's next time:
    the probe (one call each), then three rounds. The medians, the loop size and the
    differences are then known in advance."""
    import backends

    seen = []
    gemm = backends.gemm

    def spy_gemm(*args, tuned=True, **kwargs):
        seen.append("gemm" if tuned else "untuned")
        return gemm(*args, tuned=tuned, **kwargs)

    wrapped = overhead_bench._wrapped

    def spy_wrapped(*args):
        call = wrapped(*args)

        def tagged():
            seen.append("wrapped")
            return call()
        return tagged

    bind_launch = overhead_bench.bind_launch

    def spy_bind_launch(*args, **kwargs):
        launch = bind_launch(*args, **kwargs)

        def tagged(*launch_args):
            seen.append("launch")
            return launch(*launch_args)
        return tagged

    #     probe, then the rounds (median: wrapped 2, gemm 7, untuned 6, launch 2.5)
    times = {"wrapped": iter([40.0, 3.0, 1.0, 2.0]), "gemm": iter([100.0, 9.0, 5.0, 7.0]),
             "untuned": iter([20.0, 6.0, 4.0, 8.0]), "launch": iter([30.0, 4.0, 2.0, 2.5])}
    loops = []

    def fake_host_us(fn, number, device):
        fn()
        loops.append((seen[-1], number))
        return next(times[seen[-1]])

    monkeypatch.setattr(backends, "gemm", spy_gemm)
    monkeypatch.setattr(overhead_bench, "_wrapped", spy_wrapped)
    monkeypatch.setattr(overhead_bench, "bind_launch", spy_bind_launch)
    monkeypatch.setattr(overhead_bench, "_host_us", fake_host_us)
    host = iter([44.0, 75.0, 46.0])  # the host's speed, timed at the start of each round

    def fake_interpreter_ns():
        loops.append(("host", None))
        return next(host)

    monkeypatch.setattr(overhead_bench, "interpreter_ns", fake_interpreter_ns)
    device = torch.device("cuda" if HAS_GPU else "cpu")
    row = overhead_bench.measure(name, "fp32", device, (8, 8, 8), rounds=3, number=200)
    assert row["ok"], row["error"]
    # The slowest probe took 100 µs: loops of 200 * 50 / 100 = 100 calls.
    # The rounds' order rotates: no call always runs first.
    # Each round starts by timing the host's speed.
    assert loops == [("gemm", 1), ("untuned", 1), ("wrapped", 1), ("launch", 1)] + [
        ("host", None), ("gemm", 100), ("untuned", 100), ("wrapped", 100), ("launch", 100),
        ("host", None), ("untuned", 100), ("wrapped", 100), ("launch", 100), ("gemm", 100),
        ("host", None), ("wrapped", 100), ("launch", 100), ("gemm", 100), ("untuned", 100)]
    assert row["host_ns"] == 46.0  # the median of the rounds' host speeds
    assert row["number"] == 100
    assert (row["wrapped_us"], row["gemm_us"], row["untuned_us"], row["launch_us"]) == (
        2.0, 7.0, 6.0, 2.5)
    # added: the median of the rounds' differences (6, 4, 5), quartiles inclusive.
    assert row["added_us"] == 5.0 and row["added_iqr_us"] == [4.5, 5.5]
    # front: gemm() - launch per round (5, 3, 4.5); closure: launch - wrapped (1, 1, 0.5).
    assert row["front_us"] == 4.5 and row["closure_us"] == 1.0
    assert row["tuned_us"] == (1.0 if name == "triton_fused" else None)  # cublas: nothing tuned


def test_overhead_rows_fail_when_a_call_is_wrong(monkeypatch):
    def wrong(name, p, a, b, c, d):
        return lambda: torch.zeros_like(d)
    monkeypatch.setattr(overhead_bench, "_wrapped", wrong)
    row = overhead_bench.measure("cublas", "fp32", torch.device("cpu"), (8, 8, 8), rounds=1,
                                 number=1)
    assert not row["ok"] and row["gemm_us"] is None
    assert "wrapped call: relative error" in row["error"]


def test_overhead_rows_fail_when_the_bound_launch_is_wrong(monkeypatch):
    def wrong(a, b, c, **kwargs):
        return lambda a, b, c, out: torch.full((a.shape[0], b.shape[1]), float("nan"))
    monkeypatch.setattr(overhead_bench, "bind_launch", wrong)
    row = overhead_bench.measure("cublas", "fp32", torch.device("cpu"), (8, 8, 8), rounds=1,
                                 number=1)
    assert not row["ok"] and row["launch_us"] is None and row["front_us"] is None
    assert "launch call: relative error" in row["error"]


def test_targets_missed_names_each_target():
    row = {"backend": "triton_fused", "added_us": 3.5, "gemm_us": 16.0, "tuned_us": 1.5}
    assert overhead_bench.targets_missed(row) == [
        "adds 3.5 > 3 µs", "gemm() 16.0 > 15 µs", "tuned look-up 1.5 > 1 µs"]
    row = {"backend": "cuda_mma", "added_us": 2.0, "gemm_us": 11.0, "tuned_us": 0.2}
    assert overhead_bench.targets_missed(row) == []
    row = {"backend": "cublas", "added_us": 2.9, "gemm_us": 30.0, "tuned_us": None}
    assert overhead_bench.targets_missed(row) == []
    # A miss whose quartiles reach below the target says so; one clear of it does not.
    row = {"backend": "cublas", "added_us": 3.4, "added_iqr_us": [2.6, 4.0], "gemm_us": 30.0,
           "tuned_us": None}
    assert overhead_bench.targets_missed(row) == [
        "adds 3.4 > 3 µs (its quartiles reach below: noise?)"]
    row["added_iqr_us"] = [3.1, 4.0]
    assert overhead_bench.targets_missed(row) == ["adds 3.4 > 3 µs"]


def test_interpreter_ns_times_a_python_call():
    # An empty Python call costs tens of ns on any host this runs on; not zero, not a second.
    assert 1.0 < overhead_bench.interpreter_ns(1000) < 10_000.0


def test_added_text_shows_the_quartiles_when_recorded():
    assert overhead_bench.added_text({"added_us": 2.94, "added_iqr_us": [2.51, 3.26]}) == \
        "2.9 (2.5-3.3)"
    assert overhead_bench.added_text({"added_us": 2.94}) == "2.9"  # an older results file
    assert overhead_bench.added_text({"added_us": None}) == "-"
