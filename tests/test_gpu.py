"""Every backend on a real GPU: odd shapes and edge cases against float64, stream order,
IEEE fp32 by default, and the limits that raise before a launch. Marked ``gpu``."""

import pytest
import torch
from conftest import HAS_GPU, assert_matches_reference, random_inputs
from test_exact import RECIPES, assert_exact, exact_inputs

import backends
from backends import gemm, tuning
from backends.cuda import pycuda_unavailable_reason, use_launcher
from backends.cuda.resources import resources
from backends.registry import CUDA_KERNELS

pytestmark = pytest.mark.gpu
SHAPES = [(1, 1, 1), (17, 33, 65), (127, 129, 3), (3, 1025, 7), (257, 1, 513),
          (1000, 17, 129), (1031, 1029, 1027)]
# torch_compile compiles (max-autotune) once per problem: its own, smaller set below.
CASES = [(b.name, dtype) for b in backends.LADDER for dtype in b.dtypes
         if b.name != "torch_compile"] if HAS_GPU else []


@pytest.mark.parametrize("backend,dtype", CASES, ids=[f"{b}-{str(d)[6:]}" for b, d in CASES])
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
def test_every_backend_on_odd_shapes(backend, dtype, m, n, k, c_kind, rng):
    a, b, c = random_inputs(m, n, k, dtype, "cuda", c_kind, rng)
    for activation in (None, "relu"):
        out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
        gemm(a, b, c, activation=activation, backend=backend, out=out)
        assert_matches_reference(out, a, b, c, activation)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(17, 33, 65), (1031, 1029, 1027)])
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
def test_torch_compile_on_odd_shapes(dtype, m, n, k, c_kind, rng):
    a, b, c = random_inputs(m, n, k, dtype, "cuda", c_kind, rng)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    gemm(a, b, c, activation="relu", backend="torch_compile", out=out)
    assert_matches_reference(out, a, b, c, "relu")
    assert "compiled in" in backends.BACKENDS["torch_compile"].config()


@pytest.mark.parametrize("backend", ["cuda_wgmma_persistent", "cuda_wgmma_cluster",
                                     "cuda_wgmma_pingpong"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,aligned_out,aligned_c", [
    (4104, True, True), (4104, False, True), (4100, True, True), (4104, True, False),
    (4296, True, True)],
    ids=["bulk-store", "misaligned-out", "n-not-multiple-of-8", "misaligned-c",
         "n-edge-in-second-half"])
@pytest.mark.parametrize("c_kind", ["full", "bias"])
@pytest.mark.parametrize("stages", [None, 4], ids=["default-stages", "four-stages"])
def test_persistent_wgmma_loops_over_more_tiles_than_sms(backend, dtype, n, aligned_out,
                                                          aligned_c, c_kind, stages, rng,
                                                          tmp_path, monkeypatch):
    """17 x 17 = 289 tiles (33 x 17 of 64 rows when the warpgroups take turns) on at most
    132 CTAs, so each loops over several (taking turns, each warpgroup every other one),
    with a ragged M and K edge: D leaves through the staging tile and TMA stores (N % 8 ==
    0, 16-byte aligned D) or, when it cannot, by stores from registers (an ``out`` one
    element into its buffer; N = 4100); a full C is prefetched by the TMA, or read from
    global memory when it starts 2 bytes off (and a bias always). With 2-CTA clusters the
    odd number of tile rows leaves the last cluster tiles a second CTA past M. The staging
    tile's passes per tile, the later passes' C read into registers: steps 10/11 one by
    default (3 stages), two with 4 stages (a tuned entry for the shape's bucket; N = 4296:
    the last tile column's edge lies in the second half; N = 4104: past its first half);
    step 12 four 64-column passes by default (5 stages), one with 4."""
    m, k = 2050, 200
    if stages is not None:
        _pin(backend, dtype, (m, n, k), {"STAGES": stages}, tmp_path, monkeypatch)
    a, b, c = random_inputs(m, n, k, dtype, "cuda", c_kind, rng)
    if not aligned_c:
        c = torch.cat([c.new_zeros(1), c.reshape(-1)])[1:].view(c.shape)
    buffer = torch.full((m * n + 1,), float("nan"), dtype=dtype, device="cuda")
    out = (buffer[:m * n] if aligned_out else buffer[1:]).view(m, n)
    try:
        for activation in (None, "relu"):
            out.fill_(float("nan"))
            gemm(a, b, c, activation=activation, backend=backend, out=out)
            assert_matches_reference(out, a, b, c, activation)
            if stages is not None:
                assert f"-DSTAGES={stages}" in backends.BACKENDS[backend].config()
    finally:
        tuning.reload()  # the next test reads its own table


