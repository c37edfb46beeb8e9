"""Profiling helpers: NVTX ranges now; Nsight Compute / Nsight Systems runners and their
report parsers, and roofline ceilings, come with the profiling issue."""
