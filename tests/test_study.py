"""``gemmlab study`` on 1 and 2 CPU ranks: the study end to end with a point that fails its
check, the trade-off model against its formula on the recorded bytes, the summary's
statistics, and the arguments it refuses. Every point runs under ``mpiexec`` with a
timeout."""

import json
import shlex
import statistics
import sys
from pathlib import Path

import pytest
import torch
from test_comm import needs_mpi

from bench import study
from bench.cli import main
from bench.scale_series import default_mpiexec

PROGRAMS = Path(__file__).resolve().parent / "mpi_programs"
# hidden 32, 2 heads (head_dim 16), FFN 4 x 32; 4 sequences of 16 tokens; one timed step.
TINY = ["--device", "cpu", "--tokens", "64", "--hidden", "32", "--heads", "2", "--seq", "16",
        "--iters", "1", "--warmup-iters", "0", "--timeout", "120"]


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def _off_layer_launcher() -> str:
    """An ``--mpiexec`` that runs each point through ``off_layer_scale.py`` (its layer fails
    the check at P > 1) instead of ``python -m bench.cli``: study launches
    ``<launcher> -n P python -m bench.cli scale ...``, and the wrapper drops the five words
    before ``scale``."""
    script = (f'n=$2; shift 5; exec {default_mpiexec()} -n "$n" {shlex.quote(sys.executable)} '
              f'{shlex.quote(str(PROGRAMS / "off_layer_scale.py"))} "$@"')
    return f"sh -c {shlex.quote(script)} sh"