def _pin(backend, dtype, shape, params, tmp_path, monkeypatch):
    """gemm() runs ``backend``'s default build with ``params`` changed for the bucket of
    ``shape`` (M, N, K) in ``dtype``: a tuned table of that one entry. The caller calls
    ``tuning.reload()`` when done, so that the next test reads its own table."""
    config = {**CUDA_KERNELS[backend].params, **params}
    path = tmp_path / "tuned.json"
    tuning.save([{"gpu": tuning.device_name(torch.device("cuda")), "backend": backend,
                  "dtype": tuning.dtype_name(dtype), "bucket": list(tuning.bucket(*shape)),
                  "config": config, "tflops": 1.0, "ms": 1.0, "default_tflops": 1.0,
                  "shape": list(shape), "date": "2026-11-24T00:00:00+00:00",
                  "git_commit": "test"}], path)
    monkeypatch.setenv(tuning.ENV_VAR, str(path))
    tuning.reload()


# Stream-K on the H200's (and H100's) 132 SMs, 128 x 256 tiles: the whole rounds, then the
# leftover tiles' k-tiles cut into 132 ranges (or as many as there are k-tiles, if fewer).
STREAM_K_SHAPES = [
    (2048, 4096, 520),    # 256 tiles: 124 left over, 9 k-tiles each; ranges of 8-9 k-tiles
    (2050, 4104, 200),    # ragged M, N, K: 289 tiles, 25 left over, 4 k-tiles each: 100 ranges
    (256, 512, 999),      # 4 tiles, none whole: 64 ranges of one k-tile, 16 parts per tile
    (130, 300, 4000),     # 4 tiles of 63 k-tiles: 132 ranges, ~33 parts per tile
    (4096, 4096, 64),     # 512 tiles of one k-tile: no tile is split
    (1024, 1024, 8192)]   # 32 tiles of 128 k-tiles: 4-5 parts per tile


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k", STREAM_K_SHAPES)
@pytest.mark.parametrize("c_kind,aligned_out", [("full", True), ("bias", True),
                                                ("full", False), (None, True)],
                         ids=["full-c", "bias", "misaligned-out", "no-c"])
def test_stream_k_shares_the_leftover_tiles_right(dtype, m, n, k, c_kind, aligned_out, rng,
                                                   tmp_path, monkeypatch):
    """Step 10 built with STREAM_K: whatever the split (parts of one k-tile or dozens, many
    CTAs on one tile, CTAs with no range, tiles never split), every D element is checked
    against float64, D poisoned first; D leaves through the TMA or, one element into its
    buffer, from registers."""
    _pin("cuda_wgmma_persistent", dtype, (m, n, k), {"STREAM_K": 1}, tmp_path, monkeypatch)
    a, b, c = random_inputs(m, n, k, dtype, "cuda", c_kind, rng)
    buffer = torch.full((m * n + 1,), float("nan"), dtype=dtype, device="cuda")
    out = (buffer[:m * n] if aligned_out else buffer[1:]).view(m, n)
    try:
        for activation in (None, "relu"):
            out.fill_(float("nan"))
            gemm(a, b, c, activation=activation, backend="cuda_wgmma_persistent", out=out)
            assert_matches_reference(out, a, b, c, activation)
        assert "-DSTREAM_K=1" in backends.BACKENDS["cuda_wgmma_persistent"].config()
    finally:
        tuning.reload()


