"""The tuner and the tuned table on the CPU (Triton interpreter, tiny shapes): search spaces and
their pruning, shape buckets, load/save/merge, lookup and why_not, gemm(tuned=True) pinning an
entry, and ``gemmlab tune`` end to end. Every test reads and writes a table under tmp_path
(through GEMMLAB_TUNED_FILE), never backends/tuned.json."""

import dataclasses
import io
import json
import re
import time

import pytest
import torch
from conftest import HAS_GPU, assert_matches_reference, random_inputs
from rich.console import Console

import backends
from backends import gemm, triton_fused, tuning
from backends.cuda import MAX_THREADS, CudaKernel, CudaSpace
from backends.problem import Problem
from backends.registry import CUDA_KERNELS
from bench import cli, tune

DEVICE = torch.device("cuda" if HAS_GPU else "cpu")
GPU = tuning.device_name(DEVICE)
H200_SMEM = 232448  # shared_memory_per_block_optin of an H200, bytes
interpreter_only = pytest.mark.skipif(HAS_GPU, reason="searches the interpreter's tiny space")


@pytest.fixture(autouse=True)
def table(tmp_path, monkeypatch):
    """The tuned table gemm() reads in this test: a file under tmp_path, not there yet."""
    path = tmp_path / "tuned.json"
    monkeypatch.setenv(tuning.ENV_VAR, str(path))
    tuning.reload()  # gemm() reads the variable when it binds, not per call
    yield path
    tuning.reload()


def entry(gpu="NVIDIA H200", backend="triton_fused", dtype="fp16", bucket=(4096, 4096, 4096),
          tflops=500.0, **config):
    config = config or {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
                        "num_warps": 8, "num_stages": 3}
    return {"gpu": gpu, "backend": backend, "dtype": dtype, "bucket": list(bucket),
            "config": config, "tflops": tflops, "ms": 0.25, "default_tflops": 450.0,
            "shape": list(bucket), "date": "2026-11-21T00:00:00+00:00", "git_commit": "abc"}


# A triton_fused table entry's config that no candidate of the interpreter's space has
# (GROUP_M 8), so a test can tell the table's entry from the candidates.
OUTSIDE_SPACE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4,
                 "num_stages": 1}


# --- search spaces ---------------------------------------------------------------------------

def smem_bytes(c, size):
    return (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * size * c["num_stages"]


@pytest.mark.parametrize("dtype_name,size,block_k", [("fp16", 2, {32, 64}), ("bf16", 2, {32, 64}),
                                                    ("tf32", 4, {32, 64}), ("fp32", 4, {16, 32})])
def test_triton_space_is_pruned_to_what_fits(dtype_name, size, block_k):
    space = triton_fused.candidates(dtype_name, H200_SMEM)
    assert {c["BLOCK_K"] for c in space} == block_k
    assert {c["BLOCK_M"] for c in space} == {c["BLOCK_N"] for c in space} == {64, 128, 256}
    assert {c["GROUP_M"] for c in space} == {4, 8}
    assert {c["num_warps"] for c in space} == {4, 8}
    assert {c["num_stages"] for c in space} == {2, 3, 4, 5}
    assert len({tuple(c.items()) for c in space}) == len(space)
    for c in space:
        assert smem_bytes(c, size) <= H200_SMEM
        assert c["BLOCK_M"] * c["BLOCK_N"] <= 128 * 32 * c["num_warps"]
    unpruned = 3 * 3 * 2 * 2 * 2 * 4
    no_smem_limit = triton_fused.candidates(dtype_name)
    assert len(space) < len(no_smem_limit) < unpruned
    assert {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": max(block_k), "GROUP_M": 8,
            "num_warps": 8, "num_stages": 2} not in no_smem_limit  # 256 accumulators/thread
    smaller = triton_fused.candidates(dtype_name, 64 * 1024)
    assert smaller and all(c in space for c in smaller) and len(smaller) < len(space)


@pytest.mark.parametrize("dtype_name,configs", [("fp16", triton_fused.CONFIGS_16BIT),
                                                ("fp32", triton_fused.CONFIGS_FP32)])
def test_triton_space_covers_the_autotuners_list(dtype_name, configs):
    """The default configuration is always a candidate, so tuning never has to lose to it."""
    space = triton_fused.candidates(dtype_name, H200_SMEM)
    for c in configs:
        assert {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} in space


def test_interpreter_space_is_tiny():
    space = triton_fused.candidates("fp32", interpreted=True)
    assert 1 < len(space) <= 8
    assert all(set(c) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages",
                          "PERSISTENT"} for c in space)
    assert {c["PERSISTENT"] for c in space} == {0, 1}  # both kernels, on the CPU too
    default = triton_fused.INTERPRETER_CONFIG  # what runs untuned, a candidate too
    assert {**default.kwargs, "num_warps": default.num_warps, "num_stages": default.num_stages,
            "PERSISTENT": 0} in space
    assert backends.BACKENDS["triton_fused"].search_space(
        "fp16", torch.device("cpu")) == triton_fused.candidates("fp16", interpreted=True)


def test_triton_tf32_space_leaves_out_the_persistent_kernel_it_never_runs():
    """TF32 runs on B K-major, which the TMA kernel does not take: PERSISTENT 1 would time
    the pointer kernel a second time under another name."""
    assert triton_fused.candidates("tf32", H200_SMEM, persistent=True) == \
        triton_fused.candidates("tf32", H200_SMEM)


