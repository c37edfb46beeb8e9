"""README tables generated from results.json files (bench.readme_tables); CPU only."""

import json
import re

import pytest

from bench import readme_tables as rt

META = {"git_commit": "0123456789abcdef", "gpu": "NVIDIA H200", "torch": "2.11.0",
        "triton": "3.6.0", "command": "gemmlab bench --out x"}


def ladder_row(backend, dtype="fp16", epilogue="relu_c", shape=(1024, 1024, 1024), **kw):
    m, n, k = shape
    row = {"backend": backend, "dtype": dtype, "epilogue": epilogue, "M": m, "N": n, "K": k,
           "ok": True, "tflops": None, "kernel_ms": None, "call_ms": None,
           "launch_bound": None, "timing": "graph", "pct_best_cublas": None,
           "best_cublas": None, "x_torch_compile": None}
    row.update(kw)
    return row


def write(tmp_path, name, rows, meta=META):
    return write_json(tmp_path, name, {"meta": meta, "rows": rows})


def write_json(tmp_path, name, data):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps(data))
    return str(directory)


LADDER_ROWS = [
    ladder_row("cublas", tflops=642.14, pct_best_cublas=99.4, x_torch_compile=1.046,
               kernel_ms=0.5, call_ms=0.51, launch_bound=False),
    ladder_row("triton_fused", tflops=600.06, pct_best_cublas=93.2, timing="eager: no graph",
               kernel_ms=0.01, call_ms=0.0325, launch_bound=True),
    ladder_row("cublas", shape=(8192, 8192, 1024), tflops=700.0),
    ladder_row("naive", ok=False),
    ladder_row("cublas", dtype="bf16", epilogue="none", tflops=12.34, pct_best_cublas=100.0,
               timing="eager"),
    ladder_row("cublas", epilogue="bias", tflops=1.0, x_torch_compile=0.5),
]


def test_ladder_cells_groups_and_provenance(tmp_path):
    d = write(tmp_path, "ladder", LADDER_ROWS)
    out = rt.render("ladder", d)
    assert out == "\n".join([
        "**fp16, ReLU(A @ B + C)** — TFLOP/s from kernel time (% of the best cuBLAS; "
        "x torch.compile)",
        "",
        "| backend | 1024³ | 8192×8192×1024 |",
        "| --- | ---: | ---: |",
        "| `cublas` | 642.1 (99%; 1.05x) | 700.0 |",
        "| `triton_fused` | 600.1 (93%) e † | - |",
        "| `naive` | FAIL | - |",
        "",
        "**bf16, A @ B** — TFLOP/s from kernel time (% of the best cuBLAS; x torch.compile)",
        "",
        "| backend | 1024³ |",
        "| --- | ---: |",
        "| `cublas` | 12.3 (100%) e |",
        "",
        "**fp16, A @ B + bias** — TFLOP/s from kernel time (% of the best cuBLAS; "
        "x torch.compile)",
        "",
        "| backend | 1024³ |",
        "| --- | ---: |",
        "| `cublas` | 1.0 (0.50x) |",
        "",
        "e: timed eagerly (no CUDA graph); †: launch-bound (call time > 1.2 x kernel time).",
        "",
        f"Source: `{d}/results.json`, commit `0123456`, NVIDIA H200, torch 2.11.0, "
        "Triton 3.6.0; command: `gemmlab bench --out x`.",
    ])


def test_relative_directory_and_missing_meta(tmp_path, monkeypatch):
    monkeypatch.setattr(rt, "REPO", tmp_path)
    write(tmp_path, "res", [ladder_row("cublas", tflops=1.0)], meta={"gpu": "G"})
    out = rt.render("ladder", "res")
    assert out.endswith("Source: `res/results.json`, commit `?`, G, torch ?, Triton ?; "
                        "command: `?`.")


