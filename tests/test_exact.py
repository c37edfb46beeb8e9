"""Exact tests: D must equal the float64 reference bit for bit.

The inputs are small nonzero integers, sized so that every product, every partial sum in any
order, A @ B, A @ B + C and one extra term on top are integers within the range the dtype
holds exactly (2^24 in fp32, 2^11 in fp16, 2^8 in bf16). A correct backend then makes no
rounding error anywhere, whether it accumulates in fp32 or rounds intermediates to the dtype
(``torch_unfused`` rounds A @ B before adding C), and D equals the float64 reference
converted to the dtype (``torch.equal``, no tolerance). Every term a[i, k] * b[k, j] is
nonzero, so one missing, duplicated or misplaced term, one wrong or unwritten element, changes
D: ``test_the_construction_sees_...`` prove that on D computed independently in float64.
The rounding-bound tests on random data (``conftest.assert_matches_reference``) cannot: at
K ~ 1000 one missing term is below their bound in fp16 and bf16 (shown below too).

K spans several K tiles of every tile config (BLOCK_K 16 to 64) plus a remainder; M and N are
not multiples of the tiles. TF32 is left out: it rounds the operands by design (the fp32
inputs go up to 4095, which TF32 cannot hold, so an fp32 run on TF32 fails here)."""

from dataclasses import dataclass

import pytest
import torch
import triton
from conftest import HAS_GPU, assert_matches_reference, random_inputs

import backends
from backends import gemm, triton_fused

# Largest integer range each dtype holds exactly: its significand bits, implicit bit included.
EXACT_INTEGERS = {torch.float32: 2**24, torch.float16: 2**11, torch.bfloat16: 2**8}


@dataclass(frozen=True)
class Recipe:
    """Entries of A in +-{1..a_max}, of B in +-{1..b_max}, inner dimension K, one dtype."""

    dtype: torch.dtype
    k: int
    a_max: int
    b_max: int

    @property
    def id(self) -> str:
        return f"{str(self.dtype)[6:]}-k{self.k}-a{self.a_max}-b{self.b_max}"

    @property
    def c_max(self) -> int:
        """Largest |C|: the K terms, C and one duplicated term stay within the exact range."""
        return EXACT_INTEGERS[self.dtype] - (self.k + 1) * self.a_max * self.b_max


RECIPES = [
    # fp32: A up to 4095 (12 bits: not exact in TF32's 11), sums up to ~1.2e7 < 2^24.
    Recipe(torch.float32, 999, 4095, 3),
    # fp16: +-1 over ~1000 terms, and +-{1,2,3} over ~200.
    Recipe(torch.float16, 999, 1, 1),
    Recipe(torch.float16, 201, 3, 3),
    # bf16: +-1 over ~200 terms, and A in +-{1,2,3} over 75.
    Recipe(torch.bfloat16, 199, 1, 1),
    Recipe(torch.bfloat16, 75, 3, 1),
]
IDS = [r.id for r in RECIPES]


def exact_inputs(m, n, recipe: Recipe, device="cpu", c_kind="full", generator=None):
    """A (M, K), B (K, N) and C (``"full"`` (M, N), ``"bias"`` (N,) or None) of ``recipe``:
    nonzero integers, random signs; C in +-{1..c_max}."""
    assert recipe.c_max >= 1, f"{recipe.id} leaves no room for C"

    def nonzero(top, *shape):
        magnitude = torch.randint(1, top + 1, shape, generator=generator)
        sign = torch.randint(0, 2, shape, generator=generator) * 2 - 1
        return (sign * magnitude).to(device=device, dtype=recipe.dtype)

    c = {"full": lambda: nonzero(recipe.c_max, m, n), "bias": lambda: nonzero(recipe.c_max, n),
         None: lambda: None}[c_kind]()
    return nonzero(recipe.a_max, m, recipe.k), nonzero(recipe.b_max, recipe.k, n), c


def assert_exact(d, a, b, c, activation):
    """D equals the float64 reference, every element, bit for bit."""
    ref = backends.reference(a, b, c, activation)
    expected = ref.to(d.dtype)
    assert torch.equal(expected.double(), ref), "the inputs are not exact in this dtype"
    assert d.shape == expected.shape and d.dtype == expected.dtype
    if not torch.equal(d, expected):
        wrong = (d.double() != ref).nonzero()  # NaN (unwritten) differs too
        i, j = wrong[0].tolist()
        raise AssertionError(f"{len(wrong)} of {d.numel()} elements differ from float64; "
                             f"first ({i}, {j}): {d[i, j].item()} != {ref[i, j].item():.0f}")


