"""Every ``.cu`` of the ladder compiles with nvcc for sm_90 with the registry's tile sizes,
and ptxas reports no register spills for cuda_regblock (spills would put its TM x TN
accumulators in local memory, defeating register blocking)."""

import re
import shutil
import subprocess

import pytest

from backends import BACKENDS
from backends.cuda import SOURCE_DIR, CudaKernel, compile_options
from backends.registry import CUDA_KERNELS

NVCC = shutil.which("nvcc")


def ptxas_report(kernel: CudaKernel, tmp_path) -> str:
    cmd = [NVCC, "-cubin", "-Xptxas", "-v", *compile_options("sm_90", kernel.defines()),
           "-o", str(tmp_path / "k.cubin"), str(SOURCE_DIR / kernel.source)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_every_cu_file_is_a_backend():
    sources = sorted(p.name for p in SOURCE_DIR.glob("*.cu"))
    assert sources == sorted(k.source for k in CUDA_KERNELS.values())
    assert set(CUDA_KERNELS) <= set(BACKENDS)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", sorted(CUDA_KERNELS))
def test_compiles_for_sm_90(name, tmp_path):
    kernel = CUDA_KERNELS[name]
    report = ptxas_report(kernel, tmp_path)
    assert f"Compiling entry function '{kernel.name}' for 'sm_90'" in report


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_regblock_does_not_spill(tmp_path):
    report = ptxas_report(CUDA_KERNELS["cuda_regblock"], tmp_path)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills, report
    assert all(stores == "0" and loads == "0" for stores, loads in spills), report
    frames = re.findall(r"(\d+) bytes stack frame", report)
    assert frames and all(f == "0" for f in frames), report