@pytest.mark.parametrize("dtype_name,size", [("fp16", 2), ("fp32", 4)])
def test_triton_space_searches_the_persistent_kernel_where_it_runs(dtype_name, size):
    """persistent=True (compute capability 9.0+): PERSISTENT 0 is the pointer kernel's space
    as before; PERSISTENT 1 also needs shared memory for the epilogue's C and D halves."""
    pointer_only = triton_fused.candidates(dtype_name, H200_SMEM)
    space = triton_fused.candidates(dtype_name, H200_SMEM, persistent=True)
    assert all("PERSISTENT" not in c for c in pointer_only)
    assert [{**c, "PERSISTENT": 0} for c in pointer_only] == [
        c for c in space if c["PERSISTENT"] == 0]
    persistent = [c for c in space if c["PERSISTENT"] == 1]
    assert persistent and len(persistent) < len(pointer_only)
    for c in persistent:
        epilogue = 2 * c["BLOCK_M"] * (c["BLOCK_N"] // 2) * size
        assert smem_bytes(c, size) + epilogue <= H200_SMEM
        assert {**c, "PERSISTENT": 0} in space
    # Fits as the pointer kernel, not with the epilogue's buffers (fp16: 196608 + 65536 bytes)
    tight = {"BLOCK_M": 128, "BLOCK_N": 256, "GROUP_M": 8, "num_warps": 8, "num_stages": 4,
             "BLOCK_K": 64 if size == 2 else 32}
    assert {**tight, "PERSISTENT": 0} in space and {**tight, "PERSISTENT": 1} not in space
    configs = {"fp16": triton_fused.CONFIGS_16BIT, "fp32": triton_fused.CONFIGS_FP32}
    for c in configs.get(dtype_name, []):  # the autotuner's list stays a candidate
        assert {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages,
                "PERSISTENT": 0} in space


def cuda_space(name):
    """The search space of CUDA C backend ``name`` (the same for every dtype and device)."""
    return backends.BACKENDS[name].search_space("fp32", DEVICE)


def test_cuda_spaces_hold_the_registry_defaults_and_fit_a_block():
    regblock = cuda_space("cuda_regblock")
    assert len(regblock) == 2 * 2 * 2 * 2 * 2
    assert {c["TM"] for c in regblock} == {c["TN"] for c in regblock} == {4, 8}
    assert all(c["BLOCK_M"] == c["BLOCK_N"] == c["BLOCK_K"] for c in cuda_space("cuda_smem"))
    naive = cuda_space("cuda_naive")
    assert len(naive) < 4 * 4 and all(c["BLOCK_M"] * c["BLOCK_N"] <= 1024 for c in naive)
    searched = [name for name in CUDA_KERNELS if backends.BACKENDS[name].search_space]
    assert searched  # every rung with a space, whatever the ladder holds
    for name in searched:
        kernel, space = CUDA_KERNELS[name], cuda_space(name)
        assert kernel.params in space, name
        for dtype_name in ("fp32", "fp16", "bf16"):  # the same space for every dtype
            assert backends.BACKENDS[name].search_space(dtype_name, DEVICE) == space
        assert all(x * y <= MAX_THREADS for x, y in (CudaKernel("", "", c).threads
                                                     for c in space))


def test_cuda_space_derives_dependent_macros():
    space = CudaSpace({"BLOCK_M": (64, 128, 256), "WARP_M": (16, 32)},
                      lambda p: {"BLOCK_N": 128, "TM": 1, "TN": 1,
                                 "THREADS": 32 * (p["BLOCK_M"] // p["WARP_M"]) * 4})
    configs = space.candidates()
    assert {"BLOCK_M": 64, "WARP_M": 16, "BLOCK_N": 128, "TM": 1, "TN": 1,
            "THREADS": 512} in configs
    assert len(configs) == 5 and all(c["THREADS"] <= 1024 for c in configs)
    assert {"BLOCK_M": 256, "WARP_M": 16} not in [  # 16 x 4 warps: 2048 threads
        {"BLOCK_M": c["BLOCK_M"], "WARP_M": c["WARP_M"]} for c in configs]


def test_tunable_backends_are_the_ones_with_a_search_space_in_ladder_order():
    names = tune.tunable()
    assert names == [b.name for b in backends.LADDER if b.search_space is not None]
    assert all(backends.BACKENDS[name].pin is not None for name in names)  # entries pin
    assert {name for name, kernel in CUDA_KERNELS.items() if kernel.space} <= set(names)
    assert "triton_fused" in names
    assert "cublas" not in names and backends.BACKENDS["cublas"].pin is None


def test_bind_config_is_the_tuning_interface(rng):
    """A search-space config, checked the way the tuner checks one; a backend with nothing
    to tune refuses it."""
    a, b, c = random_inputs(40, 24, 32, device=DEVICE, generator=rng)
    problem = Problem.of(a, b, c, True)
    impl = backends.BACKENDS["triton_fused"]
    config = impl.search_space("fp32", DEVICE)[-1]
    out = torch.full((40, 24), float("nan"), device=DEVICE)
    impl.bind_config(problem, config, "a note")(a, b, c, out)
    assert_matches_reference(out, a, b, c, "relu")
    assert impl.config().endswith("(a note)") and f"BLOCK_M: {config['BLOCK_M']}" in impl.config()
    with pytest.raises(ValueError, match="PERSISTENT is 2, not 0 or 1"):
        impl.bind_config(problem, {**config, "PERSISTENT": 2}, "a note")
    with pytest.raises(ValueError, match="'cublas' has no configuration to set"):
        backends.BACKENDS["cublas"].bind_config(problem, None, "a note")


# --- the table -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,expected", [((1, 1, 1), (1, 1, 1)),
                                            ((1000, 1024, 1025), (1024, 1024, 2048)),
                                            ((127, 129, 65), (128, 256, 128))])
def test_bucket_rounds_each_size_up_to_a_power_of_two(shape, expected):
    assert tuning.bucket(*shape) == expected


def test_bucket_needs_positive_sizes():
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        tuning.bucket(0, 4, 4)


def test_save_replaces_the_entry_of_its_key(table):
    """Recorded TFLOP/s of different runs do not decide: the tuner compares in one run."""
    first, second = entry(tflops=600.0, BLOCK_M=1), entry(tflops=400.0, BLOCK_M=2)
    other_bucket = entry(bucket=(1024, 1024, 1024), tflops=100.0)
    assert tuning.save([first, other_bucket], table) == [other_bucket, first]
    assert tuning.save([second], table) == [other_bucket, second]
    assert json.loads(table.read_text()) == {"entries": [other_bucket, second]}
    assert tuning.load(table).get("triton_fused", "NVIDIA H200", "fp16", 4000, 4096,
                                  3000) == second
    assert [p.name for p in table.parent.iterdir()] == ["tuned.json"]  # no temporary left
    assert table.stat().st_mode & 0o777 == 0o644


def test_saving_another_key_keeps_the_entry_lookups_use_of_a_repeated_key(table):
    """A hand-edited file repeating a key: lookups take the fastest, and a save of an
    unrelated entry keeps that one (not the last in the file)."""
    fast, slow = entry(tflops=600.0, BLOCK_M=1), entry(tflops=300.0, BLOCK_M=2)
    table.write_text(json.dumps({"entries": [fast, slow]}))
    lookup = ("triton_fused", "NVIDIA H200", "fp16", 4096, 4096, 4096)
    assert tuning.load(table).get(*lookup) == fast
    tuning.save([entry(bucket=(1024, 1024, 1024), tflops=100.0)], table)
    assert tuning.load(table).get(*lookup) == fast


def test_save_rejects_a_malformed_entry(table):
    with pytest.raises(ValueError, match="bucket .* is not three powers of two"):
        tuning.save([entry(bucket=(1000, 1024, 1024))], table)
    assert not table.exists()


def test_a_missing_table_is_empty(table):
    loaded = tuning.load(table)
    assert not loaded.exists and loaded.entries == []


@pytest.mark.parametrize("text,problem", [
    ("{not json", "not JSON"),
    ("[]", "expected"),
    ('{"entries": {}}', "expected"),
    ('{"entries": [3]}', "entry 0: not an object"),
    (json.dumps({"entries": [{**entry(), "dtype": "fp8"}]}), "entry 0: dtype 'fp8'"),
    (json.dumps({"entries": [entry(), {**entry(), "config": None}]}), "entry 1: 'config'"),
    (json.dumps({"entries": [{**entry(), "bucket": [4096, 4096]}]}), "three powers of two"),
    (json.dumps({"entries": [entry(BLOCK_M="big")]}), "not an integer"),
    (json.dumps({"entries": [{**entry(), "shape": [4096, 4096, 1000]}]}), "not an M x N x K"),
    (json.dumps({"entries": [{**entry(), "shape": ["4096", 1, 1]}]}), "not an M x N x K"),
])
def test_a_malformed_table_is_a_clear_error_naming_the_file(table, text, problem):
    table.write_text(text)
    with pytest.raises(ValueError, match="malformed tuned table") as info:
        tuning.load(table)
    assert str(table) in str(info.value) and problem in str(info.value)


def test_load_reads_the_file_again_when_it_changes(table):
    tuning.save([entry()], table)
    first = tuning.load(table)
    assert tuning.load(table) is first  # unchanged: cached
    table.write_text(json.dumps({"entries": [entry(), entry(dtype="bf16")]}))
    assert len(tuning.load(table).entries) == 2


def test_lookup_and_why_not(table):
    def why(gpu="NVIDIA H200", backend="triton_fused", dtype="fp16", shape=(4096,) * 3):
        return tuning.why_not(backend, gpu, dtype, *shape)

    assert "no tuned table at" in why() and str(table) in why()
    found = entry()
    tuning.save([found, entry(bucket=(8192, 8192, 1024))], table)
    assert tuning.lookup("triton_fused", "NVIDIA H200", "fp16", 3000, 4096, 2049) == found
    assert why(shape=(3000, 4096, 2049)) is None
    assert "no entry for GPU 'NVIDIA A100' (it has 'NVIDIA H200')" in why(gpu="NVIDIA A100")
    assert "no cuda_regblock entry for NVIDIA H200" in why(backend="cuda_regblock")
    assert "no triton_fused fp32 entry for NVIDIA H200 (tuned dtypes: fp16)" in why(dtype="fp32")
    assert ("at shape bucket 1024x1024x1024 (M, N, K rounded up to powers of two; tuned "
            "buckets: 4096x4096x4096, 8192x8192x1024)") in why(shape=(1000, 1000, 1000))
    assert tuning.lookup("triton_fused", "NVIDIA H200", "fp16", 1000, 1000, 1000) is None


# --- gemm() with the table ---------------------------------------------------------------------

PINNED = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 2,
          "num_stages": 1}


@pytest.fixture
def launches(monkeypatch):
    """The ``config`` of every triton_fused launch, in order, as ``triton_fused.bind`` got it:
    None for the default configuration (the autotuner; the interpreter's fixed config)."""
    seen = []
    bind = triton_fused.bind

    def spy(p, config=None, **recording):
        launch = bind(p, config, **recording)

        def run(a, b, c, out):
            seen.append(config)
            return launch(a, b, c, out)

        return run

    monkeypatch.setattr(triton_fused, "bind", spy)
    return seen


def test_gemm_pins_the_tuned_config_of_the_shape_bucket(table, launches, rng):
    a, b, c = random_inputs(40, 20, 30, device=DEVICE, generator=rng)
    impl = backends.BACKENDS["triton_fused"]
    gemm(a, b, c, activation="relu", backend="triton_fused")
    assert launches[-1] is None
    assert "untuned: no tuned table at" in impl.config()

    tuning.save([entry(gpu=GPU, dtype="fp32", bucket=(64, 32, 32), **PINNED)], table)
    d = gemm(a, b, c, activation="relu", backend="triton_fused")  # sees the new file
    assert_matches_reference(d, a, b, c, "relu")
    config = launches[-1]
    # An entry without PERSISTENT (tuned before the persistent kernel): the pointer kernel.
    assert {**config.kwargs, "num_warps": config.num_warps,
            "num_stages": config.num_stages} == {**PINNED, "PERSISTENT": 0}
    assert "BLOCK_M: 16, BLOCK_N: 32" in impl.config()
    assert "; pointer kernel (tuned: " in impl.config()
    assert f"tuned: tuned.json entry for {GPU} fp32 bucket 64x32x32" in impl.config()

    a2, b2, c2 = random_inputs(70, 20, 30, device=DEVICE, generator=rng)  # bucket 128x32x32
    d = gemm(a2, b2, c2, activation="relu", backend="triton_fused")
    assert_matches_reference(d, a2, b2, c2, "relu")
    assert launches[-1] is None
    assert "untuned:" in impl.config() and "tuned buckets: 64x32x32" in impl.config()

    gemm(a, b, c, activation="relu", backend="triton_fused", tuned=False)
    assert launches[-1] is None and "tuned" not in impl.config()


def test_gemm_reports_an_entry_it_cannot_use(table, rng):
    tuning.save([entry(gpu=GPU, dtype="fp32", bucket=(8, 8, 8), BLOCK_M=16)], table)
    a, b, _ = random_inputs(8, 8, 8, device=DEVICE, generator=rng)
    with pytest.raises(ValueError, match="tuned.json: the triton_fused fp32 entry .* cannot use"):
        gemm(a, b, backend="triton_fused")
    gemm(a, b, backend="triton_fused", tuned=False)
    gemm(a, b, backend="cublas")  # backends with nothing to tune never read the table


def test_pin_carries_persistent_and_old_entries_default_to_the_pointer_kernel():
    pin = backends.BACKENDS["triton_fused"].pin
    assert pin(PINNED).kwargs["PERSISTENT"] == 0
    assert pin({**PINNED, "PERSISTENT": 1}).kwargs["PERSISTENT"] == 1
    with pytest.raises(ValueError, match="PERSISTENT is 2, not 0 or 1"):
        pin({**PINNED, "PERSISTENT": 2})
    committed = [e for e in tuning.load(tuning.DEFAULT_PATH).entries
                 if e["backend"] == "triton_fused"]
    assert committed  # backends/tuned.json's entries, tuned before PERSISTENT, stay valid
    for e in committed:
        config = pin(e["config"])
        assert config.kwargs["PERSISTENT"] == e["config"].get("PERSISTENT", 0)
        assert config.num_stages == e["config"]["num_stages"]


def test_gemm_runs_a_tuned_persistent_entry_or_says_why_it_fell_back(table, launches, rng):
    tuning.save([entry(gpu=GPU, dtype="fp32", bucket=(64, 128, 64), **PINNED, PERSISTENT=1)],
                table)
    impl = backends.BACKENDS["triton_fused"]
    a, b, c = random_inputs(40, 72, 48, device=DEVICE, generator=rng)
    out = torch.full((40, 72), float("nan"), device=DEVICE)
    gemm(a, b, c, activation="relu", backend="triton_fused", out=out)
    assert_matches_reference(out, a, b, c, "relu")
    assert launches[-1].kwargs["PERSISTENT"] == 1
    tma = not HAS_GPU or torch.cuda.get_device_capability()[0] >= triton_fused.TMA_MIN_CAPABILITY
    assert ("; persistent TMA kernel (tuned: tuned.json entry" in impl.config()) == tma

    a, b, bias = random_inputs(40, 72, 48, device=DEVICE, c_kind="bias", generator=rng)
    d = gemm(a, b, bias, activation="relu", backend="triton_fused")  # the same bucket
    assert_matches_reference(d, a, b, bias, "relu")
    assert launches[-1].kwargs["PERSISTENT"] == 1
    assert "; pointer kernel (PERSISTENT fell back: " in impl.config()
    assert ("fell back: c is 1-D) (tuned: tuned.json entry" in impl.config()) == tma


def test_notes_name_a_table_in_the_repository_by_its_repository_path():
    note = tuning.why_not("triton_fused", "no such GPU", "fp16", 64, 64, 64, tuning.DEFAULT_PATH)
    assert note.startswith("tuned table backends/tuned.json has no entry for GPU 'no such GPU'")


# --- run_tune and gemmlab tune ---------------------------------------------------------------

FAST = {"warmup_ms": 1, "rep_ms": 1, "min_reps": 1}
FLOP_40_24_32 = 2 * 40 * 24 * 32  # the tuned shape of the fake-clock tests


@interpreter_only
def test_run_tune_stores_a_checked_winner_that_gemm_then_uses(table, launches, monkeypatch, rng):
    # Candidates are timed for real; the default reports 1 s, so the best one is stored
    # whatever the noise of CPU times.
    monkeypatch.setattr(tune, "kernel_ms", _default_reports(1000.0, launches))
    monkeypatch.setenv("GEMMLAB_GIT_COMMIT", "0123abc")  # a copied tree's declared commit
    rows = tune.run_tune(["triton_fused"], [(40, 24, 32)], ["fp32"], DEVICE, budget_s=120,
                         out=table, **FAST)
    (row,) = rows
    assert row["tried"] == row["candidates"] == len(triton_fused.candidates("fp32",
                                                                           interpreted=True))
    assert row["failed"] == row["rejected"] == 0 and row["default_ok"] and row["stored"]
    stored = tuning.lookup("triton_fused", "cpu", "fp32", 40, 24, 32)
    assert stored["config"] == row["best_config"]
    assert stored["config"] in triton_fused.candidates("fp32", interpreted=True)
    assert stored["bucket"] == [64, 32, 32] and stored["shape"] == [40, 24, 32]
    assert stored["tflops"] == row["best_tflops"] > 0 and stored["ms"] == row["best_ms"]
    assert stored["default_tflops"] == row["default_tflops"] == 2 * 40 * 24 * 32 / 1e12
    assert stored["git_commit"] and stored["date"] and stored["declared_commit"] == "0123abc"

    a, b, c = random_inputs(33, 30, 17, device=DEVICE, generator=rng)  # the same bucket
    d = gemm(a, b, c, activation="relu", backend="triton_fused")
    assert_matches_reference(d, a, b, c, "relu")
    assert launches[-1].kwargs["BLOCK_M"] == stored["config"]["BLOCK_M"]


@interpreter_only
def test_run_tune_can_store_the_persistent_kernel_and_gemm_then_runs_it(table, launches,
                                                                        monkeypatch, rng):
    """The fake clock times what really ran: the persistent TMA kernel is the fastest."""
    def fake_kernel_ms(fn, device, **timing):
        fn()
        return 0.5 if triton_fused.last_config().endswith("persistent TMA kernel") else 2.0

    monkeypatch.setattr(tune, "kernel_ms", fake_kernel_ms)
    monkeypatch.delenv("GEMMLAB_GIT_COMMIT", raising=False)
    (row,) = tune.run_tune(["triton_fused"], [(40, 24, 32)], ["fp16"], DEVICE, out=table)
    assert row["tried"] == row["candidates"] == 8 and row["failed"] == row["rejected"] == 0
    assert row["default_ms"] == 2.0 and row["best_ms"] == 0.5 and row["stored"]
    assert row["default_tflops"] == pytest.approx(FLOP_40_24_32 / 2e-3 / 1e12)
    assert row["best_tflops"] == pytest.approx(FLOP_40_24_32 / 0.5e-3 / 1e12)
    assert "pointer kernel" in row["default_config"]
    stored = tuning.lookup("triton_fused", "cpu", "fp16", 40, 24, 32)
    assert stored["config"]["PERSISTENT"] == 1 and stored["config"] == row["best_config"]
    assert stored["tflops"] == pytest.approx(FLOP_40_24_32 / 0.5e-3 / 1e12)
    assert stored["default_tflops"] == pytest.approx(FLOP_40_24_32 / 2e-3 / 1e12)
    assert "declared_commit" not in stored  # no declared commit, no field

    a, b, c = random_inputs(48, 24, 24, torch.float16, DEVICE, generator=rng)  # same bucket
    out = torch.full((48, 24), float("nan"), dtype=torch.float16, device=DEVICE)
    gemm(a, b, c, activation="relu", backend="triton_fused", out=out)
    assert_matches_reference(out, a, b, c, "relu")
    assert launches[-1].kwargs["PERSISTENT"] == 1
    assert "persistent TMA kernel (tuned: " in backends.BACKENDS["triton_fused"].config()


@interpreter_only
@pytest.mark.parametrize("table_ms,replaced", [(1.5, True), (0.25, False)])
def test_the_tables_entry_is_timed_in_the_same_run(table, launches, monkeypatch, table_ms,
                                                   replaced):
    """The entry's recorded TFLOP/s (from another run) do not count; its time in this run
    does: a candidate replaces it only when faster here."""
    tuning.save([entry(gpu="cpu", dtype="fp32", bucket=(64, 32, 32), tflops=1e9,
                       **OUTSIDE_SPACE)], table)
    (old_entry,) = tuning.load(table).entries

    monkeypatch.setattr(tune, "kernel_ms", _entry_clock(launches, 2.0, table_ms, 1.0))
    (row,) = tune.run_tune(["triton_fused"], [(40, 24, 32)], ["fp32"], DEVICE, out=table)
    assert row["table_ms"] == table_ms and row["best_ms"] == 1.0
    assert row["table_tflops"] == pytest.approx(FLOP_40_24_32 / (table_ms * 1e-3) / 1e12)
    assert row["best_tflops"] == pytest.approx(FLOP_40_24_32 / 1e-3 / 1e12)
    assert row["stored"] is replaced
    (now,) = tuning.load(table).entries
    if replaced:
        assert now["config"] == row["best_config"] and now["ms"] == 1.0
    else:
        assert now == old_entry
        assert row["note"] == "the table's entry was faster in this run: kept"


@interpreter_only
def test_finalists_are_chosen_by_their_median_over_the_final_rounds(table, launches,
                                                                    monkeypatch):
    """A candidate that was fast once (a cool GPU while it was screened) but slow in the
    final rounds loses to one that is fast every time."""
    calls = {}

    def drifting_clock(fn, device, **timing):
        fn()
        config = launches[-1]
        if config is None:  # the default
            return 2.0
        key = tuple(config.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "PERSISTENT"))
        calls[key] = calls.get(key, 0) + 1
        if key == (16, 16, 0):
            return 0.5 if calls[key] == 1 else 3.0
        return 1.0 if key == (32, 32, 1) else 1.5

    monkeypatch.setattr(tune, "kernel_ms", drifting_clock)
    (row,) = tune.run_tune(["triton_fused"], [(40, 24, 32)], ["fp32"], DEVICE, out=table)
    assert calls[(16, 16, 0)] == 1 + tune.FINAL_ROUNDS  # it reached the final
    best = row["best_config"]
    assert (best["BLOCK_M"], best["BLOCK_N"], best["PERSISTENT"]) == (32, 32, 1)
    assert row["best_ms"] == 1.0 and row["default_ms"] == 2.0 and row["stored"]
    assert row["best_tflops"] == pytest.approx(FLOP_40_24_32 / 1e-3 / 1e12)


