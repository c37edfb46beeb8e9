"""Profiling: NVTX ranges (``nvtx``), Nsight Compute and Nsight Systems sessions with their
reports parsed (``ncu``, ``nsys``), the CUDA toolkit's locations (``cuda_toolkit``), and what
the NVTX ranges cost (``overhead``)."""
