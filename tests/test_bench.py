"""``gemmlab bench``: the CPU path end to end, and the rules of the sweep (check before
timing; a failing backend is FAIL and never ranked)."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HAS_GPU

import backends
from bench import gemm_bench as gb

REPO = Path(__file__).resolve().parent.parent
FAST = gb.Timing(warmup_ms=1, rep_ms=2, min_reps=2)


def gemmlab(*args, env=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (env or {})
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)


@pytest.mark.parametrize("text,shape", [("4096", (4096,) * 3), ("1X2x3", (1, 2, 3)),
                                        ("16384x4096x512", (16384, 4096, 512))])
def test_parse_shape(text, shape):
    assert gb.parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "0", "4x4", "axbxc", "1x2x3x4", "-5"])
def test_parse_shape_rejects(text):
    with pytest.raises(ValueError, match="is not N or MxNxK"):
        gb.parse_shape(text)


@pytest.mark.skipif(HAS_GPU, reason="the CPU functional check runs only without a GPU")
def test_cpu_bench_end_to_end(tmp_path):
    result = gemmlab("bench", "--shape", "17x33x65,1", "--rep-ms", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith("No CUDA GPU found: running the CPU functional check only")
    assert "skipped cuda_regblock: no CUDA GPU" in result.stdout
    assert "[CPU functional check: wall times]" in result.stdout

    data = json.loads((tmp_path / "results.json").read_text())
    meta, rows = data["meta"], data["rows"]
    for key in ("gpu", "driver", "cuda", "torch", "triton", "cupy", "git_commit", "command",
                "date"):
        assert key in meta
    assert meta["command"].startswith("gemmlab bench")
    assert {r["epilogue"] for r in rows} == {"relu_c"}
    ran = {(r["backend"], r["dtype"], r["M"], r["N"], r["K"]) for r in rows}
    for shape in ((17, 33, 65), (1, 1, 1)):
        for name in ("cublas", "torch_compile", "torch_unfused", "triton_fused"):
            assert (name, "fp32", *shape) in ran
        assert ("triton_fused", "bf16", *shape) not in ran  # no bf16 in the interpreter
    assert all(r["timing"] == "cpu" and r["call_ms"] is None for r in rows)
    for r in rows:
        assert r["ok"] and r["rel_err"] <= r["tol"] and r["ms"] > 0 and r["tflops"] > 0
        assert r["tol"] == backends.TOLERANCES[r["dtype"]]
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("backend,launcher,dtype,epilogue,M,N,K,ms,tflops")
    assert len(csv_lines) == len(rows) + 1
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_names():
    result = gemmlab("bench", "--backend", "cublas,cutlass", "--dtype", "fp8",
                     "--epilogue", "gelu")
    assert result.returncode == 2
    (error,) = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    for part in ("unknown backend cutlass (known: cublas,", "unknown dtype fp8 (known: fp32,",
                 "unknown epilogue gelu (known: relu_c,"):
        assert part in error
    assert gemmlab("bench", "--shape", "4x4").returncode == 2


def _broken(backend: backends.Backend, damage) -> backends.Backend:
    def bind(p, config=None, *note):
        launch = backend.bind(p, config, *note)

        def broken(a, b, c, out):
            d = launch(a, b, c, out)
            damage(d)
            return d
        return broken
    return dataclasses.replace(backend, bind=bind)


@pytest.mark.parametrize("damage", [
    lambda d: d.mul_(1.001),             # slightly wrong everywhere
    lambda d: d[-1, -1].fill_(float("nan")),  # one element never written
], ids=["wrong", "unwritten"])
def test_a_failing_backend_is_fail_and_never_ranked(monkeypatch, damage):
    monkeypatch.setitem(backends.BACKENDS, "torch_unfused",
                        _broken(backends.BACKENDS["torch_unfused"], damage))
    device = torch.device("cpu")
    rows = gb.run_sweep(["cublas", "torch_unfused"], [(33, 17, 40)], ["fp32"], device, FAST)
    cublas, unfused = rows
    assert cublas["ok"] and cublas["pct_best_cublas"] == pytest.approx(100)
    assert not unfused["ok"] and unfused["rel_err"] > unfused["tol"]
    assert unfused["ms"] is None and unfused["tflops"] is None
    assert unfused["pct_best_cublas"] is None
    assert cublas["speedup_vs_torch_unfused"] is None


def test_a_backend_that_raises_is_a_fail_row(monkeypatch):
    def explode(d):
        raise RuntimeError("launch failed")
    monkeypatch.setitem(backends.BACKENDS, "cublas", _broken(backends.BACKENDS["cublas"], explode))
    rows = gb.run_sweep(["cublas", "torch_unfused"], [(8, 8, 8)], ["fp32"], torch.device("cpu"),
                        FAST)
    assert not rows[0]["ok"] and rows[0]["error"] == "RuntimeError: launch failed"
    assert rows[1]["ok"] and rows[1]["pct_best_cublas"] is None


def test_ratios_are_within_one_shape_and_dtype_against_the_faster_cublas():
    rows = [dict(backend=n, dtype=d, epilogue=e, M=8, N=8, K=8, ms=ms, pct_best_cublas=None,
                 best_cublas=None, x_torch_compile=None, speedup_vs_torch_unfused=None)
            for n, d, e, ms in [("cublas", "fp32", "relu_c", 1.0),
                                ("cublaslt", "fp32", "relu_c", 0.8),
                                ("torch_compile", "fp32", "relu_c", 0.4),
                                ("torch_unfused", "fp32", "relu_c", 2.0),
                                ("triton_fused", "fp32", "relu_c", 0.5),
                                ("triton_fused", "fp16", "relu_c", 0.25),
                                ("cublas", "fp32", "none", 0.125),
                                ("triton_fused", "fp32", "none", 0.25)]]
    gb.add_ratios(rows)
    # relu_c fp32: cublaslt (0.8 ms) is the best cuBLAS; fp16 has no cuBLAS row.
    assert [r["pct_best_cublas"] for r in rows] == [80, 100, 200, 40, 160, None, 100, 50]
    assert [r["best_cublas"] for r in rows] == ["cublaslt"] * 5 + [None] + ["cublas"] * 2
    assert [r["x_torch_compile"] for r in rows] == [0.4, 0.5, 1, 0.2, 0.8, None, None, None]
    assert [r["speedup_vs_torch_unfused"] for r in rows] == [2, 2.5, 5, 1, 4, None, None,
                                                            None]


def test_the_best_cublas_row_is_exactly_100_percent_of_itself():
    # 100 * ms / ms rounds to 100.00000000000001 for this ms; the ratio must come first.
    ms = 0.7000000000000001
    rows = [dict(backend="cublas", dtype="fp32", epilogue="relu_c", M=8, N=8, K=8, ms=ms)]
    gb.add_ratios(rows)
    assert rows[0]["pct_best_cublas"] == 100


def test_rounds_below_one_are_refused():
    result = gemmlab("bench", "--rounds", "0")
    assert result.returncode == 2
    assert "--rounds must be >= 1, got 0" in result.stdout


@pytest.mark.parametrize("command,flag,value,message", [
    ("bench", "--min-reps", "0", "--min-reps must be >= 1; got 0"),
    ("bench", "--rep-ms", "-5", "--rep-ms must be a finite number > 0; got -5"),
    ("bench", "--rep-ms", "nan", "--rep-ms must be a finite number > 0; got nan"),
    ("bench", "--shape", " , ", "--shape ' , ' lists no shape"),
    ("tune", "--warmup-ms", "-100", "--warmup-ms must be a finite number >= 0; got -100"),
    ("tune", "--budget", "-1", "--budget must be a finite number >= 0 seconds; got -1"),
    ("tune", "--budget", "nan", "--budget must be a finite number >= 0 seconds; got nan")])
def test_options_that_cannot_time_are_refused(command, flag, value, message):
    """Before any work: a row with no sample has no median, and a negative time means
    nothing."""
    result = gemmlab(command, flag, value)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: {message}" in result.stdout


def _timed(name, kernel: list[float], calls: list[float] | None = None):
    """A checked row and its call; ``kernel``/``calls`` feed the fake timers per round."""
    def call():
        return name
    call.kernel, call.calls = iter(kernel), iter(calls or [])
    return gb.Checked({"backend": name, "launcher": "", "M": 2, "N": 2, "K": 2, "ok": True,
                       "ms": None, "timing": ""}, call, None)


@pytest.fixture
def fake_timers(monkeypatch):
    """kernel_samples/call_samples that log the order and hand out each call's next time."""
    order = []

    def kernel_samples(call, device, timing="graph", verify=None, **_):
        order.append(("kernel", call()))
        return [next(call.kernel)], timing

    def call_samples(call, device, **_):
        order.append(("call", call()))
        return [next(call.calls)]

    monkeypatch.setattr(gb, "kernel_samples", kernel_samples)
    monkeypatch.setattr(gb, "call_samples", call_samples)
    return order