# --- the construction catches what it claims to (no backend involved) ------------------------

def _terms(recipe, m, n, generator):
    a, b, c = exact_inputs(m, n, recipe, c_kind="full", generator=generator)
    a64, b64, c64 = a.double(), b.double(), c.double()
    terms = a64[:, :, None] * b64[None, :, :]  # (M, K, N): term k of element (i, j)
    return a64, b64, c64, terms


def test_the_exact_integer_ranges_are_the_significands():
    """Every integer up to 2^p is exact in a format of p significand bits (eps = 2^(1-p));
    the next one is not."""
    for dtype, limit in EXACT_INTEGERS.items():
        assert limit == 2 / torch.finfo(dtype).eps
        top = torch.arange(limit - 64, limit + 1, dtype=torch.float64)
        assert torch.equal(top.to(dtype).double(), top)
        assert torch.tensor(limit + 1.0, dtype=torch.float64).to(dtype).item() != limit + 1


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_the_construction_is_exact(recipe, rng):
    """The worst case (every entry at its largest, one sign) plus one more term is within the
    exact range, and drawn inputs are nonzero, reach their largest entries and give a
    reference that survives the round trip through the dtype."""
    k, dtype = recipe.k, recipe.dtype
    a = torch.full((1, k), float(recipe.a_max), dtype=dtype)
    b = torch.full((k, 1), float(recipe.b_max), dtype=dtype)
    c = torch.full((1, 1), float(recipe.c_max), dtype=dtype)
    worst = backends.reference(a, b, c).item() + recipe.a_max * recipe.b_max
    assert recipe.c_max >= 1 and worst <= EXACT_INTEGERS[dtype]
    assert torch.tensor(worst, dtype=dtype).item() == worst
    a, b, c = exact_inputs(23, 19, recipe, generator=rng)
    ref = backends.reference(a, b, c)
    assert torch.equal(ref.to(dtype).double(), ref)
    for t in (a, b, c):
        assert (t != 0).all()
    assert a.abs().max() == recipe.a_max and b.abs().max() == recipe.b_max


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_the_construction_sees_every_single_missing_or_duplicated_term(recipe, rng):
    """Exhaustively, on a small D: removing or doubling any one term a[i, k] * b[k, j] (or C)
    of any element changes that element once rounded to the dtype."""
    m, n = 7, 5
    a64, b64, c64, terms = _terms(recipe, m, n, rng)
    exact = terms.sum(1) + c64
    assert torch.equal(exact, backends.reference(a64, b64, c64))
    expected = exact.to(recipe.dtype)[:, None, :]
    missing = (exact[:, None, :] - terms).to(recipe.dtype)
    duplicated = (exact[:, None, :] + terms).to(recipe.dtype)
    assert (missing != expected).all() and (duplicated != expected).all()
    assert ((exact - c64).to(recipe.dtype) != expected[:, 0]).all()  # C left out
    assert ((exact + c64).to(recipe.dtype) != expected[:, 0]).all()  # C added twice


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_the_construction_sees_tile_level_mistakes(recipe, rng):
    """Mistakes a kernel makes in whole tiles, simulated in float64 on D of 37 x 35: a K tile
    skipped or added twice, the K remainder dropped, rows of B read one row off in one tile,
    one row of A from the wrong row, two columns of D swapped, one element unwritten."""
    m, n, bk = 37, 35, 16
    a64, b64, c64, terms = _terms(recipe, m, n, rng)
    exact = terms.sum(1) + c64
    expected = exact.to(recipe.dtype)
    tail = recipe.k - recipe.k % bk
    assert 0 < tail < recipe.k  # the recipe has a remainder after its last full K tile

    shifted = b64.clone()
    shifted[bk:2 * bk] = b64[bk + 1:2 * bk + 1]  # tile 1 of B read one row late
    wrong_row = a64.clone()
    wrong_row[5] = a64[6]
    swapped = exact.clone()
    swapped[:, [3, 4]] = exact[:, [4, 3]]
    unwritten = exact.clone()
    unwritten[m - 1, n - 1] = float("nan")
    mistakes = {
        "K tile skipped": exact - terms[:, bk:2 * bk].sum(1),
        "K tile twice": exact + terms[:, bk:2 * bk].sum(1),
        "remainder dropped": exact - terms[:, tail:].sum(1),
        "B rows off by one": a64 @ shifted + c64,
        "wrong row of A": wrong_row @ b64 + c64,
        "columns swapped": swapped,
        "unwritten element": unwritten,
    }
    for what, d in mistakes.items():
        assert not torch.equal(d.to(recipe.dtype), expected), what


