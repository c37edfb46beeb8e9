"""Tensor parallelism over mpi4py.

- ``tp.grid``: the DP x TP process grid (model-major) and ``split_data``.
- ``tp.mpi``: abort on the first exception, GPU binding, CUDA-aware MPI detection.
- ``tp.comm``: one communicator interface over native MPI, the from-scratch ring (over MPI
  or NCCL), NCCL, and symmetric memory (``symm``: an MPI shared-memory window on the CPU,
  CUDA IPC on GPUs).
- ``tp.layers``: ColumnParallelLinear / RowParallelLinear, forward and backward, with
  compute/communication overlap on CUDA streams (``tp.functional`` holds the gather/scatter
  operators, ``tp.overlap`` the chunked all-gather + GEMM and GEMM + reduce-scatter of
  sequence parallelism).
- ``tp.transformer``: the TP transformer layer and a small GPT; ``tp.train``: its DP x TP
  training loop; ``tp.checkpoint``: its checkpoints; ``tp.generate``: sampling from it.
"""
