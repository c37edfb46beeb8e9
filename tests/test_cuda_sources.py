"""Every ``.cu`` of the ladder is a registry entry and opens with its ladder step; it compiles
with nvcc for sm_90 (sm_90a for the wgmma kernel) with the registry's tile sizes (and the other
builds whose code the defaults leave out: step 10's STREAM_K), for each dtype it is built for,
and ptxas reports no register spills and no stack frame (spills would put a
kernel's accumulators in local memory, defeating register blocking), nor serialized or
waited-for wgmma instructions. A kernel's description (what its backend's ``config()`` and a
bench row report) names the build that ran."""

import re
import shutil
import subprocess
from dataclasses import replace

import pytest
import torch

from backends import BACKENDS
from backends.cuda import SOURCE_DIR, CudaKernel, compile_options
from backends.cuda.sources import declares_dynamic_smem
from backends.registry import CUDA_KERNELS

NVCC = shutil.which("nvcc")


KERNEL_DTYPES = [(name, dtype) for name, kernel in sorted(CUDA_KERNELS.items())
                 for dtype in kernel.dtypes]
# Builds other than the defaults whose code paths the defaults do not compile.
OTHER_BUILDS = {"cuda_wgmma_persistent-stream-k": ("cuda_wgmma_persistent", {"STREAM_K": 1})}
BUILD_DTYPES = ([(name, name, {}, dtype) for name, dtype in KERNEL_DTYPES] +
                [(build, name, params, dtype) for build, (name, params) in OTHER_BUILDS.items()
                 for dtype in CUDA_KERNELS[name].dtypes])


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


def test_every_cu_file_opens_with_its_ladder_step():
    """Step n of the CUDA C ladder is ``0n_*.cu``, whose first line names the step, the
    backend and the technique it adds."""
    for step, (name, kernel) in enumerate(CUDA_KERNELS.items(), start=1):
        assert kernel.source.startswith(f"{step:02d}_"), kernel.source
        header = (SOURCE_DIR / kernel.source).read_text().splitlines()[0]
        assert re.fullmatch(rf"// Ladder step {step}, {name}: \S.*", header), header


def test_a_description_names_the_build_that_ran():
    """``described`` reads back ``description()`` (with or without the tuning note that
    ``config()`` adds): the default tile sizes and a tuned build alike."""
    for kernel in CUDA_KERNELS.values():
        builds = [kernel] + ([replace(kernel, params=kernel.space.candidates()[0])]
                             if kernel.space else [])
        for build in builds:
            text = build.description()
            assert text.startswith(f"{kernel.source} -D")
            assert kernel.described(text) == build
            note = "tuned: tuned.json entry for NVIDIA H200 fp16 bucket 4096x4096x4096 (-DX=1)"
            assert kernel.described(f"{text} ({note})") == build
    naive, smem = CUDA_KERNELS["cuda_naive"], CUDA_KERNELS["cuda_smem"]
    for text, why in [(smem.description(), "does not describe a build of 01_naive.cu"),
                      ("", "does not describe a build of 01_naive.cu"),
                      ("01_naive.cu -DGEMM_FP16", "'-DGEMM_FP16' is not a -DNAME=value"),
                      ("01_naive.cu BLOCK_M=16", "'BLOCK_M=16' is not a -DNAME=value")]:
        with pytest.raises(ValueError, match=why):
            naive.described(text)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name,params,dtype", [b[1:] for b in BUILD_DTYPES],
                         ids=[f"{b}-{str(d)[6:]}" for b, _, _, d in BUILD_DTYPES])
def test_compiles_for_sm_90_without_spills(name, params, dtype, tmp_path):
    kernel = replace(CUDA_KERNELS[name], params={**CUDA_KERNELS[name].params, **params})
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
    # The launchers request dynamic shared memory where declares_dynamic_smem says the
    # source (or a file it includes) declares gemm_dynamic_smem: the build must agree.
    cubin = (tmp_path / "k.cubin").read_bytes()
    assert (b"gemm_dynamic_smem" in cubin) == declares_dynamic_smem(kernel.source)


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


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", [n for n, k in CUDA_KERNELS.items() if not k.tma])
def test_the_rungs_marked_sm80_are_those_that_need_it(name, tmp_path):
    """Built for sm_75, a rung marked ``sm80`` fails for one of its dtypes at least (cp.async,
    bf16 tensor-core instructions), and the others build for every dtype: on an older GPU
    ``gemm()`` then says which rungs cannot run instead of failing to compile."""
    kernel = CUDA_KERNELS[name]
    built = []
    for dtype in kernel.dtypes:
        cmd = [NVCC, "-cubin", *compile_options("sm_75", kernel.defines(dtype)),
               "-o", str(tmp_path / "k.cubin"), str(SOURCE_DIR / kernel.source)]
        built.append(subprocess.run(cmd, capture_output=True, text=True,
                                    timeout=300).returncode == 0)
    assert (not all(built)) == kernel.sm80, built
    assert BACKENDS[name].unavailable.__name__ == (
        "sm80_unavailable_reason" if kernel.sm80 else "cuda_unavailable_reason")


@pytest.mark.parametrize("capability,sm80,sm90a", [
    ((7, 5), "needs compute capability 8.0 or newer (cp.async, bf16 tensor-core instructions); "
             "this one is 7.5", "needs a compute capability 9.0 GPU"),
    ((8, 9), None, "needs a compute capability 9.0 GPU (sm_90a: wgmma, TMA); this one is 8.9"),
    ((9, 0), None, None)])
def test_what_each_rung_needs_of_the_gpu(monkeypatch, capability, sm80, sm90a):
    from backends import cuda

    monkeypatch.setattr(cuda, "cuda_unavailable_reason", lambda: None)  # a GPU, faked
    monkeypatch.setattr(cuda, "_capability", lambda device: capability)
    assert cuda.sm80_unavailable_reason(0) == sm80
    assert (cuda.sm90a_unavailable_reason(0) or "").startswith(sm90a or "")
    assert (cuda.sm90a_unavailable_reason(0) is None) == (sm90a is None)
