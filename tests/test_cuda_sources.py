"""Every ``.cu`` of the ladder compiles with nvcc for sm_90 with the registry's tile sizes, for
each dtype it is built for, and ptxas reports no register spills and no stack frame (spills
would put a kernel's accumulators in local memory, defeating register blocking)."""

import re
import shutil
import subprocess

import pytest

from backends import BACKENDS
from backends.cuda import SOURCE_DIR, CudaKernel, compile_options
from backends.registry import CUDA_KERNELS

NVCC = shutil.which("nvcc")


KERNEL_DTYPES = [(name, dtype) for name, kernel in sorted(CUDA_KERNELS.items())
                 for dtype in kernel.dtypes]


def ptxas_report(kernel: CudaKernel, dtype, tmp_path) -> str:
    cmd = [NVCC, "-cubin", "-Xptxas", "-v", *compile_options("sm_90", kernel.defines(dtype)),
           "-o", str(tmp_path / "k.cubin"), str(SOURCE_DIR / kernel.source)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_every_cu_file_is_a_backend():
    sources = sorted(p.name for p in SOURCE_DIR.glob("*.cu"))
    assert sources == sorted(k.source for k in CUDA_KERNELS.values())
    assert set(CUDA_KERNELS) <= set(BACKENDS)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name,dtype", KERNEL_DTYPES,
                         ids=[f"{n}-{str(d)[6:]}" for n, d in KERNEL_DTYPES])
def test_compiles_for_sm_90_without_spills(name, dtype, tmp_path):
    kernel = CUDA_KERNELS[name]
    report = ptxas_report(kernel, dtype, tmp_path)
    assert f"Compiling entry function '{kernel.name}' for 'sm_90'" in report
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills, report
    assert all(stores == "0" and loads == "0" for stores, loads in spills), report
    frames = re.findall(r"(\d+) bytes stack frame", report)
    assert frames and all(f == "0" for f in frames), report