def test_launch_table_keeps_only_launch_bound_rows(tmp_path):
    d = write(tmp_path, "ladder", LADDER_ROWS + [
        ladder_row("torch", dtype="fp32", epilogue="c", shape=(128, 256, 64), kernel_ms=0.002,
                   call_ms=0.0105, launch_bound=True),
        ladder_row("cupy", kernel_ms=None, call_ms=0.5, launch_bound=True),
    ])
    lines = rt.render("launch", d).split("\n")
    assert lines[:4] == [
        "| backend | dtype | D = | shape | kernel µs | call µs | host µs | launch-bound |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
        "| `triton_fused` | fp16 | ReLU(A @ B + C) | 1024³ | 10.0 | 32.5 | 22.5 | yes |",
        "| `torch` | fp32 | A @ B + C | 128×256×64 | 2.0 | 10.5 | 8.5 | yes |",
    ]
    assert lines[4] == ""
    assert lines[5].startswith("Source: ") and len(lines) == 6


def test_launch_table_without_launch_bound_rows(tmp_path):
    d = write(tmp_path, "ladder", [ladder_row("cublas", kernel_ms=1.0, call_ms=1.1,
                                              launch_bound=False)])
    assert rt.render("launch", d).split("\n")[:2] == ["No row was launch-bound.", ""]


def test_overhead_table(tmp_path):
    rows = [
        {"backend": "cublas", "dtype": "fp32", "M": 128, "N": 128, "K": 128, "wrapped_us": 5.04,
         "gemm_us": 7.26, "untuned_us": 7.0, "added_us": 2.22, "added_iqr_us": [1.96, 2.54],
         "tuned_us": 0.26, "ok": True, "error": ""},
        {"backend": "cupy", "dtype": "fp16", "M": 256, "N": 128, "K": 64, "wrapped_us": 9.0,
         "gemm_us": 10.0, "untuned_us": 10.0, "added_us": 1.0, "tuned_us": None, "ok": True,
         "error": ""},
        {"backend": "cutlass", "dtype": "fp32", "M": 128, "N": 128, "K": 128, "wrapped_us": None,
         "gemm_us": None, "untuned_us": None, "added_us": None, "tuned_us": None, "ok": False,
         "error": "boom"},
    ]
    d = write(tmp_path, "overhead", rows)
    assert rt.render("overhead", d).split("\n")[:5] == [
        "| backend | dtype | shape | wrapped call µs | gemm() µs | added µs (quartiles) "
        "| tuned look-up µs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
        "| `cublas` | fp32 | 128³ | 5.0 | 7.3 | 2.2 (2.0-2.5) | 0.3 |",
        "| `cupy` | fp16 | 256×128×64 | 9.0 | 10.0 | 1.0 | - |",
        "| `cutlass` | fp32 | 128³ | FAIL | - | - | - |",
    ]


def test_overhead_table_splits_added_where_the_run_timed_the_bound_launch(tmp_path):
    rows = [
        {"backend": "cuda_mma", "dtype": "fp16", "M": 32, "N": 32, "K": 32, "wrapped_us": 7.04,
         "gemm_us": 9.26, "untuned_us": 9.2, "launch_us": 7.3, "added_us": 2.22,
         "added_iqr_us": [1.96, 2.54], "front_us": 1.94, "closure_us": 0.26, "tuned_us": 0.06,
         "ok": True, "error": ""},
        {"backend": "cutlass", "dtype": "fp32", "M": 32, "N": 32, "K": 32, "wrapped_us": None,
         "gemm_us": None, "untuned_us": None, "launch_us": None, "added_us": None,
         "front_us": None, "closure_us": None, "tuned_us": None, "ok": False, "error": "boom"},
    ]
    d = write(tmp_path, "overhead", rows)
    assert rt.render("overhead", d).split("\n")[:4] == [
        "| backend | dtype | shape | wrapped call µs | gemm() µs | added µs (quartiles) "
        "| front µs | launch − wrapped µs | tuned look-up µs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| `cuda_mma` | fp16 | 32³ | 7.0 | 9.3 | 2.2 (2.0-2.5) | 1.9 | 0.3 | 0.1 |",
        "| `cutlass` | fp32 | 32³ | FAIL | - | - | - | - | - |",
    ]