@interpreter_only
def test_a_spent_budget_starts_no_candidate(table):
    rows = tune.run_tune(["triton_fused"], [(16, 16, 16)], ["fp32", "fp16"], DEVICE, budget_s=0,
                         out=table, **FAST)
    assert [r["tried"] for r in rows] == [0, 0]
    assert all(r["note"] == "budget spent before this group started" for r in rows)
    assert not table.exists()


@interpreter_only
def test_a_budget_spent_mid_search_keeps_the_best_so_far(table, monkeypatch):
    def slow_kernel_ms(fn, device, **timing):  # each timing takes 0.6 s of the 1 s budget
        time.sleep(0.6)
        return 1.0

    monkeypatch.setattr(tune, "kernel_ms", slow_kernel_ms)
    (row,) = tune.run_tune(["triton_fused"], [(16, 16, 16)], ["fp32"], DEVICE, budget_s=1.0,
                           out=table)
    assert row["tried"] == 1 and row["note"] == "budget spent after 1 of 8 candidates"
    assert row["stored"]  # a tie with the default is stored
    assert tuning.lookup("triton_fused", "cpu", "fp32", 16, 16, 16)["config"] == row["best_config"]


@interpreter_only
def test_an_interrupted_run_keeps_the_groups_it_finished(table, monkeypatch):
    """Each group's winner is saved as soon as the group finishes: a Ctrl-C in the second
    group leaves the first group's entry in the table file."""
    monkeypatch.setattr(tune, "kernel_ms", lambda fn, device, **timing: 1.0)  # a tie is stored
    search, started = tune._search, []

    def interrupted(row, *args, **kwargs):
        started.append(row["dtype"])
        if len(started) == 2:
            raise KeyboardInterrupt
        return search(row, *args, **kwargs)

    monkeypatch.setattr(tune, "_search", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tune.run_tune(["triton_fused"], [(16, 16, 16)], ["fp32", "fp16"], DEVICE, out=table,
                      **FAST)
    assert started == ["fp32", "fp16"]
    (saved,) = json.loads(table.read_text())["entries"]
    assert (saved["gpu"], saved["backend"], saved["dtype"], saved["bucket"]) == (
        "cpu", "triton_fused", "fp32", [16, 16, 16])
    assert saved["config"] in triton_fused.candidates("fp32", interpreted=True)


@interpreter_only
def test_broken_and_wrong_candidates_are_never_timed_or_stored(table, monkeypatch):
    """(16, 16) does not launch, (16, 32) computes a wrong D, with either kernel (PERSISTENT 0
    and 1); the fake clock would make the wrong one the fastest if it were ever timed."""
    last = {}
    bind = triton_fused.bind

    def broken(p, config=None, **recording):
        tile = None if config is None else (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])
        if tile == (16, 16):
            raise RuntimeError("out of resources")
        launch = bind(p, config, **recording)

        def run(a, b, c, out):
            last["tile"] = tile
            launch(a, b, c, out)
            return out.mul_(1.01) if tile == (16, 32) else out
        return run

    timed = []

    def fake_kernel_ms(fn, device, **timing):
        fn()
        timed.append(last["tile"])
        return {None: 5.0, (16, 32): 0.1, (32, 16): 1.0}.get(last["tile"], 2.0)

    monkeypatch.setattr(triton_fused, "bind", broken)
    monkeypatch.setattr(tune, "kernel_ms", fake_kernel_ms)
    (row,) = tune.run_tune(["triton_fused"], [(48, 40, 24)], ["fp32"], DEVICE, out=table)
    assert row["tried"] == 8 and row["failed"] == 2 and row["rejected"] == 2
    assert "out of resources" in row["error"] or "relative error" in row["error"]
    # Screened once each (both kernels of each tile), then the default and the 3 fastest
    # (both (32, 16), one (32, 32)) timed again in 3 rounds.
    assert sorted(timed, key=str) == sorted([None] * 4 + [(32, 16)] * 8 + [(32, 32)] * 5,
                                            key=str)
    stored = tuning.lookup("triton_fused", "cpu", "fp32", 48, 40, 24)
    assert (stored["config"]["BLOCK_M"], stored["config"]["BLOCK_N"]) == (32, 16)
    assert stored["ms"] == 1.0 and stored["default_tflops"] == row["default_tflops"]


