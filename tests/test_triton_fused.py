"""triton_fused against float64 on odd shapes: under the Triton interpreter on CI, compiled
and autotuned on a GPU."""

import pytest
import torch
import triton
from conftest import HAS_GPU, assert_matches_reference, pinned_triton_configs, random_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import gemm, triton_fused

DEVICE = "cuda" if HAS_GPU else "cpu"
ODD_SHAPES = [(1, 1, 1), (17, 33, 65), (127, 129, 3), (65, 31, 100)]


@pytest.mark.parametrize("dtype", triton_fused.DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", ODD_SHAPES)
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_odd_shapes(dtype, m, n, k, c_kind, activation, rng):
    a, b, c = random_inputs(m, n, k, dtype, DEVICE, c_kind, rng)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    gemm(a, b, c, activation=activation, backend="triton_fused", out=out)
    assert_matches_reference(out, a, b, c, activation)


@pytest.mark.parametrize("config", [
    triton_fused.INTERPRETER_CONFIG,
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2}, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1}, num_warps=2),
], ids=["interpreter", "wide", "tall"])
@pytest.mark.parametrize("k", [37, 96], ids=["masked-k", "even-k"])
def test_tile_shapes_and_group_orders(config, k, rng):
    """Tiles that do and do not divide M, N, K (K = 96: every BLOCK_K divides it, the unmasked
    EVEN_K loads); GROUP_M larger than the tile rows."""
    m, n = 70, 45
    a, b, c = random_inputs(m, n, k, torch.float32, DEVICE, "full", rng)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    triton_fused.run(a, b, c, True, False, out, config=config)
    assert_matches_reference(out, a, b, c, "relu")


def test_relu_keeps_nan_like_torch():
    a = torch.tensor([[float("nan"), 1.0]], device=DEVICE)
    b = torch.ones(2, 3, device=DEVICE)
    d = gemm(a, b, activation="relu", backend="triton_fused")
    assert torch.isnan(d).all()


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 90), n=st.integers(1, 90), k=st.integers(1, 90),
       c_kind=st.sampled_from(["full", "bias", None]), seed=st.integers(0, 2**31 - 1))
def test_random_shapes(m, n, k, c_kind, seed):
    gen = torch.Generator().manual_seed(seed)
    a, b, c = random_inputs(m, n, k, torch.float32, DEVICE, c_kind, gen)
    d = gemm(a, b, c, activation="relu", backend="triton_fused")
    assert_matches_reference(d, a, b, c, "relu")


@pytest.mark.gpu
@pytest.mark.autotune
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_autotuned_kernel(dtype, rng):
    """The real config list: every config that compiles is benchmarked, the pick is right."""
    m, n, k = 1000, 1031, 777
    a, b, c = random_inputs(m, n, k, dtype, "cuda", "full", rng)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    # tuned=False: the autotuner, whatever the tuned table holds for this GPU.
    gemm(a, b, c, activation="relu", backend="triton_fused", out=out, tuned=False)
    assert_matches_reference(out, a, b, c, "relu")
    assert "BLOCK_M" in triton_fused.last_config()
    # The real autotuner (the fixture leaves it alone here), and its pick from the dtype's list.
    assert triton_fused.tuned_kernel.configs == (triton_fused.CONFIGS_16BIT
                                                 + triton_fused.CONFIGS_FP32
                                                 + triton_fused.CONFIGS_TF32)
    own = triton_fused.CONFIGS_FP32 if dtype == torch.float32 else triton_fused.CONFIGS_16BIT
    assert any(triton_fused.last_config() == f"{c}; pointer kernel" for c in own)


@pytest.mark.parametrize("n,k", [(70, 45), (1, 33), (130, 1)])
def test_k_major_copies_b_exactly(n, k, rng):
    """The TF32 path's copy of B: the same values, K-major (strides (1, K)), from a row-major
    B and from a strided view alike."""
    b = torch.randn(k, 2 * n, generator=rng).to(DEVICE)[:, ::2]
    copy = triton_fused.k_major(b)
    assert copy.stride() == (1, k) and torch.equal(copy, b)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row-major", "K-major"])
def test_tf32_copies_an_n_major_b_k_major_first(layout, rng):
    """TF32 with a row-major B runs on a K-major copy (and says so); a K-major B is used as
    it is. Both match the reference at TF32's tolerance."""
    a, b, c = random_inputs(129, 70, 67, torch.float32, "cuda", "full", rng)
    if layout == "K-major":
        b = b.t().contiguous().t()
    d = gemm(a, b, c, activation="relu", backend="triton_fused", allow_tf32=True, tuned=False)
    assert_matches_reference(d, a, b, c, "relu", allow_tf32=True)
    copied = "B copied K-major first (TF32)" in triton_fused.last_config()
    assert copied == (layout == "row-major")


# (dtype, allow_tf32, the list the autotuner keeps for it)
OPERAND_TYPES = [(torch.float16, False, triton_fused.CONFIGS_16BIT),
                 (torch.bfloat16, False, triton_fused.CONFIGS_16BIT),
                 (torch.float32, True, triton_fused.CONFIGS_TF32),
                 (torch.float32, False, triton_fused.CONFIGS_FP32)]
OPERAND_IDS = ["fp16", "bf16", "tf32", "fp32"]