def test_overhead_runs_table_has_a_column_per_run_and_counts_the_runs_that_met(tmp_path):
    """One column per run, in run order (run-9 before run-10, numbers compared as numbers);
    the runs that met the target, of all and of those whose wrapped call ran within 1.3x
    that row's fastest (30.0 / 25.04 = 1.198 is at the fast speed, 32.6 / 25.04 = 1.302 not)."""
    def row(backend, added, wrapped, ok=True):
        return {"backend": backend, "dtype": "fp32", "M": 32, "N": 32, "K": 32, "ok": ok,
                "added_us": added, "wrapped_us": wrapped}

    write(tmp_path, "run-9", [row("cublas", 2.5, 25.04), row("cublaslt", 3.04, 11.0)])
    write(tmp_path, "run-10", [row("cublas", 3.25, 30.0), row("cublaslt", None, None, ok=False)],
          meta={**META, "git_commit": "fedcba9876543210"})
    write(tmp_path, "run-11", [row("cublas", 2.0, 32.6)])
    (tmp_path / "notes").mkdir()  # a folder without results.json is not a run
    lines = rt.render("overhead-runs", str(tmp_path)).split("\n")
    assert lines[:4] == [
        "| backend | dtype | run-9: added (wrapped) µs | run-10: added (wrapped) µs "
        "| run-11: added (wrapped) µs | added ≤ 3 µs | at the fast speed |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        "| `cublas` | fp32 | 2.50 (25.0) | 3.25 (30.0) | 2.00 (32.6) | 2 of 3 | 1 of 2 |",
        "| `cublaslt` | fp32 | 3.04 (11.0) | FAIL | - | 0 of 2 | 0 of 1 |",
    ]
    assert lines[5].startswith(f"Source: `{tmp_path}/run-9/results.json`, commit `0123456`")
    assert lines[6].startswith(f"Source: `{tmp_path}/run-10/results.json`, commit `fedcba9`")


def test_overhead_runs_table_reads_the_fast_speed_from_the_host_speed_when_timed(tmp_path):
    """Runs whose rows timed the host (``host_ns``): a row is at the fast speed when its
    host_ns is within 1.2x the table's fastest (44.0: 52.8 is, 52.9 and 75.0 are not),
    whatever its wrapped call took; the cells show the host's speed."""
    def row(backend, added, wrapped, host_ns):
        return {"backend": backend, "dtype": "fp32", "M": 32, "N": 32, "K": 32, "ok": True,
                "added_us": added, "wrapped_us": wrapped, "host_ns": host_ns}

    write(tmp_path, "run-1", [row("cublas", 2.5, 25.0, 44.0), row("cuda_naive", 1.5, 7.0, 52.8)])
    write(tmp_path, "run-2", [row("cublas", 2.9, 40.0, 52.8), row("cuda_naive", 3.1, 7.1, 52.9)])
    write(tmp_path, "run-3", [row("cublas", 4.0, 26.0, 75.0), row("cuda_naive", 2.0, 6.9, 44.5)])
    lines = rt.render("overhead-runs", str(tmp_path)).split("\n")
    assert lines[:4] == [
        "| backend | dtype | run-1: added µs (wrapped µs; host ns) "
        "| run-2: added µs (wrapped µs; host ns) | run-3: added µs (wrapped µs; host ns) "
        "| added ≤ 3 µs | at the fast speed |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        "| `cublas` | fp32 | 2.50 (25.0; 44) | 2.90 (40.0; 53) | 4.00 (26.0; 75) | 2 of 3 "
        "| 2 of 2 |",
        "| `cuda_naive` | fp32 | 1.50 (7.0; 53) | 3.10 (7.1; 53) | 2.00 (6.9; 44) | 2 of 3 "
        "| 2 of 2 |",
    ]


def test_overhead_runs_table_needs_runs(tmp_path):
    with pytest.raises(rt.TableError, match="no \\*/results.json under"):
        rt.render("overhead-runs", str(tmp_path))