@interpreter_only
def test_nothing_is_stored_when_the_default_is_faster(table, launches, monkeypatch):
    monkeypatch.setattr(tune, "kernel_ms",
                        _default_reports(1.0, launches, lambda fn, device, **_: 2.0))
    (row,) = tune.run_tune(["triton_fused"], [(16, 16, 16)], ["fp32"], DEVICE, out=table)
    assert row["best_ms"] == 2.0 and row["default_ms"] == 1.0 and not row["stored"]
    assert row["note"] == "the default configuration was faster: not stored"
    assert not table.exists()


@interpreter_only
@pytest.mark.parametrize("table_ms,removed", [(1.5, True), (0.5, False)])
def test_a_table_entry_slower_than_the_default_is_removed(table, launches, monkeypatch,
                                                         table_ms, removed):
    """The default beats every candidate: the table's entry for the bucket, timed in the
    same run, is removed when it was slower than the default (the bucket then runs the
    default), and kept when it was faster still."""
    other = entry(gpu="cpu", dtype="fp32", bucket=(16, 16, 16), **OUTSIDE_SPACE)
    tuning.save([entry(gpu="cpu", dtype="fp32", bucket=(64, 32, 32), **OUTSIDE_SPACE), other],
                table)

    monkeypatch.setattr(tune, "kernel_ms", _entry_clock(launches, 1.0, table_ms, 2.0))
    (row,) = tune.run_tune(["triton_fused"], [(40, 24, 32)], ["fp32"], DEVICE, out=table)
    assert row["default_ms"] == 1.0 and row["table_ms"] == table_ms and not row["stored"]
    left = tuning.load(table)
    assert (left.get("triton_fused", "cpu", "fp32", 40, 24, 32) is None) is removed
    assert other in left.entries  # another bucket's entry is untouched
    if removed:
        assert row["note"] == ("the default configuration was faster: not stored, and the "
                               "table's entry for this bucket removed")
    else:
        assert row["note"] == "the default configuration was faster: not stored"