@pytest.mark.parametrize("dtype,accepted", [(torch.float16, 0.75), (torch.bfloat16, 1.0)],
                         ids=["float16", "bfloat16"])
def test_the_rounding_bound_alone_misses_single_terms_at_k_1000(dtype, accepted, rng):
    """Why the exact tests exist: on standard-normal data at K = 1000, the worst-case rounding
    bound accepts D with one term of an element left out for most terms (fp16: 877 of 1000
    here) or all of them (bf16); the exact construction rejects every one (above)."""
    m, n, k = 4, 4, 1000
    a, b, c = random_inputs(m, n, k, dtype, "cpu", "full", rng)
    exact = backends.reference(a, b, c)
    terms = a[0].double() * b[:, 0].double()  # the K terms of element (0, 0)
    passed = 0
    for term in terms:
        d = exact.clone()
        d[0, 0] -= term
        try:
            assert_matches_reference(d.to(dtype), a, b, c, None)
            passed += 1
        except AssertionError:
            pass
    assert passed >= accepted * k


# --- every backend that runs on this machine's CPU -------------------------------------------

CPU_BACKENDS = [s.name for s in backends.available()
                if s.runs and "cpu" in backends.BACKENDS[s.name].devices]
CPU_CASES = [(name, r) for name in CPU_BACKENDS for r in RECIPES
             if r.dtype in backends.BACKENDS[name].dtypes]


@pytest.mark.parametrize("backend,recipe", CPU_CASES, ids=[f"{b}-{r.id}" for b, r in CPU_CASES])
@pytest.mark.parametrize("m,n", [(37, 35), (1, 3)])  # the interpreter: M, N <= 40
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
def test_every_cpu_backend_is_exact(backend, recipe, m, n, c_kind, rng):
    a, b, c = exact_inputs(m, n, recipe, "cpu", c_kind, rng)
    for activation in (None, "relu"):
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype)
        assert gemm(a, b, c, activation=activation, backend=backend, out=out) is out
        assert_exact(out, a, b, c, activation)


def persistent_config(bm, bn, bk, group_m):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
                          "PERSISTENT": 1}, num_warps=4, num_stages=1)


INTERPRETER_CONFIGS = [
    triton_fused.INTERPRETER_CONFIG,
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2}, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 64, "GROUP_M": 1}, num_warps=2),
]
INTERPRETER_RECIPES = [r for r in RECIPES if r.dtype in triton_fused.DTYPES]


@pytest.mark.skipif(not triton_fused.INTERPRETED, reason="the Triton interpreter's tile shapes")
@pytest.mark.parametrize("recipe", INTERPRETER_RECIPES, ids=[r.id for r in INTERPRETER_RECIPES])
@pytest.mark.parametrize("config", INTERPRETER_CONFIGS, ids=["interpreter", "wide", "tall"])
def test_triton_tile_shapes_are_exact_under_the_interpreter(recipe, config, rng):
    """Pinned tiles that do not divide M, N or K (K remainders of 7 to 39), GROUP_M above and
    below the tile rows."""
    m, n = 37, 35
    for c_kind, relu in (("full", False), ("bias", True), (None, False)):
        a, b, c = exact_inputs(m, n, recipe, "cpu", c_kind, rng)
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype)
        triton_fused.run(a, b, c, relu, False, out, config=config)
        assert_exact(out, a, b, c, "relu" if relu else None)
        assert triton_fused.last_config() == f"{config}; pointer kernel"


# TMA-addressable: K and N give rows of a multiple of 16 bytes; K still not a tile multiple.
PERSISTENT_RECIPES = [Recipe(torch.float32, 1000, 4095, 3), Recipe(torch.float16, 1000, 1, 1),
                      Recipe(torch.bfloat16, 200, 1, 1)]
PERSISTENT_CASES = [r for r in PERSISTENT_RECIPES if r.dtype in triton_fused.DTYPES]
TMA = not HAS_GPU or torch.cuda.get_device_capability()[0] >= triton_fused.TMA_MIN_CAPABILITY


@pytest.mark.skipif(triton_fused.unavailable_reason() is not None, reason="no Triton here")
@pytest.mark.parametrize("recipe", PERSISTENT_CASES, ids=[r.id for r in PERSISTENT_CASES])
@pytest.mark.parametrize("config", [persistent_config(16, 32, 16, 2),
                                    persistent_config(32, 16, 64, 1)], ids=["16x32x16", "32x16x64"])