def test_targets_table_takes_the_best_rung_the_least_shape_and_counts_the_runs(tmp_path):
    """Per run and target, the best hand-written rung's ratio to the best cuBLAS (cuBLAS rows
    and failed rows do not count), the least over the target's shapes, bold where it misses;
    a target a run did not time is "not run" and left out of the count."""
    def row(backend, shape, dtype, epilogue, pct, ok=True):
        return ladder_row(backend, dtype=dtype, epilogue=epilogue, shape=shape,
                          pct_best_cublas=pct, ok=ok)

    big, square = (8192, 8192, 8192), (4096, 4096, 4096)
    first = [row("cublas", big, "fp16", "none", 100.0),
             row("cuda_wgmma_persistent", big, "fp16", "none", 99.0),
             row("cuda_wgmma_cluster", big, "fp16", "none", 101.2),
             row("cuda_wgmma_pingpong", big, "fp16", "none", 130.0, ok=False),
             row("cuda_wgmma_persistent", big, "bf16", "none", 99.5),
             row("cuda_wgmma_persistent", square, "fp16", "none", 95.0),
             row("cuda_wgmma_persistent", (16384, 4096, 512), "fp16", "relu_c", 103.0),
             row("cuda_wgmma_persistent", (4096, 4096, 256), "fp16", "relu_c", 99.9)]
    second = [row("cuda_wgmma_persistent", big, "fp16", "none", 100.0),
              row("cuda_wgmma_persistent", big, "bf16", "none", 100.4)]
    one = write(tmp_path, "sweep-1", first,
                meta={**META, "command": "gemmlab bench --rounds 5 --out x"})
    two = write(tmp_path, "sweep-2", second, meta={**META, "declared_commit": "abcdef1",
                                                   "timing": {"warmup_ms": 1000.0}})
    lines = rt.render("targets", f"{one},{two}").split("\n")
    assert lines[0] == ("| run | 8192³ A @ B, ≥ 1.00x | 4096³ A @ B, ≥ 0.95x | 8192³ ReLU(A @ B + "
                        "C), ≥ 1.00x | 4096³ ReLU(A @ B + C), ≥ 1.00x | short K, ReLU(A @ B + "
                        "C), ≥ 1.00x |")
    assert lines[2:5] == [
        "| `sweep-1` (`0123456`, 5 rounds) | 1.012x fp16, **0.995x bf16** | 0.950x fp16 "
        "| not run | not run | **0.999x fp16** |",
        "| `sweep-2` (`abcdef1`, 1 round, 1000 ms warm-up) | 1.000x fp16, 1.004x bf16 | not run "
        "| not run | not run | not run |",
        "| met in | fp16 2 of 2, bf16 1 of 2 | fp16 1 of 1 | - | - | fp16 0 of 1 |"]
    assert lines[6].startswith(f"Source: `{one}/results.json`, commit `0123456`")
    assert lines[7].startswith(f"Source: `{two}/results.json`, declared commit `abcdef1`")


def test_targets_rounds_table_pools_the_rounds_of_the_runs(tmp_path):
    """Per target and dtype: the rung whose per-round ratios (to the faster cuBLAS of the same
    round, the least over the target's shapes) have the highest median, pooled over the
    runs; a failed row, and a run without per-round medians, are left out."""
    big = (8192, 8192, 8192)
    short = ((16384, 4096, 512), (4096, 4096, 256))

    def row(backend, rounds, shape=big, dtype="fp16", epilogue="relu_c", ok=True):
        return ladder_row(backend, dtype=dtype, epilogue=epilogue, shape=shape, ok=ok,
                          kernel_ms_rounds=rounds)

    first = [row("cublas", [1.0, 1.0, 1.0]), row("cublaslt", [2.0, 0.9, 1.0]),
             row("cuda_wgmma_persistent", [0.8, 1.0, 1.0]),  # 1.25, 0.9, 1.0
             row("cuda_wgmma_cluster", [2.0, 2.0, 2.0]),
             row("cuda_wgmma_pingpong", [0.1, 0.1, 0.1], ok=False),
             *(row("cublas", [1.0, 1.0], shape=s) for s in short),
             row("cuda_wgmma_cluster", [0.5, 1.0], shape=short[0]),  # 2.0, 1.0
             row("cuda_wgmma_cluster", [1.0, 2.0], shape=short[1])]  # 1.0, 0.5
    second = [row("cublas", [1.0, 1.0]), row("cuda_wgmma_persistent", [0.98, 1.1]),
              row("cuda_wgmma_cluster", [0.5, 0.5])]  # 1.0204..., 0.909...
    third = [ladder_row("cuda_wgmma_persistent", shape=big)]  # no per-round medians
    dirs = ",".join(write(tmp_path, name, rows) for name, rows in
                    (("one", first), ("two", second), ("three", third)))
    lines = rt.render("targets-rounds", dirs).split("\n")
    assert lines[0] == ("| target |  | dtype | rung | runs (rounds) | median round | rounds met "
                        "| run medians | runs met |")
    # The cluster rung wins 8192³ in run two (2.0 per round) but not in run one: pooled, step
    # 10's 1.25, 0.9, 1.0, 1.0204, 0.9091 (median 1.0) beat its 0.5, 0.45, 0.5, 2.0, 2.0.
    assert lines[2] == ("| 8192³ ReLU(A @ B + C) | ≥ 1.00x | fp16 | `cuda_wgmma_persistent` | "
                        "2 (5) | 1.000x | 3 of 5 | 0.965–1.000x | 1 of 2 |")
    # Short K: per round the lesser of the two shapes' ratios (1.0 then 1.0; 2.0 then 0.5).
    assert lines[3] == ("| short K, ReLU(A @ B + C) | ≥ 1.00x | fp16 | `cuda_wgmma_cluster` | "
                        "1 (2) | 0.750x | 1 of 2 | 0.750–0.750x | 0 of 1 |")
    assert len(lines) == 4
    with pytest.raises(rt.TableError, match="no per-round medians"):
        rt.render("targets-rounds", write(tmp_path, "none", third))


