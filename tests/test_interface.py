"""gemm(): every error path, the degenerate shapes, strides, bias and out= handling, on the
backends that run on this machine (the CPU ones on CI, all of them on a GPU)."""

import re
from pathlib import Path

import pytest
import torch
from conftest import HAS_GPU, assert_matches_reference, random_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

import backends
from backends import BackendUnavailableError, gemm, torch_compile
from backends.problem import Problem
from backends.registry import CUDA_KERNELS

DEVICE = "cuda" if HAS_GPU else "cpu"
RUNNING = [s.name for s in backends.available() if s.runs]
# Each backend's tensors: fp32 where it takes fp32, else its first dtype (the tensor-core
# rungs take fp16/bf16 only).
ON = {name: {"device": DEVICE, "dtype": torch.float32 if torch.float32 in
             backends.BACKENDS[name].dtypes else backends.BACKENDS[name].dtypes[0]}
      for name in RUNNING}
LADDER_ORDER = [b.name for b in backends.LADDER]  # the registry is the one list
REPOSITORY = Path(__file__).resolve().parent.parent


def test_registry_is_the_ladder_in_order():
    assert list(backends.BACKENDS) == LADDER_ORDER and len(set(LADDER_ORDER)) == len(LADDER_ORDER)
    assert all(backends.BACKENDS[b.name] is b for b in backends.LADDER)
    # The CUDA C rungs climb in the order of their files' step numbers (01_naive.cu, ...).
    cuda = [name for name in LADDER_ORDER if name in CUDA_KERNELS]
    assert cuda == list(CUDA_KERNELS)
    assert [CUDA_KERNELS[name].source for name in cuda] == sorted(k.source for k in
                                                                  CUDA_KERNELS.values())