def test_rounds_take_turns_and_report_the_median(fake_timers):
    checked = [_timed("x", [3.0, 1.0, 2.0]), _timed("y", [5.0, 9.0, 7.0])]
    checked.append(gb.Checked({"backend": "failed", "launcher": "", "M": 2, "N": 2, "K": 2,
                               "ms": None, "ok": False}, None, None))
    gb.time_rows(checked, torch.device("cpu"), gb.Timing(rounds=3))
    assert fake_timers[:2] == [("kernel", "x"), ("kernel", "y")]  # the sweep's order first
    # every round times each passing row once; no call time on a CPU
    assert [sorted(fake_timers[i:i + 2]) for i in (0, 2, 4)] == [
        [("kernel", "x"), ("kernel", "y")]] * 3
    assert [entry.row["ms"] for entry in checked] == [2.0, 7.0, None]
    assert [entry.row.get("kernel_ms") for entry in checked] == [2.0, 7.0, None]
    # and every round's own median, in the rounds' order, for the run's spread
    assert [entry.row.get("kernel_ms_rounds") for entry in checked] == [[3.0, 1.0, 2.0],
                                                                       [5.0, 9.0, 7.0], None]
    assert checked[0][0]["tflops"] == pytest.approx(16 / 2e-3 / 1e12)
    assert "call_ms" not in checked[0][0] and "launch_bound" not in checked[0][0]