def test_ncu_table_has_a_row_per_kernel_in_the_order_given(tmp_path):
    """Rung and dtype from the folder's name, every profiled kernel of a run (a C++ kernel
    named without its template arguments), shared memory static + dynamic, then the runs'
    sources in the same order."""
    def kernel(name, us, tflops):
        return {"kernel": name, "duration_us": us, "sm_pct": 88.75, "dram_pct": 23.64,
                "achieved_occupancy_pct": 14.62, "registers": 168.0, "smem_static_bytes": 4.0,
                "smem_dynamic_bytes": 213184.0, "dram_read_bytes": 180_400_000.0,
                "tflops": tflops}

    dirs = [tmp_path / "cuda_wgmma_persistent-bf16", tmp_path / "cublas-fp32"]
    for directory, rows in zip(dirs, (
            [kernel("gemm_wgmma_persistent", 191.25, 718.46)],
            [kernel("sm80_xmma_gemm_f32f32", 2704.7, 50.8),
             kernel("void at::vectorized_elementwise_kernel<4, at::(anonymous)::f(int)>(int)",
                    32.4, 0.0)])):
        directory.mkdir()
        (directory / "results.json").write_text(json.dumps({"meta": META, "rows": rows}))
    lines = rt.render("ncu", ",".join(map(str, dirs))).split("\n")
    assert lines[0] == ("| rung, dtype | kernel | µs | SM % | DRAM % | achieved occupancy % | "
                        "regs | smem B | DRAM read MB | TFLOP/s |")
    assert lines[2:5] == [
        "| `cuda_wgmma_persistent` bf16 | `gemm_wgmma_persistent` | 191.2 | 88.8 | 23.6 | 14.6 "
        "| 168 | 213188 | 180 | 718.5 |",
        "| `cublas` fp32 | `sm80_xmma_gemm_f32f32` | 2704.7 | 88.8 | 23.6 | 14.6 | 168 | 213188 "
        "| 180 | 50.8 |",
        "| `cublas` fp32 | `at::vectorized_elementwise_kernel` | 32.4 | 88.8 | 23.6 | 14.6 | 168 "
        "| 213188 | 180 | 0.0 |"]
    assert lines[6].startswith(f"Source: `{dirs[0]}/results.json`, commit `0123456`")
    assert lines[7].startswith(f"Source: `{dirs[1]}/results.json`")