def test_the_readme_ladder_table_has_one_row_per_registry_entry():
    """In ladder order, each naming the file that holds the backend."""
    lines = (REPOSITORY / "README.md").read_text().splitlines()
    start = lines.index("| backend | file | technique | dtypes |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    assert [row[0] for row in rows] == LADDER_ORDER
    for name, file, technique, _ in rows:
        assert (REPOSITORY / file).is_file() and technique, name
        if name in CUDA_KERNELS:
            assert file == f"backends/cuda/{CUDA_KERNELS[name].source}"


def test_available_lists_every_backend_with_a_reason_when_it_cannot_run():
    status = backends.available()
    assert [s.name for s in status] == LADDER_ORDER
    for s in status:
        assert s.runs == (s.reason == "")
    on_cpu = {b.name for b in backends.LADDER if "cpu" in b.devices}  # need no GPU
    assert on_cpu and on_cpu | {"triton_fused"} <= {s.name for s in status if s.runs}


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU report")
def test_cuda_backends_report_why_they_cannot_run_without_a_gpu(rng):
    a, b, _ = random_inputs(4, 4, 4, generator=rng)
    for name in CUDA_KERNELS:
        with pytest.raises(BackendUnavailableError, match="no CUDA GPU"):
            gemm(a, b, backend=name)


def test_unknown_backend_lists_the_known_ones(rng):
    a, b, _ = random_inputs(4, 4, 4, generator=rng)
    with pytest.raises(ValueError, match="unknown backend 'cutlass'.*cublas.*triton_fused"):
        gemm(a, b, backend="cutlass")


@pytest.mark.parametrize("backend", RUNNING)
class TestBadInput:
    def test_non_2d(self, backend, rng):
        a, b, _ = random_inputs(4, 5, 6, generator=rng, **ON[backend])
        with pytest.raises(ValueError, match="must be 2-D"):
            gemm(a[None], b, backend=backend)
        with pytest.raises(ValueError, match="must be 2-D"):
            gemm(a, b[0], backend=backend)

    def test_inner_dimensions_differ(self, backend, rng):
        a, _, _ = random_inputs(4, 5, 6, generator=rng, **ON[backend])
        b = torch.randn(7, 5, generator=rng).to(**ON[backend])
        with pytest.raises(ValueError, match="inner dimensions differ: A is 4x6 but B is 7x5"):
            gemm(a, b, backend=backend)

    @pytest.mark.parametrize("c_shape", [(5,), (6, 4), (1, 6), (4,), (4, 6, 1)])
    def test_c_of_wrong_shape(self, backend, c_shape, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(ValueError, match=r"C must be \(4, 6\) or a bias of shape \(6,\)"):
            gemm(a, b, torch.zeros(c_shape, **ON[backend]) + 1, backend=backend)

    def test_out_of_wrong_shape(self, backend, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(ValueError, match=r"out must have shape \(4, 6\)"):
            gemm(a, b, backend=backend, out=torch.empty(6, 4, **ON[backend]))

    def test_unknown_activation(self, backend, rng):
        a, b, c = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(ValueError, match="activation must be one of"):
            gemm(a, b, c, activation="gelu", backend=backend)

    def test_not_a_tensor(self, backend, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(TypeError, match="b must be a torch.Tensor, got list"):
            gemm(a, b.tolist(), backend=backend)

    @pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
    def test_sparse_operands_are_refused(self, backend, layout, rng):
        a, b, c = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        sparse = getattr(a, f"to_{layout}")()
        with pytest.raises(TypeError, match=f"a must be a dense tensor .* got torch.{layout}"):
            gemm(sparse, b, c, backend=backend)
        with pytest.raises(TypeError, match=f"c must be a dense tensor .* got torch.{layout}"):
            gemm(a, b, getattr(c, f"to_{layout}")(), backend=backend)

    def test_mixed_dtypes(self, backend, rng):
        a, b, c = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(TypeError, match="share one dtype.*c: torch.float64"):
            gemm(a, b, c.double(), backend=backend)

    def test_unsupported_dtype(self, backend, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(TypeError, match=f"backend '{backend}' supports .*got torch.float64"):
            gemm(a.double(), b.double(), backend=backend)
        with pytest.raises(TypeError, match="got torch.int32"):
            gemm(a.int(), b.int(), backend=backend)

    def test_tensors_on_different_devices(self, backend, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        with pytest.raises(ValueError, match="one device.*b: meta"):
            gemm(a, b.to("meta"), backend=backend)

    def test_unsupported_device(self, backend):
        a = torch.empty(4, 5, device="meta", dtype=ON[backend]["dtype"])
        b = torch.empty(5, 6, device="meta", dtype=ON[backend]["dtype"])
        with pytest.raises(ValueError, match=f"backend '{backend}' runs on .*got meta"):
            gemm(a, b, backend=backend)

    def test_out_overlapping_an_input(self, backend, rng):
        a, b, _ = random_inputs(6, 6, 6, generator=rng, **ON[backend])
        with pytest.raises(ValueError, match="out overlaps a"):
            gemm(a, b, backend=backend, out=a)
        rows = torch.randn(12, 6, generator=rng).to(**ON[backend])
        with pytest.raises(ValueError, match="out overlaps c"):
            gemm(a, b, rows[6:], backend=backend, out=rows[3:9])

    def test_out_overlapping_itself_is_refused(self, backend, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        rows_alike = torch.zeros(6, **ON[backend]).expand(4, 6)  # every row the same memory
        with pytest.raises(ValueError, match="out must not overlap itself"):
            gemm(a, b, backend=backend, out=rows_alike)
        folded = torch.zeros(30, **ON[backend]).as_strided((4, 6), (3, 1))  # rows overlap
        with pytest.raises(ValueError, match="out must not overlap itself"):
            gemm(a, b, backend=backend, out=folded)
        assert torch.equal(rows_alike, torch.zeros(4, 6, **ON[backend]))  # nothing written

    def test_tf32_only_where_it_applies(self, backend, rng):
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        impl = backends.BACKENDS[backend]
        if impl.tf32 and a.is_cuda:
            gemm(a, b, backend=backend, allow_tf32=True)  # accepted
        else:
            with pytest.raises(ValueError, match="allow_tf32 needs fp32 CUDA tensors"):
                gemm(a, b, backend=backend, allow_tf32=True)
        if "float16" in str(impl.dtypes):
            with pytest.raises(ValueError, match="allow_tf32"):
                gemm(a.half(), b.half(), backend=backend, allow_tf32=True)

    def test_an_out_in_an_autograd_graph_is_never_overwritten_unseen(self, backend, rng):
        """``out`` computed from a tensor that requires grad: a backend without a backward
        refuses to write it under grad mode (autograd would not see the write, and the
        graph's gradient would silently be wrong); a differentiable one is seen by autograd,
        whose backward then refuses the modified tensor."""
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        x = torch.ones(4, 6, **ON[backend], requires_grad=True)
        h = x * 2
        loss = (h * h).sum()
        if not backends.BACKENDS[backend].differentiable:
            with pytest.raises(ValueError, match="has no backward"):
                gemm(a, b, backend=backend, out=h)
            loss.backward()
            assert torch.equal(x.grad, torch.full_like(x, 8.0))  # d(4x^2)/dx at 1
            return
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            gemm(a, b, backend=backend, out=h)
            loss.backward()

    def test_grad_only_through_differentiable_backends(self, backend, rng):
        """Bindings are not keyed on grad mode: a signature bound under ``no_grad`` and
        called again with grad mode on still refuses a backend without a backward, and a
        differentiable one records the graph."""
        a, b, _ = random_inputs(4, 6, 5, generator=rng, **ON[backend])
        a.requires_grad_(True)
        with torch.no_grad():
            assert_matches_reference(gemm(a, b, backend=backend), a, b, None, None)
        if backends.BACKENDS[backend].differentiable:
            gemm(a, b, backend=backend).sum().backward()
            assert torch.allclose(a.grad, b.sum(1).expand(4, 5), atol=1e-5)
            a.grad = None
            out = torch.full((4, 6), float("nan"), **ON[backend])  # and with out= (recorded)
            assert gemm(a, b, backend=backend, out=out) is out
            assert_matches_reference(out.detach(), a.detach(), b, None, None)
            out.sum().backward()
            assert torch.allclose(a.grad, b.sum(1).expand(4, 5), atol=1e-5)
        else:
            for _ in range(2):
                with pytest.raises(ValueError, match="has no backward"):
                    gemm(a, b, backend=backend)
            with torch.no_grad():
                assert_matches_reference(gemm(a, b, backend=backend), a, b, None, None)


@pytest.mark.parametrize("backend", RUNNING)
@pytest.mark.parametrize("m,n,k", [(0, 5, 3), (4, 0, 3), (0, 0, 0), (4, 5, 0)])
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
def test_empty_dimensions_give_the_exact_answer(backend, m, n, k, c_kind, rng):
    a, b, c = random_inputs(m, n, k, c_kind=c_kind, generator=rng, **ON[backend])
    for activation in (None, "relu"):
        d = gemm(a, b, c, activation=activation, backend=backend)
        assert d.shape == (m, n) and d.dtype == a.dtype and d.device == a.device
        expected = backends.reference(a, b, c, activation)  # zeros, C, or ReLU(C) when K = 0
        assert torch.equal(d.double(), expected)
        out = torch.full((m, n), float("nan"), **ON[backend])
        assert gemm(a, b, c, activation=activation, backend=backend, out=out) is out
        assert torch.equal(out.double(), expected)


@pytest.mark.parametrize("backend", RUNNING)
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
def test_non_contiguous_inputs_and_out(backend, c_kind, rng):
    m, n, k = 19, 23, 29

    def randn(*shape):
        return torch.randn(shape, generator=rng).to(**ON[backend])

    a = randn(k, m).t()  # transposed view
    b = randn(n + 7, k).t()[:, 3:3 + n]  # transposed, then a column slice
    c = {"full": lambda: randn(n, m).t(), "bias": lambda: randn(2 * n)[::2],
         None: lambda: None}[c_kind]()
    out = torch.full((n, m), float("nan"), **ON[backend]).t()
    assert not (a.is_contiguous() or b.is_contiguous() or out.is_contiguous())
    assert gemm(a, b, c, activation="relu", backend=backend, out=out) is out
    assert_matches_reference(out, a, b, c, "relu")


@pytest.mark.parametrize("backend", RUNNING)
def test_autocast_does_not_change_what_gemm_computes(backend, rng):
    """Under torch.autocast the torch backends' matmuls would run in the autocast dtype
    (fp16 on CUDA, bf16 on CPU) and cublas would return it: D stays in A's dtype and within
    its tolerance, and the same signature outside autocast is bound apart."""
    a, b, c = random_inputs(33, 17, 65, generator=rng, **ON[backend])
    with torch.autocast(DEVICE):
        d = gemm(a, b, c, activation="relu", backend=backend)
    assert d.dtype == a.dtype
    assert_matches_reference(d, a, b, c, "relu")
    assert_matches_reference(gemm(a, b, c, activation="relu", backend=backend), a, b, c, "relu")


@pytest.mark.parametrize("backend", RUNNING)
def test_a_binding_made_outside_autocast_is_not_used_inside(backend, rng):
    """The binding of a signature is found by its guard, which holds autocast's state: bound
    first outside autocast, the same call inside is bound apart (with autocast off for its
    launch), and D stays in A's dtype."""
    a, b, c = random_inputs(31, 19, 67, generator=rng, **ON[backend])
    assert_matches_reference(gemm(a, b, c, activation="relu", backend=backend), a, b, c, "relu")
    with torch.autocast(DEVICE):
        d = gemm(a, b, c, activation="relu", backend=backend)
    assert d.dtype == a.dtype
    assert_matches_reference(d, a, b, c, "relu")


@pytest.mark.parametrize("backend", RUNNING)
def test_out_receives_d_and_inputs_are_untouched(backend, rng):
    a, b, c = random_inputs(33, 17, 9, generator=rng, **ON[backend])
    copies = [t.clone() for t in (a, b, c)]
    out = torch.full((33, 17), float("nan"), **ON[backend])
    assert gemm(a, b, c, activation="relu", backend=backend, out=out) is out
    assert_matches_reference(out, a, b, c, "relu")
    assert all(torch.equal(x, y) for x, y in zip((a, b, c), copies))


@pytest.mark.parametrize("backend", RUNNING)
def test_a_signature_changed_in_place_is_bound_again(backend, rng):
    """A binding is for a signature, not for tensor objects: the same objects changed in
    place (transposed, requiring grad, resized) are checked and bound again, never launched
    with the old binding."""
    a, b, c = random_inputs(6, 6, 6, generator=rng, **ON[backend])
    assert_matches_reference(gemm(a, b, c, backend=backend), a, b, c, None)
    a.t_()  # strides (1, 6) now
    assert_matches_reference(gemm(a, b, c, backend=backend), a, b, c, None)
    if not backends.BACKENDS[backend].differentiable:
        a.requires_grad_(True)
        with pytest.raises(ValueError, match="has no backward"):
            gemm(a, b, c, backend=backend)
        a.requires_grad_(False)
    b.resize_(6, 3)
    with pytest.raises(ValueError, match=r"C must be \(6, 3\)"):
        gemm(a, b, c, backend=backend)
    assert_matches_reference(gemm(a, b, c[:, :3], backend=backend), a, b, c[:, :3], None)


@pytest.mark.parametrize("backend", RUNNING)
def test_one_tensor_in_several_places_binds_once(backend, rng):
    from backends import api

    a, _, _ = random_inputs(8, 8, 8, generator=rng, **ON[backend])
    for _ in range(3):
        assert_matches_reference(gemm(a, a, a, activation="relu", backend=backend),
                                 a, a, a, "relu")
        bound = api._plan_count[0]
    gemm(a, a, a, activation="relu", backend=backend)
    assert api._plan_count[0] == bound


@pytest.mark.parametrize("backend", RUNNING)
def test_bind_launch_checks_once_and_launches_what_gemm_launches(backend, rng):
    from backends.api import bind_launch

    a, b, c = random_inputs(5, 7, 9, generator=rng, **ON[backend])
    launch = bind_launch(a, b, c, activation="relu", backend=backend)
    d = launch(a, b, c, None)
    assert_matches_reference(d, a, b, c, "relu")
    assert torch.equal(d, gemm(a, b, c, activation="relu", backend=backend))
    with pytest.raises(ValueError, match=r"C must be \(5, 7\)"):
        bind_launch(a, b, c[:, :3], backend=backend)


def test_every_call_runs_in_an_nvtx_range_named_after_the_backend(monkeypatch, rng):
    import profiling.nvtx

    pushed, open_ranges = [], []

    class Recorder:
        def get_event_attributes(self, message=None, payload=None):
            return message

        def push_range(self, name):
            pushed.append(name)
            open_ranges.append(name)

        def pop_range(self):
            open_ranges.pop()

    monkeypatch.setattr(profiling.nvtx, "domain", Recorder())
    for backend in RUNNING:
        a, b, c = random_inputs(5, 6, 7, generator=rng, **ON[backend])
        gemm(a, b, c, activation="relu", backend=backend)
        gemm(a, b, c, activation="relu", backend=backend)  # the bound signature: same range
    assert pushed == [name for name in RUNNING for _ in range(2)]
    assert open_ranges == []

def test_without_a_profiler_gemm_skips_its_nvtx_range(monkeypatch, rng):
    """No profiler attached at start-up: NVTX's stand-in domain records nothing, so gemm()
    makes no range calls at all (they cost host time per call for nothing)."""
    import profiling.nvtx

    if profiling.nvtx.NO_PROFILER is None:
        pytest.skip("a profiler is attached: NVTX records ranges in this process")
    assert profiling.nvtx.domain is profiling.nvtx.NO_PROFILER

    def no_range(*args):
        raise AssertionError("an NVTX range call without a profiler")

    monkeypatch.setattr(profiling.nvtx, "push", no_range)
    monkeypatch.setattr(profiling.nvtx, "pop", no_range)
    a, b, c = random_inputs(5, 6, 7, generator=rng)
    for _ in range(2):  # the first call binds, the second finds the binding
        assert_matches_reference(gemm(a, b, c, activation="relu", backend="torch_unfused"),
                                 a, b, c, "relu")



@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 70),
       c_kind=st.sampled_from(["full", "bias", None]),
       activation=st.sampled_from([None, "relu"]), seed=st.integers(0, 2**31 - 1))
def test_random_shapes_match_float64_on_every_running_backend(m, n, k, c_kind, activation, seed):
    gen = torch.Generator().manual_seed(seed)
    inputs = random_inputs(m, n, k, c_kind=c_kind, generator=gen)
    for backend in RUNNING:
        a, b, c = (None if t is None else t.to(**ON[backend]) for t in inputs)
        d = gemm(a, b, c, activation=activation, backend=backend)
        assert_matches_reference(d, a, b, c, activation)


def test_fp32_precision_is_set_through_one_api_and_restored():
    """Inductor reads the global matmul precision and refuses a mix of the per-backend and
    global APIs; the context sets both consistently and puts both back."""
    from backends.torch_backends import fp32_precision

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision, torch.get_float32_matmul_precision()
    with fp32_precision(True):
        assert (matmul.fp32_precision, torch.get_float32_matmul_precision()) == ("tf32", "high")
    with fp32_precision(False):
        assert (matmul.fp32_precision, torch.get_float32_matmul_precision()) == (
            "ieee", "highest")
    assert (matmul.fp32_precision, torch.get_float32_matmul_precision()) == before


@pytest.mark.parametrize("state", ["default", "tf32 set", "mixed APIs"])
@pytest.mark.parametrize("allow_tf32", [False, True])
def test_an_fp32_cuda_launch_runs_under_its_own_precision(state, allow_tf32):
    """Whatever the caller's setting, the launch sees the precision its Problem asks for (as
    cuBLAS reads it), and the caller's setting is back afterwards."""
    import warnings

    from backends.problem import Problem
    from backends.torch_backends import fp32_precision, with_precision

    seen = []

    def launch(a, b, c, out):
        seen.append(torch._C._get_cublas_allow_tf32())

    p = Problem(2, 2, 2, torch.float32, torch.device("cuda"), None, False, allow_tf32)
    matmul = torch.backends.cuda.matmul
    with fp32_precision(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about the legacy API
        if state == "tf32 set":
            matmul.fp32_precision = "tf32"
        elif state == "mixed APIs":
            torch.set_float32_matmul_precision("high")
            matmul.fp32_precision = "ieee"
        before = matmul.fp32_precision
        with_precision(p, launch)(None, None, None, None)
        assert seen == [allow_tf32]
        assert matmul.fp32_precision == before

@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU report")
def test_cublaslt_says_why_it_cannot_run_without_a_gpu(rng):
    status = {s.name: s for s in backends.available()}["cublaslt"]
    assert not status.runs and status.reason == "no CUDA GPU visible to torch"
    a, b, c = random_inputs(4, 4, 4, generator=rng)
    with pytest.raises(BackendUnavailableError, match="'cublaslt' cannot run here: no CUDA GPU"):
        gemm(a, b, c, backend="cublaslt")


def test_torch_compile_reports_its_compile_time_and_reuses_it(rng):
    """The CPU functional check of torch_compile (Inductor's C++ path): every epilogue is
    checked above; here, one problem compiles once and its time is reported, not redone."""
    a, b, c = random_inputs(21, 13, 11, device=DEVICE, generator=rng)
    gemm(a, b, c, activation="relu", backend="torch_compile")
    first = backends.BACKENDS["torch_compile"].config()
    d = gemm(a, b, c, activation="relu", backend="torch_compile")
    assert_matches_reference(d, a, b, c, "relu")
    assert "max-autotune-no-cudagraphs" in first and "compiled in" in first
    assert backends.BACKENDS["torch_compile"].config() == first  # no second compile


def test_torch_compile_runs_inductors_graph_past_dynamo_after_the_first_call(rng, monkeypatch):
    """The first call compiles through torch.compile; later calls of the signature, on fresh
    data, run the graph Inductor compiled without calling Dynamo's guarded function."""
    a, b, c = random_inputs(19, 23, 17, device=DEVICE, generator=rng)
    gemm(a, b, c, activation="relu", backend="torch_compile")
    entry = torch_compile.compiled(Problem.of(a, b, c, True), a, b, c)
    assert len(entry.graphs) == 1 and entry.direct() is entry.graphs[0]

    def dynamo(*args):
        raise AssertionError("the torch.compile'd function was called")

    monkeypatch.setattr(entry, "fn", dynamo)
    for _ in range(2):
        a, b, c = random_inputs(19, 23, 17, device=DEVICE, generator=rng)
        assert_matches_reference(gemm(a, b, c, activation="relu", backend="torch_compile"),
                                 a, b, c, "relu")


def test_torch_compile_calls_dynamos_function_where_dynamo_compiled_twice(rng):
    """A state Dynamo guards on and gemm()'s signature does not (deterministic algorithms)
    changes between two signatures of one compiled function: Dynamo compiles it again, and
    the second binding calls Dynamo's function, which picks the graph for the state."""
    a, b, c = random_inputs(21, 11, 9, device=DEVICE, generator=rng)
    entry = torch_compile.compiled(Problem.of(a, b, c, True), a, b, c)
    gemm(a, b, c, activation="relu", backend="torch_compile")
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # cuBLAS would raise otherwise
    try:
        out = torch.full((21, 11), float("nan"), device=DEVICE)  # another signature
        gemm(a, b, c, activation="relu", backend="torch_compile", out=out)
        assert len(entry.graphs) == 2 and entry.direct() not in entry.graphs
        for _ in range(2):
            a.copy_(torch.randn(21, 9, generator=rng))
            out.fill_(float("nan"))
            gemm(a, b, c, activation="relu", backend="torch_compile", out=out)
            assert_matches_reference(out, a, b, c, "relu")
    finally:
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


def test_torch_compile_refuses_a_graph_whose_inputs_are_not_a_b_c():
    """The direct call passes A, B (and C) in order: a Dynamo graph of other inputs is an
    error at compile time, never a call with misplaced tensors."""
    a, b, c = random_inputs(4, 4, 4)
    entry = torch_compile._Compiled(Problem.of(a, b, c, True), 10**6)
    other = torch.compile(lambda x, y: x @ y, backend=entry._inductor, fullgraph=True)
    with pytest.raises(RuntimeError, match=re.escape("Dynamo's graph takes [\"L['x']\"")):
        other(a, b)


@pytest.mark.skipif("triton_fused" not in RUNNING, reason="triton_fused cannot run here")
@pytest.mark.parametrize("case", ["M", "D"])
def test_triton_refuses_what_its_32_bit_offsets_cannot_reach(case):
    """Nothing is allocated: M = 2**31 rows of one expanded element (no offset past 0, but
    the tile's row index would wrap), or a D of 2**32 elements from 4 MiB operands."""
    dtype = ON["triton_fused"]["dtype"]
    one = torch.ones(1, 1, dtype=dtype, device=DEVICE)
    if case == "M":
        a, b = one.expand(2**31, 1), one
    else:
        a = torch.ones(2**16, 16, dtype=dtype, device=DEVICE)
        b = torch.ones(16, 2**16, dtype=dtype, device=DEVICE)
    impl = backends.BACKENDS["triton_fused"]
    assert (impl.max_offset, impl.max_dim) == (2**31 - 1, 2**31 - 257)
    match = {"M": f"indexes M, N and K up to {impl.max_dim}; got M, N, K = 2147483648, 1, 1",
             "D": f"indexes at most {impl.max_offset} elements past an operand's start; got "
                  f"last-element offsets out: 4294967295"}[case]
    with pytest.raises(ValueError, match=match):
        gemm(a, b, backend="triton_fused")


@pytest.mark.parametrize("name", sorted(CUDA_KERNELS))
def test_cuda_rungs_refuse_sizes_their_int_parameters_cannot_hold(name):
    """M, N, K reach the kernels as int: N = 2**31 would arrive negative and leave D unwritten.
    Refused before anything is allocated or launched (on CPU too, where the rungs do not run:
    a backend's limits are checked before whether this machine can run it)."""
    impl = backends.BACKENDS[name]
    assert impl.max_dim == 2**31 - 1025 and impl.max_offset is None
    one = torch.ones(1, 1, dtype=impl.dtypes[0], device=DEVICE)
    with pytest.raises(ValueError, match="indexes M, N and K up to 2147482623; got M, N, K = "
                                         "1, 2147483648, 1"):
        gemm(one, one.expand(1, 2**31), backend=name)


def test_out_overlapping_an_input_through_another_storage_is_refused(rng):
    """Two tensors made from views of one numpy buffer have separate storages: the overlap
    is found by address span, not by storage."""
    import numpy as np

    buffer = np.zeros(2 * 36, dtype=np.float32)
    a = torch.from_numpy(buffer[:36].reshape(6, 6))
    out = torch.from_numpy(buffer[18:54].reshape(6, 6))  # shares a's last 3 rows
    assert a.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    a.copy_(torch.randn(6, 6, generator=rng))
    b = torch.randn(6, 6, generator=rng)
    for backend in ("cublas", "torch_unfused"):
        with pytest.raises(ValueError, match="out overlaps a"):
            gemm(a, b, backend=backend, out=out)
    apart = torch.from_numpy(buffer[36:].reshape(6, 6))  # right after a: no overlap
    assert gemm(a, b, backend="cublas", out=apart) is apart