@interpreter_only
def test_the_defaults_own_configuration_is_never_stored(table, launches, monkeypatch):
    """A backend whose default is a configuration of its space (the CUDA C kernels): when
    that candidate wins, by a noise-sized margin over the default's own binding, the bucket
    already runs it: nothing is stored, and a table entry slower than the default goes."""
    from dataclasses import replace

    import backends

    space = backends.BACKENDS["triton_fused"].search_space("fp32", DEVICE)
    default = space[0]
    monkeypatch.setitem(backends.BACKENDS, "triton_fused",
                        replace(backends.BACKENDS["triton_fused"], default_config=default))
    tuning.save([entry(gpu="cpu", dtype="fp32", bucket=(64, 32, 32), **OUTSIDE_SPACE)], table)

    def clock(fn, device, **timing):
        fn()
        config = launches[-1]
        if config is None:
            return 1.0  # the default's own binding
        if config.kwargs["GROUP_M"] == 8:
            return 1.5  # the table's entry
        same = all(config.kwargs.get(k, v) == v for k, v in default.items()
                   if k not in ("num_warps", "num_stages"))
        return 0.99 if same else 2.0

    monkeypatch.setattr(tune, "kernel_ms", clock)
    (row,) = tune.run_tune(["triton_fused"], [(40, 24, 32)], ["fp32"], DEVICE, out=table)
    assert row["best_config"] == default and row["best_ms"] == 0.99 and not row["stored"]
    assert row["note"] == ("the best candidate is the default configuration: not stored, and "
                           "the table's entry for this bucket removed")
    assert tuning.load(table).get("triton_fused", "cpu", "fp32", 40, 24, 32) is None