@needs_mpi
def test_study_end_to_end_keeps_a_failed_check_out_of_every_efficiency(tmp_path, capsys):
    out = tmp_path / "study"
    # triton_fused on the CPU runs under the Triton interpreter, and Triton 3.6's fails on
    # numpy 2 (test_cli's interpreter test is CPU-only for the same reason): on a GPU
    # machine the second CPU backend is torch_unfused.
    second = "torch_unfused" if torch.cuda.is_available() else "triton_fused"
    status = main(["study", *TINY, "--ranks", "1,2", "--mode", "strong", "--comm", "mpi",
                   "--backend", f"cublas,{second},cuda_vec", "--mpiexec",
                   _off_layer_launcher(), "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 1, printed  # the layer's FAIL at P = 2
    assert "skipping backend cuda_vec: backend cuda_vec " in printed
    for name in ("results.json", "results.jsonl", "results.csv", "results.png"):
        assert (out / name).exists(), name
    result = json.loads((out / "results.json").read_text())
    assert [(s["name"], s["kind"]) for s in result["skipped"]] == [("cuda_vec", "backend")]
    rows = result["rows"]
    assert len(rows) == 2 * 2 * 2  # workloads x backends x P
    runs = {(r["mode"], r["backend"], r["P"]): r["status"] for r in result["runs"]}
    assert set(runs.values()) == {"ok", "check_failed"}
    assert all(s == ("check_failed" if p == 2 else "ok") for (_, _, p), s in runs.items())
    assert all((out / "points" / f"{m}_{b}_mpi" / f"P{p}" / "log.txt").exists()
               for m, b, p in runs)
    first = {(r["workload"], r["mode"], r["backend"]): r for r in rows if r["P"] == 1}
    for r in rows:
        for field in ("workload", "mode", "backend", "comm", "P", "ok", "efficiency",
                      "speedup", "p1_tflops_per_gpu"):
            assert field in r, field
        base = first[r["workload"], r["mode"], r["backend"]]
        assert r["p1_tflops_per_gpu"] == base["tflops_per_gpu"]
        if r["P"] == 1:
            assert r["ok"] and r["efficiency"] == 1.0 and r["speedup"] == 1.0
            assert r["comm_ms"] == 0 and r["comm_share"] == 0
        elif r["workload"] == "layer":  # failed its check: no time, no efficiency
            assert not r["ok"] and "step_ms" not in r
            assert r["efficiency"] is None and r["speedup"] is None
        else:
            assert r["ok"] and r["comm_ms"] > 0 and r["comm_bytes"] == 2 * 64 * 32 * 4
            t1, t2 = base["step_ms"], r["step_ms"]
            assert r["efficiency"] == t1 / (2 * t2) and r["speedup"] == t1 / t2
            assert r["comm_share"] == r["comm_ms"] / t2
    # The answer, from the rows: one entry per workload, mode, communicator and P > 1 that
    # has timed rows; the failed layer has none.
    stats = result["summary"]["stats"]
    assert [(s["workload"], s["mode"], s["P"]) for s in stats] == [("mlp", "strong", 2)]
    for s in stats:
        sub = sorted((r for r in rows if (r["workload"], r["mode"], r["P"]) ==
                      (s["workload"], s["mode"], 2)), key=lambda r: r["p1_tflops_per_gpu"])
        x = [r["p1_tflops_per_gpu"] for r in sub]
        y = [r["efficiency"] for r in sub]
        assert s["n"] == 2 and s["backends"] == [r["backend"] for r in sub]
        assert s["pearson_r"] == statistics.correlation(x, y)
        assert s["slope_per_tflops"] == statistics.linear_regression(x, y).slope
        assert s["slowest"]["comm_share"] == sub[0]["comm_share"]
        assert s["fastest"]["comm_share"] == sub[-1]["comm_share"]
    (line,) = result["summary"]["lines"]
    assert line.startswith("mlp strong mpi P=2: over 2 backends") and "Pearson r" in line
    assert "FAIL" in printed and "check_failed" in printed


@needs_mpi
def test_tradeoff_model_is_the_formula_on_the_recorded_bytes(tmp_path, capsys):
    out = tmp_path / "tradeoff"
    status = main(["study", "--tradeoff", *TINY, "--hidden", "32,64", "--ranks", "2",
                   "--workload", "mlp", "--mode", "weak", "--backend", "cublas", "--comm",
                   "mpi", "--no-overlap", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    result = json.loads((out / "results.json").read_text())
    assert "arXiv:2104.04473" in result["model"]["sources"][0]
    assert "PERFORMANCE.md" in result["model"]["sources"][1]
    rows = result["rows"]
    # Weak sizes: each rank holds the P = 1 problem, FFN 4 h P wide.
    assert [(r["hidden"], r["ffn"], r["P"]) for r in rows] == [(32, 256, 2), (64, 512, 2)]
    factor = 2 * (2 - 1) / 2  # ring all-reduce busbw factor at P = 2
    best = max(r["comm_bytes"] * factor / (r["comm_ms"] * 1e-3) / 1e9 for r in rows)
    for r in rows:
        h = r["hidden"]
        # Bytes communicated: one (T, h) fp32 all-reduce forward and one backward.
        assert r["comm_bytes"] == 2 * 64 * h * 4
        assert r["flop_per_byte"] == r["flops_per_gpu"] / r["comm_bytes"]
        assert r["flop_per_byte"] == 6 * 4 * h / 4  # 6 r h / itemsize: 12 T h (r h) FLOPs
        assert r["busbw_GBps"] == r["comm_bytes"] * factor / (r["comm_ms"] * 1e-3) / 1e9
        assert r["model_busbw_GBps"] == best
        p1 = json.loads((out / "points" / f"strong_cublas_mpi_h{h}_r4_t64" / "P1" /
                         "results.json").read_text())["rows"][0]
        assert r["p1_tflops_per_gpu"] == p1["tflops_per_gpu"]
        compute = r["flops_per_gpu"] / (p1["tflops_per_gpu"] * 1e12) * 1e3
        comm = r["comm_bytes"] * factor / (best * 1e9) * 1e3
        assert r["model_compute_ms"] == compute and r["model_comm_ms"] == comm
        assert r["model_comm_share"] == comm / (compute + comm)
        # The closed form in FLOP per byte (module doc), equal up to rounding.
        assert r["model_comm_share"] == pytest.approx(
            1 / (1 + r["flop_per_byte"] * best * 1e9 / (factor * p1["tflops_per_gpu"] * 1e12)))
    (s,) = result["summary"]["stats"]
    assert s["flop_per_byte"] == [192.0, 384.0] and s["n"] == 2
    assert s["comm_share"] == [rows[0]["comm_share"], rows[1]["comm_share"]]
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"


def _row(workload, backend, p, rate, efficiency, share, ok=True):
    row = {"workload": workload, "mode": "strong", "comm": "mpi", "backend": backend, "P": p,
           "ok": ok, "p1_tflops_per_gpu": rate, "efficiency": efficiency}
    if ok:
        row |= {"step_ms": 1.0, "comm_share": share}
    return row


def test_efficiency_is_computed_from_the_rows_own_step_times():
    """Strong T(1) / (P T(P)), weak T(1) / T(P), exactly; none against a FAIL P = 1 row."""
    base = {"mlp": {"workload": "mlp", "P": 1, "ok": True, "step_ms": 3.0,
                    "tflops_per_gpu": 2.0}}
    rows = [{"workload": "mlp", "P": p, "ok": True, "step_ms": t} for p, t in ((1, 3.0),
                                                                             (3, 1.7))]
    strong = study.with_efficiency("strong", rows, base)
    weak = study.with_efficiency("weak", rows, base)
    assert [r["efficiency"] for r in strong] == [1.0, 3.0 / (3 * 1.7)]
    assert [r["efficiency"] for r in weak] == [1.0, 3.0 / 1.7]
    assert [r["speedup"] for r in weak] == [1.0, 3 * 3.0 / 1.7]
    assert all(r["p1_tflops_per_gpu"] == 2.0 for r in strong + weak)
    failed = {"mlp": {"workload": "mlp", "P": 1, "ok": False}}
    (r,) = study.with_efficiency("strong", rows[1:], failed)
    assert r["efficiency"] is r["speedup"] is r["p1_tflops_per_gpu"] is None


def test_summary_correlates_the_checked_rows_only():
    """Three backends at P = 2 and a fourth whose point failed its check: the FAIL row (no
    efficiency) changes nothing; Spearman's rho ranks ties by their mean rank."""
    rows = [_row("mlp", b, 1, rate, 1.0, 0.0) for b, rate in (("a", 1.0), ("b", 2.0),
                                                              ("c", 4.0), ("d", 8.0))]
    rows += [_row("mlp", "a", 2, 1.0, 0.9, 0.1), _row("mlp", "b", 2, 2.0, 0.8, 0.2),
             _row("mlp", "c", 2, 4.0, 0.8, 0.3), _row("mlp", "d", 2, 8.0, None, None, ok=False)]
    (s,), (line,) = study.summarize(rows)
    assert s["n"] == 3 and s["backends"] == ["a", "b", "c"]
    assert s["pearson_r"] == statistics.correlation([1.0, 2.0, 4.0], [0.9, 0.8, 0.8])
    assert s["spearman_rho"] == statistics.correlation([1, 2, 3], [3, 1.5, 1.5])
    assert s["fastest"] == {"backend": "c", "p1_tflops_per_gpu": 4.0, "efficiency": 0.8,
                            "comm_share": 0.3}
    assert line.startswith("mlp strong mpi P=2: over 3 backends")
    assert study.spearman([1.0], [2.0]) is None and study.spearman([1, 1], [1, 2]) is None


@pytest.mark.parametrize("argv,message", [
    (("--ranks", "2,4"), "--ranks must include 1"),
    (("--ranks", "1,x"), "--ranks must be a comma list of positive integers"),
    (("--tradeoff", "--ranks", "1,2"), "--tradeoff runs at one P >= 2"),
    (("--hidden", "32,64"), "one --hidden, --ffn-ratio and --tokens each without --tradeoff"),
    (("--backend", "cublas,nope"), "unknown backend nope"),
    (("--comm", "smoke"), "unknown communicator smoke"),
    (("--mode", "wide"), "unknown mode wide"),
    (("--ranks", "1,3"), "is not a multiple of the TP size 3"),
    (("--backend", "cuda_vec"), "no backend can run here; backend cuda_vec "),
])
def test_study_refuses_bad_arguments_before_any_point(argv, message, tmp_path, capsys):
    status = main(["study", *TINY, "--ranks", "1,2", *argv, "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert status == 2
    (error,) = _errors(printed)
    assert message in error, error
    assert not (tmp_path / "out").exists()
