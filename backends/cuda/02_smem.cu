// Ladder step 2, cuda_smem: shared-memory tiling.
//
// A BLOCK_M x BLOCK_N thread block computes one tile of D, one element per thread. For each
// step of BLOCK_K along K it stages a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N
// tile of B in shared memory (one element of each per thread), then every thread reads its
// row and column from shared memory. Each element of A and B now leaves global memory once
// per thread block instead of once per thread, a BLOCK-fold cut in global traffic. The inner
// loop still does two shared-memory loads per multiply-add (one a broadcast), so it is bound
// by shared-memory bandwidth: the next step, register blocking, attacks exactly that.
#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 32
#endif
#ifndef BLOCK_N
#define BLOCK_N 32
#endif
#ifndef BLOCK_K
#define BLOCK_K 32
#endif
// One element of each input tile per thread.
static_assert(BLOCK_M == BLOCK_N && BLOCK_N == BLOCK_K, "cuda_smem needs square tiles");

extern "C" __global__ void __launch_bounds__(BLOCK_M * BLOCK_N)
gemm_smem(const float* __restrict__ A, const float* __restrict__ B,
          const float* __restrict__ C, float* __restrict__ D,
          int M, int N, int K, long long ldc, int relu) {
    __shared__ float As[BLOCK_M][BLOCK_K];
    __shared__ float Bs[BLOCK_K][BLOCK_N];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int n = blockIdx.x * BLOCK_N + tx;
    const int m = blockIdx.y * BLOCK_M + ty;

    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BLOCK_K) {
        // Out-of-range elements are staged as zeros, so the inner loop needs no masks.
        As[ty][tx] = (m < M && k0 + tx < K) ? A[(long long)m * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && n < N) ? B[(long long)(k0 + ty) * N + n] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BLOCK_K; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
        __syncthreads();  // the tiles are overwritten next step
    }
    if (m < M && n < N) D[(long long)m * N + n] = gemm_epilogue(acc, C, ldc, m, n, relu);
}