def _entry_clock(launches, default_ms, table_ms, candidate_ms):
    """A clock for ``tune.kernel_ms``: ``default_ms`` when the default configuration ran (the
    latest of ``launches``, the fixture, is None), ``table_ms`` for the table's entry
    (``OUTSIDE_SPACE``, the only GROUP_M 8 config) and ``candidate_ms`` for every
    candidate."""
    def clock(fn, device, **timing):
        fn()
        config = launches[-1]
        if config is None:
            return default_ms
        return table_ms if config.kwargs["GROUP_M"] == 8 else candidate_ms

    return clock


def _default_reports(default_ms, launches, kernel_ms=tune.kernel_ms):
    """A clock for ``tune.kernel_ms`` that reports ``default_ms`` whenever the default
    configuration (Triton's autotuner; the interpreter's fixed config) is what ran (the
    latest of ``launches``, the fixture, is None), in the screening pass and in the final
    rounds alike, and ``kernel_ms`` for everything else."""
    def clock(fn, device, **timing):
        fn()
        if launches[-1] is None:
            return default_ms
        return kernel_ms(fn, device, **timing)
    return clock


def gemmlab_tune(*argv):
    args = cli.build_parser().parse_args(["tune", *argv])
    output = io.StringIO()
    code = cli.run(args, Console(file=output, width=200))
    return code, output.getvalue()