def test_train_table_measures_the_gap_to_the_reference_from_the_loss_curves(tmp_path):
    """GPUs = DP x TP; the gap and the steps before it first exceeds 1e-3 come from the two
    loss lists (all of them when it never does); a run without a reference leaves both blank."""
    def run(name, dp, tp, loss, reference=None):
        summary = {"configuration": f"DP {dp} x TP {tp}", "dtype": "fp32", "dp": dp, "tp": tp,
                   "ms_per_step": 26.574, "final_loss": loss[-1]}
        data = {"meta": META, "rows": [], "loss": loss, "summary": summary,
                "reference": reference and {"configuration": "DP 1 x TP 1", "loss": reference}}
        return write_json(tmp_path, name, data)

    one = [5.0, 4.0, 3.0, 2.7]
    dirs = [run("single", 1, 1, one), run("grid", 2, 2, [5.0, 4.0005, 3.002, 2.69], one),
            run("close", 1, 2, [5.0, 4.0, 3.0, 2.7008], one)]
    lines = rt.render("train", ",".join(dirs)).split("\n")
    assert lines[2:5] == ["| DP 1 x TP 1 | fp32 | 1 | 26.6 | 2.700 |  |  |",
                          "| DP 2 x TP 2 | fp32 | 4 | 26.6 | 2.690 | 0.010 | 2 |",
                          "| DP 1 x TP 2 | fp32 | 2 | 26.6 | 2.701 | 0.001 | 4 |"]
    assert lines[6].startswith(f"Source: `{dirs[0]}/results.json`, commit `0123456`")


def test_study_table_marks_fail_points(tmp_path):
    point = {"workload": "mlp", "mode": "strong", "backend": "cublas", "comm": "nccl", "P": 2,
             "ok": True, "tflops_per_gpu": 512.34, "step_ms": 1.2345, "comm_ms": 0.3877,
             "comm_share": 0.314, "speedup": 1.752, "efficiency": 0.876}
    d = write(tmp_path, "study", [point, {**point, "backend": "cuda_mma", "ok": False,
                                          "tflops_per_gpu": None, "step_ms": None},
                                  {**point, "backend": "cuda_wmma", "speedup": None,
                                   "efficiency": None}])  # its P = 1 row failed
    assert rt.render("study", d).split("\n")[:4] == [
        "| workload | mode | backend | comm | P | TFLOP/s per GPU | step ms | comm ms (alone) "
        "| comm share | speedup | efficiency |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| mlp | strong | `cublas` | nccl | 2 | 512.3 | 1.23 | 0.39 | 31% | 1.75 | 0.88 |",
        "| mlp | strong | `cuda_mma` | nccl | 2 | FAIL | - | - | - | - | - |",
    ]
    assert rt.render("study", d).split("\n")[4] == (
        "| mlp | strong | `cuda_wmma` | nccl | 2 | 512.3 | 1.23 | 0.39 | 31% | - | - |")


def test_stages_table(tmp_path):
    d = write(tmp_path, "stages", [
        {"stage": "DP 1 x TP 1, cpu", "dtype": "fp32", "ranks": 1, "steps": 200,
         "ms_per_step": 16.187, "tokens_per_s": 63257.04, "speedup": 1.0, "final_loss": 2.11849,
         "max_loss_diff": 0.0},
        {"stage": "DP 1 x TP 1, cuda", "dtype": "fp32", "ranks": 1, "steps": 200,
         "ms_per_step": 6.451, "tokens_per_s": 158660.2, "speedup": 2.5093,
         "final_loss": 2.1178, "max_loss_diff": 0.00199}])
    assert rt.render("stages", d).split("\n")[2:4] == [
        "| DP 1 x TP 1, cpu | fp32 | 1 | 200 | 16.19 | 63257 | 1.00x | 2.1185 | 0.00e+00 |",
        "| DP 1 x TP 1, cuda | fp32 | 1 | 200 | 6.45 | 158660 | 2.51x | 2.1178 | 1.99e-03 |",
    ]


def readme(ladder_dir, overhead_dir, ladder_body="old\n", overhead_body="old\n"):
    return (f"# Title\n\nintro\n<!-- gemmlab:table ladder {ladder_dir} -->\n{ladder_body}"
            f"<!-- /gemmlab:table -->\nmiddle\n<!-- gemmlab:table overhead {overhead_dir} -->"
            f"\n{overhead_body}<!-- /gemmlab:table -->\nend\n")