def test_later_rounds_shuffle_the_order_the_same_way_every_run(fake_timers):
    """No row always runs first, or always right after the same row: a GPU's clocks after one
    backend's kernels would otherwise favour or handicap the next one in every round."""
    names = "abcdef"

    def orders():
        fake_timers.clear()
        checked = [_timed(name, [1.0] * 8) for name in names]
        gb.time_rows(checked, torch.device("cpu"), gb.Timing(rounds=8))
        rounds = [[name for _, name in fake_timers[i:i + 6]] for i in range(0, 48, 6)]
        assert all(sorted(r) == list(names) for r in rounds)
        return rounds

    rounds = orders()
    assert rounds[0] == list(names)
    assert {r[0] for r in rounds} != {"a"}
    for name in names[1:]:
        before = {r[r.index(name) - 1] for r in rounds if r.index(name) > 0}
        assert len(before) > 1, f"{name} always follows {before}"
    assert orders() == rounds  # reproducible: the same orders in every run


@pytest.mark.parametrize("timing", ["graph", "eager"])
def test_kernel_and_call_times_and_the_launch_bound_mark(fake_timers, timing):
    """On a GPU every row gets a kernel and a call time; call > 1.2 x kernel is launch-bound.
    The device is only a label here: the fake timers touch no GPU."""
    checked = [_timed("fast_call", [1.0, 1.2], [1.1, 1.3]),      # 1.1 ms kernel, 1.2 call
               _timed("slow_call", [0.010, 0.012], [0.030, 0.020])]  # 11 µs kernel, 25 call
    gb.time_rows(checked, torch.device("cuda"), gb.Timing(rounds=2, timing=timing))
    # each row's call time right after its kernel time, every round
    assert sorted(zip(fake_timers[::2], fake_timers[1::2])) == [
        (("kernel", "fast_call"), ("call", "fast_call"))] * 2 + [
        (("kernel", "slow_call"), ("call", "slow_call"))] * 2
    fast, slow = (entry.row for entry in checked)
    assert fast["timing"] == slow["timing"] == timing
    assert fast["ms"] == fast["kernel_ms"] == pytest.approx(1.1)
    assert fast["call_ms"] == pytest.approx(1.2)
    assert fast["host_us"] == pytest.approx(100) and fast["launch_bound"] is False
    assert slow["kernel_ms"] == pytest.approx(0.011) and slow["call_ms"] == pytest.approx(0.025)
    assert slow["host_us"] == pytest.approx(14) and slow["launch_bound"] is True
    # 2 x 2 x 2 x 2 = 16 FLOP in the kernel time the fake timer gave, not the call time
    assert fast["tflops"] == pytest.approx(16 / 1.1e-3 / 1e12)
    assert slow["tflops"] == pytest.approx(16 / 0.011e-3 / 1e12)


def test_a_row_whose_graph_gives_a_wrong_result_is_fail_and_untimed(monkeypatch):
    def kernel_samples(call, device, verify=None, **_):
        raise ValueError("the CUDA graph's replay gave a wrong result: relative error 1")

    monkeypatch.setattr(gb, "kernel_samples", kernel_samples)
    checked = [_timed("x", [1.0])]
    gb.time_rows(checked, torch.device("cpu"), gb.Timing())
    row = checked[0][0]
    assert not row["ok"] and row["ms"] is None and row.get("tflops") is None
    assert "graph's replay gave a wrong result" in row["error"]