@pytest.mark.parametrize("recipe", [RECIPES[1], RECIPES[3]], ids=lambda r: r.id)
@pytest.mark.parametrize("m,n", [(2048, 4096), (2050, 4104), (256, 512)])
def test_stream_k_is_exact(recipe, m, n, rng, tmp_path, monkeypatch):
    """Small-integer inputs (``test_exact``) make every partial sum exact in any order: D
    split into parts and added back equals float64 bit for bit, so one k-tile lost or added
    twice fails."""
    _pin("cuda_wgmma_persistent", recipe.dtype, (m, n, recipe.k), {"STREAM_K": 1}, tmp_path,
         monkeypatch)
    a, b, c = exact_inputs(m, n, recipe, "cuda", "full", rng)
    try:
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device="cuda")
        gemm(a, b, c, activation="relu", backend="cuda_wgmma_persistent", out=out)
        assert_exact(out, a, b, c, "relu")
        assert "-DSTREAM_K=1" in backends.BACKENDS["cuda_wgmma_persistent"].config()
    finally:
        tuning.reload()


def test_stream_k_replays_in_a_cuda_graph_with_fresh_inputs(rng, tmp_path, monkeypatch):
    """A captured STREAM_K launch replays its token: each replay must find the flags the
    previous one consumed reset, and wait for this replay's partial accumulators (a stale
    flag would let a tile's first part add last replay's). Fresh inputs per replay, each D
    checked."""
    m, n, k = 2048, 4096, 1032
    _pin("cuda_wgmma_persistent", torch.bfloat16, (m, n, k), {"STREAM_K": 1}, tmp_path,
         monkeypatch)
    a, b, c = random_inputs(m, n, k, torch.bfloat16, "cuda", "full", rng)
    try:
        gemm(a, b, c, activation="relu", backend="cuda_wgmma_persistent")  # binds, compiles
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            d = gemm(a, b, c, activation="relu", backend="cuda_wgmma_persistent")
        for _ in range(4):
            for t, fresh in zip((a, b, c), random_inputs(m, n, k, torch.bfloat16, "cuda",
                                                          "full", rng)):
                t.copy_(fresh)
            d.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_matches_reference(d, a, b, c, "relu")
        assert "-DSTREAM_K=1" in backends.BACKENDS["cuda_wgmma_persistent"].config()
    finally:
        tuning.reload()


@pytest.mark.parametrize("backend", ["cuda_mma", "cuda_wgmma", "cuda_wgmma_persistent",
                                     "cuda_wgmma_cluster", "cuda_wgmma_pingpong"])
def test_an_out_one_element_into_its_buffer_is_written_right(backend, rng):
    """A 16-bit ``out`` 2 bytes past a 4-byte boundary: the kernels that store D in 4-byte
    pairs store element by element instead of faulting on a misaligned address."""
    m, n, k = 129, 130, 70
    a, b, c = random_inputs(m, n, k, torch.float16, "cuda", "full", rng)
    buffer = torch.full((m * n + 1,), float("nan"), dtype=torch.float16, device="cuda")
    out = buffer[1:].view(m, n)
    gemm(a, b, c, activation="relu", backend=backend, out=out)
    assert_matches_reference(out, a, b, c, "relu")


@pytest.mark.parametrize("backend", [b.name for b in backends.LADDER])
def test_every_backend_is_captured_in_a_cuda_graph_and_replays_right(backend, rng):
    """Kernel times come from CUDA-graph replay: every backend must capture (not fall back to
    eager) and its replayed D must pass the float64 check."""
    from bench.timing import kernel_samples

    dtype = backends.BACKENDS[backend].dtypes[0]
    a, b, c = random_inputs(1000, 1032, 520, dtype, "cuda", "full", rng)
    ref = backends.reference(a, b, c, "relu")

    def verify(d):
        err = backends.relative_error(d, ref)
        return None if err <= backends.TOLERANCES["fp16"] else f"relative error {err:.2e}"

    samples, how = kernel_samples(
        lambda: gemm(a, b, c, activation="relu", backend=backend), torch.device("cuda"),
        warmup_ms=1, rep_ms=5, min_reps=10, verify=verify)
    assert how == "graph" and len(samples) >= 10 and min(samples) > 0


