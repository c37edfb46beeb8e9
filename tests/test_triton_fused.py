"""triton_fused against float64 on odd shapes: under the Triton interpreter on CI, compiled
and autotuned on a GPU."""

import pytest
import torch
import triton
from conftest import HAS_GPU, assert_matches_reference, random_inputs
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
    gemm(a, b, c, activation="relu", backend="triton_fused", out=out)
    assert_matches_reference(out, a, b, c, "relu")
    assert "BLOCK_M" in triton_fused.last_config()