def test_a_sweep_with_rounds_times_every_passing_row():
    rows = gb.run_sweep(["cublas", "torch_unfused"], [(9, 7, 5)], ["fp32"], torch.device("cpu"),
                        gb.Timing(warmup_ms=1, rep_ms=2, min_reps=2, rounds=2),
                        epilogues=("relu_c", "none"))
    assert len(rows) == 4 and all(r["ok"] and r["ms"] > 0 for r in rows)
    assert [r["pct_best_cublas"] for r in rows if r["backend"] == "cublas"] == [100, 100]


def test_every_epilogue_is_checked_against_its_own_reference():
    device = torch.device("cuda" if HAS_GPU else "cpu")
    rows = gb.run_sweep(["cublas", "torch_unfused", "triton_fused"], [(19, 23, 17)], ["fp32"],
                        device, FAST, epilogues=tuple(gb.EPILOGUES))
    assert [(r["backend"], r["epilogue"]) for r in rows] == [
        (name, e) for e in gb.EPILOGUES for name in ("cublas", "torch_unfused", "triton_fused")]
    assert all(r["ok"] and r["rel_err"] <= 1e-6 for r in rows), rows


def test_roofline_intensity_and_plot(tmp_path):
    from bench import gemm_bench as gb
    from bench import roofline

    row = {"backend": "cublas", "dtype": "fp16", "epilogue": "relu_c", "M": 4096, "N": 4096,
           "K": 4096, "tflops": 600.0}
    # A, B, C and D of 4096^2 fp16 each: 4 * 32 MiB moved for 2 * 4096^3 FLOP.
    assert roofline.min_bytes(row, 2, "full") == 4 * 4096 * 4096 * 2
    assert roofline.intensity(row, 2, "full") == 2 * 4096**3 / (4 * 4096 * 4096 * 2)
    assert roofline.min_bytes(row, 2, "bias") == 2 * (3 * 4096 * 4096 + 4096)
    ceilings = {"bandwidth_gbps": 4000.0, "peak_tflops": {"fp16": 660.0, "fp32": 50.0}}
    rows = [row, {**row, "backend": "cuda_regblock", "dtype": "fp32", "tflops": 30.0},
            {**row, "backend": "cuda_naive", "tflops": None}]
    path = tmp_path / "roofline.png"
    roofline.plot(rows, ceilings, gb.EPILOGUES, path)
    assert path.stat().st_size > 10_000


def test_launcher_choice_is_checked():
    from backends.cuda import pycuda_unavailable_reason, use_launcher

    with pytest.raises(ValueError, match="unknown launcher 'numba'; known: cupy, pycuda"):
        with use_launcher("numba"):
            pass
    if (why := pycuda_unavailable_reason()) is not None:
        with pytest.raises(RuntimeError, match="launcher pycuda: " + re.escape(why)):
            with use_launcher("pycuda"):
                pass
    result = gemmlab("bench", "--shape", "3", "--launcher", "numba")
    assert result.returncode == 2 and "unknown launcher numba" in result.stdout


@pytest.mark.skipif(HAS_GPU, reason="the CPU functional check runs only without a GPU")
def test_cpu_bench_says_what_gpu_only_options_need():
    result = gemmlab("bench", "--shape", "3", "--rep-ms", "2", "--backend", "cublas",
                     "--launcher", "cupy,pycuda", "--resources", "--roofline")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipped launcher pycuda: no CUDA GPU visible to torch" in result.stdout
    assert "--resources: no GPU here" in result.stdout
    assert "--roofline: no GPU here" in result.stdout


def test_shapes_that_do_not_fit_are_refused_before_anything_is_allocated():
    result = gemmlab("bench", "--shape", "160000", "--dtype", "fp32")
    assert result.returncode == 2, result.stdout + result.stderr
    # per element of 160000^2: A, B and their float64 copies 2 x (4 + 8) bytes; out, D and C
    # 3 x 4; the float64 reference 8
    need = 160000**2 * (2 * 12 + 3 * 4 + 8) / 1e9
    assert (f"error: shape 160000x160000x160000 fp32 needs at least {need:.1f} GB"
            in result.stdout)
    # the bench runs on the GPU where there is one, and weighs the shape against its memory
    where = "on the GPU" if HAS_GPU else "in host memory"
    assert f"GB is free {where}" in result.stdout


def test_needed_bytes_counts_every_buffer_of_a_shape():
    m, n, k = 30, 20, 10
    # fp16: A, B (2 B) + their float64 copies (8 B) + out and D (2 B) + per epilogue C and
    # the float64 reference
    base = 2 * (m * k + k * n) + 8 * (m * k + k * n) + 2 * 2 * m * n
    assert gb.needed_bytes(m, n, k, "fp16", ("relu_c",)) == base + 2 * m * n + 8 * m * n
    assert gb.needed_bytes(m, n, k, "fp16", ("bias", "none")) == base + 2 * n + 16 * m * n