def test_triton_persistent_kernel_is_exact(recipe, config, rng):
    m, n = 37, 72
    device = "cuda" if HAS_GPU else "cpu"
    for c_kind, relu in (("full", False), (None, True)):
        a, b, c = exact_inputs(m, n, recipe, device, c_kind, rng)
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device=device)
        triton_fused.run(a, b, c, relu, False, out, config=config)
        assert_exact(out, a, b, c, "relu" if relu else None)
        ran = triton_fused.last_config().rsplit("; ", 1)[1]
        if TMA:
            assert ran == "persistent TMA kernel"
        else:
            assert ran.startswith("pointer kernel (PERSISTENT fell back: compute capability")


# --- one operand in another memory form: every backend, exactly -------------------------------

ONE_PER_BACKEND = [(s.name, next(r for r in RECIPES if r.dtype in backends.BACKENDS[s.name].dtypes))
                   for s in backends.available()
                   if s.runs and (HAS_GPU or "cpu" in backends.BACKENDS[s.name].devices)]


def _negated(t):
    """A negated view of -t: t's values, its memory holding their negatives (the negation bit,
    as ``z.conj().imag`` of a complex z gives): a kernel reads memory, not the bit."""
    view = (-t)._neg_view()
    assert view.is_neg()
    return view


def _misaligned(t):
    """t's values one element into a new storage, so the address is not 16-byte aligned:
    vector loads and TMA need a copy, or another kernel."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    moved = storage[1:].view(t.shape).copy_(t)
    assert moved.data_ptr() % 16 != 0
    return moved


@pytest.mark.parametrize("backend,recipe", ONE_PER_BACKEND,
                         ids=[f"{b}-{r.id}" for b, r in ONE_PER_BACKEND])
@pytest.mark.parametrize("operand", ["a", "b", "c", "out"])
@pytest.mark.parametrize("form", [_negated, _misaligned], ids=["negated", "misaligned"])
def test_an_operand_in_another_memory_form_is_read_and_written_as_its_values(
        backend, recipe, operand, form, rng):
    device = "cuda" if HAS_GPU else "cpu"
    m, n = 37, 35
    a, b, c = exact_inputs(m, n, recipe, device, "full", rng)
    out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device=device)
    given = {"a": a, "b": b, "c": c, "out": out}
    given[operand] = form(given[operand])
    torch.testing.assert_close(given[operand], {"a": a, "b": b, "c": c, "out": out}[operand],
                               rtol=0, atol=0, equal_nan=True)
    d = gemm(given["a"], given["b"], given["c"], activation="relu", backend=backend,
             out=given["out"])
    assert d is given["out"]
    assert_exact(d.resolve_neg(), a, b, c, "relu")


ALIGNED_PER_BACKEND = [
    (s.name, next(r for r in PERSISTENT_RECIPES if r.dtype in backends.BACKENDS[s.name].dtypes))
    for s in backends.available()
    if s.runs and (HAS_GPU or "cpu" in backends.BACKENDS[s.name].devices)]


@pytest.mark.parametrize("backend,recipe", ALIGNED_PER_BACKEND,
                         ids=[f"{b}-{r.id}" for b, r in ALIGNED_PER_BACKEND])
@pytest.mark.parametrize("operand", ["a", "b", "c", "out"])
@pytest.mark.parametrize("first", ["aligned", "misaligned"])
def test_one_signature_at_another_alignment_is_exact_and_rebinds_only_where_it_must(
        backend, recipe, operand, first, rng, monkeypatch):
    """Rows of 16-byte multiples (K and N multiples of 8), where the vector paths run (16-byte
    loads, cp.async, TMA, 16-byte stores of D): three calls of one signature (shapes and
    strides), one operand in turn aligned, one element off alignment and aligned again (or
    the other way round). D is exact each time: the kernels check their bases, not only K
    and N. A backend that takes any address (``Backend.any_address``) serves all three from
    its first binding; another binds once more, for the second call."""
    from backends import api

    monkeypatch.setattr(api, "_PLANS", {})
    binds = []
    bind = api._bind
    monkeypatch.setattr(api, "_bind", lambda *args: binds.append(args) or bind(*args))
    device = "cuda" if HAS_GPU else "cpu"
    m, n = 40, 72
    a, b, c = exact_inputs(m, n, recipe, device, "full", rng)
    aligned, off = torch.Tensor.clone, _misaligned
    for form in (aligned, off, aligned) if first == "aligned" else (off, aligned, off):
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device=device)
        given = {"a": a, "b": b, "c": c, "out": out}
        given[operand] = form(given[operand])
        d = gemm(given["a"], given["b"], given["c"], activation="relu", backend=backend,
                 out=given["out"])
        assert d is given["out"]
        assert_exact(d, a, b, c, "relu")
    assert len(binds) == (1 if backends.BACKENDS[backend].any_address else 2)


# --- every backend and dtype on a GPU ---------------------------------------------------------

GPU_SHAPES = [(1, 1), (263, 391), (1031, 517)]  # edges of every tile; M past GROUP_M x 128
GPU_CASES = [(b.name, r) for b in backends.LADDER for r in RECIPES
             if r.dtype in b.dtypes and b.name != "torch_compile"] if HAS_GPU else []


def _runs_or_skip(backend):
    reason = backends.BACKENDS[backend].unavailable()
    if reason is not None:
        pytest.skip(f"{backend} cannot run here: {reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend,recipe", GPU_CASES, ids=[f"{b}-{r.id}" for b, r in GPU_CASES])
@pytest.mark.parametrize("m,n", GPU_SHAPES)
@pytest.mark.parametrize("c_kind", ["full", "bias", None])
def test_every_backend_is_exact_on_a_gpu(backend, recipe, m, n, c_kind, rng):
    _runs_or_skip(backend)
    a, b, c = exact_inputs(m, n, recipe, "cuda", c_kind, rng)
    for activation in (None, "relu"):
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device="cuda")
        assert gemm(a, b, c, activation=activation, backend=backend, out=out) is out
        assert_exact(out, a, b, c, activation)


COMPILE_RECIPES = [RECIPES[0], RECIPES[1], RECIPES[3]]  # one per dtype: it compiles per problem


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", COMPILE_RECIPES, ids=[r.id for r in COMPILE_RECIPES])
def test_torch_compile_is_exact_on_a_gpu(recipe, rng):
    m, n = GPU_SHAPES[1]
    a, b, c = exact_inputs(m, n, recipe, "cuda", "full", rng)
    out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device="cuda")
    gemm(a, b, c, backend="torch_compile", out=out)
    assert_exact(out, a, b, c, None)


def _autotune_list(dtype):
    """The configs triton_fused's autotuner chooses from for ``dtype`` (IEEE precision)."""
    return triton_fused.CONFIGS_FP32 if dtype == torch.float32 else triton_fused.CONFIGS_16BIT


