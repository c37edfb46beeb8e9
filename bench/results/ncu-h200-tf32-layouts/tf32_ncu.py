"""triton_fused's TF32 pointer kernel at 4096^3 (128x256x32, 8 warps, 3 stages), B row-major and
K-major, each launched once inside its own gemmlab NVTX range, for ncu."""
import torch, triton
from backends import triton_fused as tf
from backends.problem import Problem
from profiling.nvtx import annotate

n = 4096
a, b, c = (torch.randn(n, n, device="cuda") for _ in range(3))
kmajor = b.t().contiguous().t()
flags = {"HAS_C": True, "RELU": True, "INPUT_PRECISION": "tf32"}
tiles = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=32, GROUP_M=8, EVEN_K=True)
grid = (triton.cdiv(n, 128) * triton.cdiv(n, 256),)
for name, bb in (("tf32-b-row-major", b), ("tf32-b-k-major", kmajor)):
    out = torch.empty_like(c)
    args = tf._pointer_args(Problem.of(a, bb, c, True, True), tiles, flags, a, bb, c, out)
    tf.fused_gemm_kernel[grid](*args, **tiles, num_warps=8, num_stages=3)  # compiles
    torch.cuda.synchronize()
    with annotate(name):
        tf.fused_gemm_kernel[grid](*args, **tiles, num_warps=8, num_stages=3)
    torch.cuda.synchronize()
    ref = torch.relu(a.double() @ b.double() + c.double())
    print(name, "rel err", float((out.double() - ref).norm() / ref.norm()))