@pytest.fixture
def dirs(tmp_path):
    ladder = write(tmp_path, "ladder", LADDER_ROWS)
    overhead = write(tmp_path, "overhead", [
        {"backend": "cublas", "dtype": "fp32", "M": 128, "N": 128, "K": 128, "wrapped_us": 5.0,
         "gemm_us": 7.0, "untuned_us": 7.0, "added_us": 2.0, "tuned_us": 0.0, "ok": True,
         "error": ""}])
    return ladder, overhead


def test_update_replaces_only_region_content(dirs):
    ladder, overhead = dirs
    new, changed = rt.update(readme(ladder, overhead))
    assert changed == [f"ladder {ladder}", f"overhead {overhead}"]
    ladder_md, overhead_md = rt.render("ladder", ladder), rt.render("overhead", overhead)
    assert new == readme(ladder, overhead, ladder_md + "\n", overhead_md + "\n")
    assert rt.update(new) == (new, [])
    # Only the stale region is reported.
    assert rt.update(readme(ladder, overhead, ladder_md + "\n"))[1] == [f"overhead {overhead}"]


def test_check_and_regenerate(dirs, tmp_path, capsys):
    path = tmp_path / "README.md"
    path.write_text(readme(*dirs), encoding="utf-8")
    assert rt.main(["--check", str(path)]) == 1
    assert f"ladder {dirs[0]}" in capsys.readouterr().out
    assert path.read_text(encoding="utf-8") == readme(*dirs)  # --check changes nothing
    assert rt.main([str(path)]) == 0
    assert f"overhead {dirs[1]}" in capsys.readouterr().out
    assert rt.main(["--check", str(path)]) == 0