@interpreter_only
def test_gemmlab_tune_on_the_cpu(table, monkeypatch):
    monkeypatch.setattr(tune, "kernel_ms", lambda fn, device, **timing: 1.0)  # a tie is stored
    # A backend that pins tuned entries but has no search space is skipped, with the reason.
    unsearched = dataclasses.replace(backends.BACKENDS["cuda_smem"], search_space=None)
    monkeypatch.setattr(backends, "LADDER", tuple(unsearched if b.name == "cuda_smem" else b
                                                  for b in backends.LADDER))
    monkeypatch.setitem(backends.BACKENDS, "cuda_smem", unsearched)
    code, output = gemmlab_tune("--shape", "32", "--dtype", "fp32,bf16", "--budget", "120",
                                "--warmup-ms", "1", "--rep-ms", "1")
    assert code == 0, output
    assert output.startswith("No CUDA GPU found")
    assert "skipped cuda_regblock: no CUDA GPU" in output
    assert "skipped cuda_smem: no search space (Backend.search_space)" in output
    assert "1 of 1 groups stored in " + str(table) in output  # bf16: not in the interpreter
    assert tuning.lookup("triton_fused", "cpu", "fp32", 32, 32, 32) is not None


@pytest.mark.parametrize("argv,message", [
    (("--backend", "cublas"), "not tunable: cublas"),
    (("--dtype", "fp8"), "unknown or not tunable: fp8"),
    (("--shape", "4x4"), "is not N or MxNxK"),
])
def test_gemmlab_tune_rejects_bad_arguments(argv, message):
    code, output = gemmlab_tune(*argv)
    assert code == 2 and message in output


