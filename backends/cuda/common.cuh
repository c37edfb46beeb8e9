// Shared by every CUDA C kernel of the ladder: the fused epilogue D = act(acc + C).
#pragma once

// C is optional (nullptr) and is either a full row-major (M, N) matrix (ldc = N) or a
// length-N bias broadcast over the rows of D (ldc = 0). The comparison is written so that
// a NaN stays NaN, as in torch.relu: an error upstream is never hidden by the epilogue.
__device__ __forceinline__ float gemm_epilogue(float acc, const float* __restrict__ C,
                                               long long ldc, int m, int n, int relu) {
    if (C != nullptr) acc += C[m * ldc + n];
    return (relu && acc < 0.0f) ? 0.0f : acc;
}
