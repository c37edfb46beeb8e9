"""gemmlab: D = ReLU(A @ B + C) from a naive CUDA kernel to a tensor-parallel layer, measured."""

from setuptools import setup

setup(
    name="gemmlab",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=["backends", "backends.cuda", "bench", "profiling", "tp", "tp.comm"],
    package_data={"backends": ["tuned.json"], "backends.cuda": ["*.cu", "*.cuh"],
                  "tp.comm": ["*.cu"]},
    install_requires=[
        "torch>=2.9",  # torch.backends.cuda.matmul.fp32_precision
        "triton>=3.4",  # TensorDescriptor, triton.knobs
        "numpy",
        "nvtx",
        "rich",
        "matplotlib",
    ],
    extras_require={
        # nvmath-python: the cublaslt baseline (cuBLASLt's fused epilogues)
        "cuda12": ["cupy-cuda12x>=13", "nvmath-python[cu12]>=1.0"],
        "cuda13": ["cupy-cuda13x>=13", "nvmath-python[cu13]>=1.0"],
        "pycuda": ["pycuda", "cuda-bindings>=12.4"],  # cuFuncGetParamInfo
        "mpi": ["mpi4py>=4", "mpich"],
        "dev": ["pytest>=8", "pytest-timeout", "pytest-xdist", "hypothesis", "ruff"],
    },
    entry_points={"console_scripts": ["gemmlab = bench.cli:main"]},
)
