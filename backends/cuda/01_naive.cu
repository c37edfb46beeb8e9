// Ladder step 1, cuda_naive: one thread per element of D.
//
// Each thread walks row m of A and column n of B in global memory and keeps the running sum
// in a register. threadIdx.x runs along N, so a warp's loads of B and stores of D are
// coalesced and its loads of A are a broadcast. Nothing is reused on chip beyond what the
// L1/L2 caches happen to keep: every multiply-add needs two loads, so the kernel is bound by
// load throughput, a few TFLOP/s, far below the FP32 peak.
#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 16  // rows of D per thread block (threadIdx.y)
#endif
#ifndef BLOCK_N
#define BLOCK_N 16  // columns of D per thread block (threadIdx.x)
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_M * BLOCK_N)
gemm_naive(const float* __restrict__ A, const float* __restrict__ B,
           const float* __restrict__ C, float* __restrict__ D,
           int M, int N, int K, long long ldc, int relu) {
    const int n = blockIdx.x * BLOCK_N + threadIdx.x;
    const int m = blockIdx.y * BLOCK_M + threadIdx.y;
    if (m >= M || n >= N) return;
    const float* a = A + (long long)m * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(a[k], B[(long long)k * N + n], acc);
    D[(long long)m * N + n] = gemm_epilogue(acc, C, ldc, m, n, relu);
}