@pytest.mark.parametrize("name", [n for n, kernel in CUDA_KERNELS.items() if kernel.tma])
@pytest.mark.parametrize("k,warm", [(128, True), (128, False), (100, True)])
def test_a_captured_tma_rung_replays_its_own_maps_after_other_calls(name, k, warm, rng):
    """A TMA rung's tensor maps of A and B sit in a device buffer its binding caches for a
    few address pairs. A graph captured with one (cached before the capture, encoded during
    it, or for operands padded to 16-byte rows: K = 100) must replay right after enough
    other calls to evict it, with the operands refilled in place."""
    a, b, _ = random_inputs(256, 256, k, torch.float16, "cuda", None, rng)
    if warm:
        gemm(a, b, backend=name)
    else:  # binds the signature on other tensors: A's and B's maps are new to the capture
        gemm(*random_inputs(256, 256, k, torch.float16, "cuda", None, rng)[:2], backend=name)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        d = gemm(a, b, backend=name)
    others = [random_inputs(256, 256, k, torch.float16, "cuda", None, rng)[:2]
              for _ in range(12)]  # kept alive: 12 address pairs, more than the 8 cached
    for x, y in others:
        gemm(x, y, backend=name)
    for t, fresh in zip((a, b), random_inputs(256, 256, k, torch.float16, "cuda", None, rng)):
        t.copy_(fresh)
    d.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(d, a, b, None, None)


@pytest.mark.parametrize("name", [n for n, kernel in CUDA_KERNELS.items() if kernel.tma])
def test_tma_rungs_take_one_row_operands_of_any_row_stride(name):
    """torch calls a (1, n) view with strides (1, 1) (a transposed column) contiguous; a
    tensor map cannot take its 2-byte row stride: it is copied to a row-major one first. As
    A with M = 1, and as B with K = 1."""
    column = torch.randn(64, 1, device="cuda").half()
    pairs = [(column.t(), torch.randn(64, 72, device="cuda").half()),
             (torch.randn(72, 1, device="cuda").half(), column.t())]
    for a, b in pairs:
        assert a.stride() == (1, 1) or b.stride() == (1, 1)
        assert_matches_reference(gemm(a, b, backend=name), a, b, None, None)


@pytest.mark.parametrize("backend", [b.name for b in backends.LADDER])
@pytest.mark.parametrize("c_kind", ["full", "bias"])
def test_a_bound_signature_reads_each_calls_operands(backend, c_kind, rng):
    """gemm() binds a signature once (cublaslt also sets its bias pointer only when it
    changes): new tensors of that signature, and the same tensors rewritten in place, must
    each give their own D."""
    dtype = backends.BACKENDS[backend].dtypes[0]
    first = random_inputs(96, 80, 48, dtype, "cuda", c_kind, rng)
    second = random_inputs(96, 80, 48, dtype, "cuda", c_kind, rng)
    for a, b, c in (first, second, first):
        assert_matches_reference(gemm(a, b, c, activation="relu", backend=backend),
                                 a, b, c, "relu")
    a, b, c = first
    for t in first:
        t.copy_(torch.randn_like(t))
    assert_matches_reference(gemm(a, b, c, activation="relu", backend=backend), a, b, c, "relu")


@pytest.mark.parametrize("backend", [b.name for b in backends.LADDER])
def test_one_binding_called_from_several_threads_gives_each_its_own_d(backend, rng):
    """Threads calling one bound signature at once must each get the D of their own operands
    (the CUDA C launches keep an argument buffer per thread, cublaslt sets a bias pointer per
    plan). Each thread's first CUDA work is a gemm() call: the launches through the driver API
    must bind the device's context themselves, and Triton's kernel must be loaded already."""
    from concurrent.futures import ThreadPoolExecutor

    dtype = backends.BACKENDS[backend].dtypes[0]
    problems = [random_inputs(96, 80, 48, dtype, "cuda", "bias", rng) for _ in range(4)]
    gemm(*problems[0], activation="relu", backend=backend)  # binds the signature

    def run(operands):
        a, b, c = operands
        ds = [gemm(a, b, c, activation="relu", backend=backend) for _ in range(50)]
        torch.cuda.synchronize()
        return ds

    with ThreadPoolExecutor(len(problems)) as pool:
        results = list(pool.map(run, problems))
    for (a, b, c), ds in zip(problems, results):
        for d in (ds[0], ds[-1]):
            assert_matches_reference(d, a, b, c, "relu")