TRITON_GPU_CASES = [(r, i) for r in RECIPES for i in range(len(_autotune_list(r.dtype)))]


@pytest.mark.gpu
@pytest.mark.parametrize("recipe,index", TRITON_GPU_CASES,
                         ids=[f"{r.id}-config{i}" for r, i in TRITON_GPU_CASES])
def test_every_triton_autotune_config_is_exact_on_a_gpu(recipe, index, rng):
    """Each config of the dtype's real autotune list (CONFIGS_16BIT for fp16 and bf16,
    CONFIGS_FP32 for fp32), pinned, on an odd shape: whichever the autotuner picks is exact."""
    config = _autotune_list(recipe.dtype)[index]
    m, n = GPU_SHAPES[2]
    for c_kind, relu in (("full", False), ("bias", True)):
        a, b, c = exact_inputs(m, n, recipe, "cuda", c_kind, rng)
        out = torch.full((m, n), float("nan"), dtype=recipe.dtype, device="cuda")
        triton_fused.run(a, b, c, relu, False, out, config=config)
        assert_exact(out, a, b, c, "relu" if relu else None)
        assert triton_fused.last_config() == f"{config}; pointer kernel"


@pytest.mark.parametrize("recipe", [RECIPES[1], RECIPES[3]], ids=[RECIPES[1].id, RECIPES[3].id])
def test_one_dropped_term_fails_the_exact_check_but_not_the_rounding_bound(recipe, rng):
    """A backend's D with one term of one element left out, on these very inputs: the exact
    check names the element; the rounding bound lets it through."""
    m, n = 37, 35
    a, b, c = exact_inputs(m, n, recipe, "cpu", "full", rng)
    d = gemm(a, b, c, backend="torch_unfused")
    assert_exact(d, a, b, c, None)
    d[2, 3] -= a[2, 500 % recipe.k] * b[500 % recipe.k, 3]  # exact: integers in range
    assert_matches_reference(d, a, b, c, None)
    with pytest.raises(AssertionError, match=rf"1 of {m * n} elements differ from float64; "
                                             r"first \(2, 3\)"):
        assert_exact(d, a, b, c, None)
