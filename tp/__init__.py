"""Tensor parallelism over mpi4py (to come): the DP x TP process grid, the communicators
(native MPI, a from-scratch ring, NCCL), ColumnParallelLinear / RowParallelLinear with
forward and backward, compute/communication overlap on CUDA streams, a TP transformer
layer and a small training run."""