def test_cublaslt_graph_replays_after_its_binding_is_dropped(rng):
    """A captured cuBLASLt call keeps what it reads (the algorithm was copied into the graph,
    the workspace stays with its stream): dropping gemm()'s bindings, and with them the plan's
    descriptors, must not disturb the replay or the GEMMs after it."""
    import gc

    from backends import api

    a, b, c = random_inputs(96, 80, 48, torch.float16, "cuda", "bias", rng)
    gemm(a, b, c, activation="relu", backend="cublaslt")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = gemm(a, b, c, activation="relu", backend="cublaslt")
    api._PLANS.clear()
    gc.collect()
    d.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(d, a, b, c, "relu")
    x, y, z = random_inputs(65, 67, 69, torch.float16, "cuda", "bias", rng)
    assert_matches_reference(gemm(x, y, z, activation="relu", backend="cublaslt"),
                             x, y, z, "relu")


@pytest.mark.parametrize("backend", [b.name for b in backends.LADDER])
def test_launches_follow_torchs_current_stream(backend, rng):
    """Inputs written by a long copy on a side stream must be seen by the GEMM queued after
    it on that stream: a launch on another stream would race and read stale data."""
    m = n = k = 2048
    dtype = backends.BACKENDS[backend].dtypes[0]
    a, b, c = random_inputs(m, n, k, dtype, "cuda", "full", rng)
    big = torch.randn(64 << 20, device="cuda")
    a_stale = torch.zeros_like(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(4):
            big.mul_(1.0)  # keeps the stream busy for a while
        a_stale.copy_(a)
        d = gemm(a_stale, b, c, activation="relu", backend=backend)
    side.synchronize()
    assert_matches_reference(d, a, b, c, "relu")


@pytest.mark.parametrize("backend", ["cublas", "cublaslt", "torch_compile", "triton_fused"])
def test_fp32_is_ieee_unless_tf32_is_asked_for(backend, rng):
    a, b, c = random_inputs(256, 256, 4096, torch.float32, "cuda", "full", rng)
    ieee = backends.relative_error(gemm(a, b, c, backend=backend), backends.reference(a, b, c))
    tf32 = backends.relative_error(gemm(a, b, c, backend=backend, allow_tf32=True),
                                   backends.reference(a, b, c))
    assert ieee <= 1e-5 < tf32 <= 5e-3


def test_grid_limit_is_a_clear_error():
    a = torch.randn(16 * 65535 + 1, 1, device="cuda")
    b = torch.randn(1, 1, device="cuda")
    with pytest.raises(ValueError, match="gridDim.y"):
        gemm(a, b, backend="cuda_naive")


@pytest.mark.parametrize("name", sorted(CUDA_KERNELS))
@pytest.mark.parametrize("n", [1999, 2000])  # 2000: the tensor maps of D and C by value
def test_pycuda_launch_gives_the_cupy_result(name, n, rng):
    if (why := pycuda_unavailable_reason()) is not None:
        pytest.skip(why)
    dtype = CUDA_KERNELS[name].dtypes[-1]
    a, b, c = random_inputs(1000, n, 777, dtype, "cuda", "full", rng)
    via_cupy = gemm(a, b, c, activation="relu", backend=name)
    via_pycuda = torch.full_like(via_cupy, float("nan"))
    with use_launcher("pycuda"):
        gemm(a, b, c, activation="relu", backend=name, out=via_pycuda)
    assert torch.equal(via_pycuda, via_cupy)


def test_pycuda_refuses_a_side_stream(rng):
    if (why := pycuda_unavailable_reason()) is not None:
        pytest.skip(why)
    a, b, c = random_inputs(64, 64, 64, torch.float32, "cuda", "full", rng)
    with use_launcher("pycuda"), torch.cuda.stream(torch.cuda.Stream()):
        with pytest.raises(RuntimeError, match="default stream only"):
            gemm(a, b, c, backend="cuda_regblock")


@pytest.mark.parametrize("name", sorted(CUDA_KERNELS))
def test_resources_come_from_the_compiled_kernel(name):
    kernel = CUDA_KERNELS[name]
    for dtype in kernel.dtypes:
        r = resources(kernel, dtype, torch.cuda.current_device())
        assert r["threads"] == kernel.threads[0] * kernel.threads[1]
        assert 0 < r["registers"] <= 255 and r["blocks_per_sm"] >= 1
        assert 0 < r["occupancy"] <= 1
        assert r["local_bytes"] == 0, f"{name} {dtype}: spills or a stack frame"
