"""Every ``.cu`` of the ladder compiles with nvcc for sm_90 (sm_90a for the wgmma kernel) with
the registry's tile sizes, for each dtype it is built for, and ptxas reports no register
spills and no stack frame (spills would put a kernel's accumulators in local memory, defeating
register blocking), nor serialized or waited-for wgmma instructions."""

import re
import shutil
import subprocess

import pytest
import torch

from backends import BACKENDS
from backends.cuda import SOURCE_DIR, CudaKernel, compile_options
from backends.registry import CUDA_KERNELS

NVCC = shutil.which("nvcc")


KERNEL_DTYPES = [(name, dtype) for name, kernel in sorted(CUDA_KERNELS.items())
                 for dtype in kernel.dtypes]


def ptxas_report(kernel: CudaKernel, dtype, tmp_path) -> str:
    arch = "sm_90" + kernel.arch_suffix
    cmd = [NVCC, "-cubin", "-Xptxas", "-v", *compile_options(arch, kernel.defines(dtype)),
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
    assert f"Compiling entry function '{kernel.name}' for 'sm_90{kernel.arch_suffix}'" in report
    # ptxas serializes wgmma, or waits for it, when registers it writes are touched while it
    # is in flight (infos C7515 "Potential Performance Loss", C7517 "warpgroup.wait is
    # injected"): the asynchrony the kernel is built on would be gone.
    assert "Potential Performance Loss" not in report, report
    assert "warpgroup.wait is injected" not in report, report
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills, report
    assert all(stores == "0" and loads == "0" for stores, loads in spills), report
    frames = re.findall(r"(\d+) bytes stack frame", report)
    assert frames and all(f == "0" for f in frames), report


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_wgmma_kernel_needs_sm_90a(tmp_path):
    """Built for plain sm_90 the kernel does not compile: ptxas names the instructions that
    need the arch-specific target (why CudaKernel(tma=True) builds for sm_90a)."""
    kernel = CUDA_KERNELS["cuda_wgmma"]
    cmd = [NVCC, "-cubin", *compile_options("sm_90", kernel.defines(torch.float16)),
           "-o", str(tmp_path / "k.cubin"), str(SOURCE_DIR / kernel.source)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "Instruction 'wgmma.mma_async" in result.stderr
    assert "not supported on .target 'sm_90'" in result.stderr