def test_gemmlab_tune_keeps_a_malformed_table(table):
    table.write_text("{")
    code, output = gemmlab_tune("--shape", "16", "--dtype", "fp32", "--out", str(table))
    assert code == 2 and "malformed tuned table" in output and table.read_text() == "{"



def test_a_directory_as_the_table_is_a_clear_error(table, rng):
    table.mkdir()
    with pytest.raises(ValueError, match=f"malformed tuned table {re.escape(str(table))}: a "
                                         f"directory"):
        tuning.load(table)
    a, b, _ = random_inputs(8, 8, 8, device=DEVICE, generator=rng)
    with pytest.raises(ValueError, match="a directory"):
        gemm(a, b, backend="triton_fused")


@pytest.mark.parametrize("field", ["BLOCK_M", "BLOCK_K", "num_warps"])
def test_a_zero_tile_in_an_entry_is_a_value_error_naming_file_and_field(table, rng, field):
    tuning.save([entry(gpu=GPU, dtype="fp32", bucket=(8, 8, 8), **{**PINNED, field: 0})],
                table)
    a, b, _ = random_inputs(8, 8, 8, device=DEVICE, generator=rng)
    with pytest.raises(ValueError, match=f"{re.escape(str(table))}: the triton_fused fp32 "
                                         f"entry .*{field} is 0, not a positive integer"):
        gemm(a, b, backend="triton_fused")


def test_cuda_pins_refuse_tiles_that_are_not_positive():
    pin = backends.BACKENDS["cuda_regblock"].pin
    good = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 8, "TM": 4, "TN": 4}
    assert pin(good).params == good
    for bad in (0, -8, True):
        with pytest.raises(ValueError, match=f"BLOCK_M is {bad!r}, not a positive integer"):
            pin({**good, "BLOCK_M": bad})


def test_cuda_pins_take_a_switch_at_0_but_no_tile_at_0():
    """STREAM_K, whose search values include 0, may be 0 (the tuned entries of the default
    build hold it) but not negative; a tile size may not be 0."""
    pin = backends.BACKENDS["cuda_wgmma_persistent"].pin
    good = dict(CUDA_KERNELS["cuda_wgmma_persistent"].params)
    assert good["STREAM_K"] == 0 and pin(good).params == good
    assert pin({**good, "STREAM_K": 1}).params["STREAM_K"] == 1
    with pytest.raises(ValueError, match="STREAM_K is -1, not a non-negative integer"):
        pin({**good, "STREAM_K": -1})
    with pytest.raises(ValueError, match="GROUP_M is 0, not a positive integer"):
        pin({**good, "GROUP_M": 0})
    assert pin({**good, "C_LEAD": 0}).params["C_LEAD"] == 0


def test_cuda_pins_keep_the_rungs_default_for_a_macro_the_entry_lacks():
    """An entry tuned before a macro joined its rung (``C_LEAD``) runs that macro's registry
    default, the entry's own values for the rest."""
    kernel = CUDA_KERNELS["cuda_wgmma_cluster"]
    old = {key: value for key, value in kernel.params.items() if key != "C_LEAD"}
    pinned = backends.BACKENDS["cuda_wgmma_cluster"].pin({**old, "GROUP_M": 16})
    assert pinned.params == {**kernel.params, "GROUP_M": 16}
    assert pinned.params["C_LEAD"] == kernel.params["C_LEAD"] > 0