def test_unknown_kind_is_an_error(dirs, tmp_path, capsys):
    path = tmp_path / "README.md"
    path.write_text(f"<!-- gemmlab:table nope {dirs[0]} -->\n<!-- /gemmlab:table -->\n")
    assert rt.main(["--check", str(path)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and "nope" in out and out.count("\n") == 1


def test_missing_results_file_is_an_error(tmp_path, capsys):
    path = tmp_path / "README.md"
    path.write_text(f"<!-- gemmlab:table ladder {tmp_path / 'none'} -->\n"
                    "<!-- /gemmlab:table -->\n")
    assert rt.main([str(path)]) == 2
    assert capsys.readouterr().out.startswith("error: ")


def test_missing_closing_marker_is_an_error(dirs, tmp_path, capsys):
    ladder, overhead = dirs
    path = tmp_path / "README.md"
    # The unclosed ladder marker comes before a complete region: still an error.
    text = readme(ladder, overhead).replace("old\n<!-- /gemmlab:table -->\nmiddle", "old\n", 1)
    path.write_text(text)
    assert rt.main([str(path)]) == 2
    assert capsys.readouterr().out.startswith("error: ")
    assert path.read_text() == text


def test_an_error_in_one_file_writes_none(dirs, tmp_path, capsys):
    good, bad = tmp_path / "good.md", tmp_path / "bad.md"
    good.write_text(readme(*dirs), encoding="utf-8")
    bad.write_text(f"<!-- gemmlab:table nope {dirs[0]} -->\n<!-- /gemmlab:table -->\n")
    assert rt.main([str(good), str(bad)]) == 2
    assert capsys.readouterr().out.startswith("error: bad.md: ")
    assert good.read_text(encoding="utf-8") == readme(*dirs)
    bad.write_text(readme(*dirs), encoding="utf-8")
    assert rt.main([str(good), str(bad)]) == 0
    out = capsys.readouterr().out
    assert f"updated: ladder {dirs[0]} (good.md)" in out and "(bad.md)" in out
    assert rt.main(["--check", str(good), str(bad)]) == 0


@pytest.mark.parametrize("doc", rt.DOCS, ids=lambda path: path.name)
def test_the_readme_tables_are_generated_from_the_committed_results(doc):
    text = doc.read_text(encoding="utf-8")
    assert rt.OPEN.search(text), f"{doc.name} has no generated table"
    _, stale = rt.update(text)
    assert stale == [], f"run python3 -m bench.readme_tables: stale {stale}"


def test_the_readme_links_every_notebook_and_every_link_resolves():
    text = (rt.REPO / "README.md").read_text(encoding="utf-8")
    assert "<!-- gemmlab:table ladder bench/results/h200-ladder-fp16 -->" in text
    links = re.findall(r"\]\(([^)#]+)\)", text)
    for doc in rt.DOCS[1:]:
        assert doc.relative_to(rt.REPO).as_posix() in links
    missing = [link for link in links if not (rt.REPO / link).exists()]
    assert missing == []


def comm_row(backend, nbytes, timing="eager", op="all_reduce", ok=True, time_us=10.0,
             busbw=100.0):
    return {"backend": backend, "call_check": None, "op": op, "dtype": "bf16", "ranks": 2,
            "timing": timing, "bytes": nbytes, "ok": ok, "time_us": time_us if ok else None,
            "busbw": busbw if ok else None}


def test_comm_table_gives_time_for_small_sizes_and_busbw_for_large_ones(tmp_path):
    directory = write(tmp_path, "comm", [
        comm_row("nccl", 8 << 10, time_us=12.26), comm_row("nccl", 1 << 30, busbw=301.54),
        comm_row("symm", 8 << 10, "graph", time_us=8.31), comm_row("symm", 1 << 30, "graph",
                                                                    ok=False),
        comm_row("symm", 3000, busbw=1.0),  # a size outside the columns
        comm_row("nccl", 16 << 20, op="all_gather", busbw=150.0)])
    text = rt.render("comm", directory)
    assert ("**all_reduce**, 2 ranks, bf16: µs per call up to 1 MiB, busbw (GB/s) from 16 MiB"
            in text)
    assert "| communicator | 8 KiB µs | 1 GiB GB/s |" in text
    assert "| `nccl` | 12.3 | 301.5 |" in text
    assert "| `symm (graph)` | 8.3 | FAIL |" in text
    assert "| communicator | 16 MiB GB/s |\n| --- | ---: |\n| `nccl` | 150.0 |" in text
    assert text.endswith("command: `gemmlab bench --out x`.")


def test_tp_table_lists_the_blocks_then_the_overlap_rows(tmp_path):
    directory = write(tmp_path, "tp", [
        {"layer": "column", "phase": "forward", "tp": 2, "cuda_graph": False, "ok": True,
         "ms": 6.0},  # a single layer's row: not a block
        {"layer": "mlp", "phase": "forward+backward", "tp": 2, "cuda_graph": True, "ok": True,
         "ms": 41.234},
        {"layer": "sp mlp", "phase": "forward+backward", "tp": 2, "cuda_graph": False,
         "ok": False, "ms": None},
        {"layer": "sp row", "phase": "forward", "chunks": 4, "ok": True, "compute_ms": 5.0,
         "comm_ms": 1.0, "serial_ms": 6.0, "overlapped_ms": 5.25, "comm_hidden": 0.75},
        {"layer": "sp column", "phase": "forward", "chunks": 4, "ok": False,
         "compute_ms": None, "comm_ms": None, "serial_ms": None, "overlapped_ms": None,
         "comm_hidden": None}])
    text = rt.render("tp", directory)
    assert "| `mlp` | 2 | CUDA graph | 41.23 |\n| `sp mlp` | 2 | eager | FAIL |" in text
    assert "`column`" not in text
    assert "| `sp row` | forward | 4 | 5.00 | 1.00 | 6.00 | 5.25 | 75% |" in text
    assert "| `sp column` | forward | 4 | FAIL | - | - | - | - |" in text


def test_comm_table_reads_early_files_without_ok(tmp_path):
    early = [{k: v for k, v in comm_row("nccl", 8 << 10, time_us=9.0).items() if k != "ok"}
             | {"wrong": 0},
             {k: v for k, v in comm_row("mpi", 8 << 10).items() if k != "ok"} | {"wrong": 3}]
    text = rt.render("comm", write(tmp_path, "early", early))
    assert "| `nccl` | 9.0 |" in text and "| `mpi` | FAIL |" in text
