"""Shared fixtures. Without a GPU, Triton kernels run under the interpreter: the variable
must be set before ``backends`` (and with it the Triton kernel) is first imported."""

import ctypes
import os
import sys

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests read the programs' output as text: rich writes no colour codes to a dumb terminal
# (Open MPI's mpiexec gives the ranks one that rich would colour).
os.environ["TERM"] = "dumb"

import backends  # noqa: E402  (after the interpreter switch above)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "autotune: runs triton_fused's full autotuning on a GPU")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Open MPI 4 starting a singleton (MPI_Init in this process, as a test that imports mpi4py.MPI
# in-process does) sets its PMIx and ORTE variables in the C environment, which every
# child inherits: an mpiexec a later test starts then exits with status 1 and prints nothing
# (bench/results/gpu-tests-h200/open-mpi-singleton.txt). Python's os.environ never had them.
_SINGLETON_PREFIXES = ("OMPI_", "PMIX_", "ORTE_", "OPAL_", "HWLOC_", "HFI_", "IPATH_")


def _set_by_c_code() -> list[str]:
    """Names in the process's C environment that os.environ lacks (set there by C code)."""
    try:
        environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):  # no C `environ` symbol to read (not glibc)
        return []
    names, i = [], 0
    while environ[i]:
        names.append(environ[i].split(b"=", 1)[0].decode(errors="replace"))
        i += 1
    return [name for name in names if name not in os.environ]


def pytest_runtest_teardown(item, nextitem):
    if "mpi4py.MPI" in sys.modules:  # importing it initializes MPI
        for name in _set_by_c_code():
            if name.startswith(_SINGLETON_PREFIXES):
                os.unsetenv(name)


def pinned_triton_configs() -> list:
    """One config of each of triton_fused's real autotune lists, the smallest tiles of each:
    ``CONFIGS_16BIT[-1]`` (fp16, bf16), ``CONFIGS_TF32[-1]`` and ``CONFIGS_FP32[-1]`` (IEEE
    fp32)."""
    from backends import triton_fused

    return [triton_fused.CONFIGS_16BIT[-1], triton_fused.CONFIGS_TF32[-1],
            triton_fused.CONFIGS_FP32[-1]]


@pytest.fixture(autouse=True)
def one_triton_config(request, monkeypatch):
    """On a GPU, autotuning each odd test shape would compile every config for every
    specialization (minutes); tests pin one config per operand type unless marked
    ``autotune`` (those run the real autotuner over every config). The pinned autotuner
    holds ``pinned_triton_configs()`` and prunes them as the real one does
    (``triton_fused._prune``: CONFIGS_16BIT for fp16 and bf16, CONFIGS_TF32, CONFIGS_FP32 for
    IEEE fp32), so each call runs a config of its own dtype's list; left with one config, Triton's
    autotuner launches it without benchmarking. The launch path is unchanged."""
    if HAS_GPU and "autotune" not in request.keywords:
        from backends import triton_fused

        pinned = triton_fused.autotuned(pinned_triton_configs())
        monkeypatch.setattr(triton_fused, "tuned_kernel", pinned)


@pytest.fixture
def rng():
    """A fresh, seeded generator per test: random inputs, reproducible failures."""
    return torch.Generator().manual_seed(1234)


def random_inputs(m, n, k, dtype=torch.float32, device="cpu", c_kind="full", generator=None):
    """Standard-normal A (M, K), B (K, N) and C: ``"full"`` (M, N), ``"bias"`` (N,) or None."""
    def randn(*shape):
        return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    c = {"full": lambda: randn(m, n), "bias": lambda: randn(n), None: lambda: None}[c_kind]()
    return randn(m, k), randn(k, n), c


# Unit roundoff of the storage formats; TF32 keeps fp16's 10-bit mantissa.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
TF32_ROUNDOFF = 2.0**-11


def assert_matches_reference(d, a, b, c, activation, allow_tf32=False):
    """Every element of D is finite and within the worst-case rounding bound of float64.

    The bound is Higham's for an inner product, |fl(A @ B) - A @ B| <= gamma_K |A| @ |B|
    (Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 3.1 and 3.5), with fp32
    accumulation, plus the rounding of D (and of TF32 operands), so it holds for any
    correct kernel on any input, even where the result cancels to almost nothing (where a
    relative error would be meaningless), while a wrong or missing term, or one bad
    element, exceeds it. ReLU is 1-Lipschitz, so the bound carries through it. A D in the
    subnormal range rounds by an absolute amount instead, at most half the spacing of its
    subnormals (Higham's model with underflow, sec. 2.2: fl(x) = x(1 + delta) + eta with
    |eta| <= lambda u, lambda the smallest normal number); with K = 1 a product of two
    small fp16 operands lands there.
    """
    ref = backends.reference(a, b, c, activation)
    assert d.shape == ref.shape
    assert torch.isfinite(d).all(), "D holds NaN/inf: an element was not written"
    k = a.shape[1]
    u_out = UNIT_ROUNDOFF[d.dtype]
    u_in = TF32_ROUNDOFF if allow_tf32 else 0.0
    scale = a.double().abs() @ b.double().abs()
    if c is not None:
        scale = scale + c.double().abs()
    info = torch.finfo(d.dtype)
    bound = ((2 * k * UNIT_ROUNDOFF[torch.float32] + 4 * u_out + 4 * u_in) * scale
             + info.smallest_normal * info.eps / 2)
    error = (d.double() - ref).abs()
    worst = int((error - bound).argmax()) if error.numel() else 0
    assert error.numel() == 0 or (error <= bound).all(), (
        f"element {divmod(worst, d.shape[1])} is off by {error.flatten()[worst]:.3e}, bound "
        f"{bound.flatten()[worst]:.3e}; relative Frobenius error "
        f"{backends.relative_error(d, ref):.3e}")