@pytest.mark.parametrize("dtype,tf32,own", OPERAND_TYPES, ids=OPERAND_IDS)
def test_the_pinned_configs_leave_one_of_the_dtypes_own_list(dtype, tf32, own):
    """The GPU tests' pinned autotuner (conftest ``one_triton_config``) holds one config of
    each real list; the autotuner's prune keeps exactly the one of the call's operand type."""
    pinned = pinned_triton_configs()
    args = {"a_ptr": torch.empty(1, 1, dtype=dtype), "INPUT_PRECISION": "tf32" if tf32 else "ieee"}
    kept = triton_fused._prune(pinned, args)
    assert len(kept) == 1 and any(kept[0] is c for c in own)
    by_name = triton_fused._prune(pinned, {"a_ptr": args["a_ptr"]},
                                  INPUT_PRECISION=args["INPUT_PRECISION"])
    assert by_name == kept


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tf32,own", OPERAND_TYPES, ids=OPERAND_IDS)
def test_gpu_tests_run_a_config_of_the_dtypes_own_list(dtype, tf32, own, rng):
    """Unmarked tests launch, through gemm()'s unchanged path, the pinned config of their
    operand type, not one config for every dtype."""
    (expected,) = [c for c in pinned_triton_configs() if any(c is o for o in own)]
    a, b, c = random_inputs(65, 33, 100, dtype, "cuda", "full", rng)
    d = gemm(a, b, c, activation="relu", backend="triton_fused", allow_tf32=tf32, tuned=False)
    assert_matches_reference(d, a, b, c, "relu", allow_tf32=tf32)
    copied = "; B copied K-major first (TF32)" if tf32 else ""  # a row-major B
    assert triton_fused.last_config() == f"{expected}; pointer kernel{copied}"


# --- the persistent TMA kernel (PERSISTENT=1 in a pinned config) -------------------------------

def persistent_config(bm, bn, bk, group_m, persistent=1):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
                          "PERSISTENT": persistent}, num_warps=4, num_stages=1)


PERSISTENT_CONFIGS = [persistent_config(16, 32, 16, 2), persistent_config(32, 16, 32, 1)]
# TMA needs compute capability 9.0; the interpreter runs the kernel on any machine.
TMA = not HAS_GPU or torch.cuda.get_device_capability()[0] >= triton_fused.TMA_MIN_CAPABILITY


def kernel_that_ran():
    return triton_fused.last_config().rsplit("; ", 1)[1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m,n,k", [(40, 72, 48), (70, 136, 40)])
@pytest.mark.parametrize("config", PERSISTENT_CONFIGS, ids=["16x32x16", "32x16x32"])
@pytest.mark.parametrize("c_kind", ["full", None])
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "linear"])
def test_persistent_kernel_on_odd_tma_aligned_shapes(dtype, m, n, k, config, c_kind, relu, rng):
    """M, N and K are multiples of 8 elements (16-byte rows) but not of the tiles (K: but for
    48 with BLOCK_K 16): the TMA loads read zeros past K and past the M/N edges, the stores
    are clipped there; several tiles per program under the interpreter."""
    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    assert m % bm and n % bn
    assert HAS_GPU or -(-m // bm) * -(-n // bn) > 2 * triton_fused.INTERPRETER_PROGRAMS
    a, b, c = random_inputs(m, n, k, dtype, DEVICE, c_kind, rng)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    triton_fused.run(a, b, c, relu, False, out, config=config)
    assert_matches_reference(out, a, b, c, "relu" if relu else None)
    if TMA:
        assert kernel_that_ran() == "persistent TMA kernel"
    else:
        assert "PERSISTENT fell back: compute capability" in kernel_that_ran()


def _misaligned(m, k, dtype, generator):
    """An (M, K) tensor whose data starts 2 elements past a 16-byte boundary."""
    flat = torch.randn(m * k + 2, generator=generator).to(device=DEVICE, dtype=dtype)
    return flat[2:].view(m, k)


@pytest.mark.parametrize("case,why", [
    ("odd-k", "a's row stride is 66 bytes, not a multiple of 16"),
    ("bias", "c is 1-D"),
    ("broadcast-c", "c is broadcast over rows (row stride 0)"),
    ("transposed-out", "out has last stride 40, not 1"),
    ("misaligned-a", "a's data is not 16-byte aligned"),
    ("transposed-b", "b has last stride 48, not 1"),
])
def test_persistent_falls_back_to_the_pointer_kernel(case, why, rng):
    """Calls TMA cannot address run the pointer kernel with the same tiles, and say why."""
    dtype, m, n = torch.float16, 40, 72
    k = 33 if case == "odd-k" else 48
    a, b, c = random_inputs(m, n, k, dtype, DEVICE, "bias" if case == "bias" else "full", rng)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    if case == "broadcast-c":
        c = c[0].expand(m, n)
    elif case == "transposed-out":
        out = torch.full((n, m), float("nan"), dtype=dtype, device=DEVICE).t()
    elif case == "misaligned-a":
        a = _misaligned(m, k, dtype, rng)
    elif case == "transposed-b":
        b = b.t().contiguous().t()
    triton_fused.run(a, b, c, True, False, out, config=PERSISTENT_CONFIGS[0])
    assert_matches_reference(out, a, b, c, "relu")
    assert triton_fused.last_config().startswith(str(PERSISTENT_CONFIGS[0]))
    expected = why if TMA else "compute capability"
    assert kernel_that_ran().startswith(f"pointer kernel (PERSISTENT fell back: {expected}")


def test_persistent_0_and_the_default_run_the_pointer_kernel(rng):
    a, b, c = random_inputs(40, 72, 48, torch.float32, DEVICE, "full", rng)
    out = torch.full((40, 72), float("nan"), device=DEVICE)
    triton_fused.run(a, b, c, True, False, out, config=persistent_config(16, 32, 16, 2, 0))
    assert_matches_reference(out, a, b, c, "relu")
    assert kernel_that_ran() == "pointer kernel"
    out.fill_(float("nan"))
    triton_fused.run(a, b, c, True, False, out)
    assert_matches_reference(out, a, b, c, "relu")
    assert kernel_that_ran() == "pointer kernel" and "BLOCK_M" in triton_fused.last_config()
