// Ladder step 3, cuda_regblock: register blocking (2D block tiling).
//
// A block of (BLOCK_M/TM) x (BLOCK_N/TN) threads computes a BLOCK_M x BLOCK_N tile of D and
// each thread owns a TM x TN sub-tile of it, accumulated in registers. Per step k of the
// shared-memory tile a thread loads TM values of A and TN values of B into registers and
// does TM*TN multiply-adds with them: TM*TN/(TM+TN) = 4 FMAs per shared-memory load at 8x8,
// against 0.5 in cuda_smem, so the kernel moves from shared-memory-bound towards FMA-bound.
//
// Layout choices that make the register loads cheap:
// - A is stored transposed (k-major) in shared memory, so a thread's values of A are
//   contiguous like its values of B and are read with 16-byte loads (LDS.128); A's rows are
//   padded so that the transposing stores do not pile onto one bank.
// - A thread's TM x TN sub-tile is four TM/2 x TN/2 quadrants, BLOCK_M/2 rows and
//   BLOCK_N/2 columns apart, not one contiguous block: the 8 threads of a quarter warp then
//   read 8 consecutive 16-byte chunks of a shared-memory row (128 contiguous bytes, no bank
//   conflict), where contiguous 8-wide sub-tiles would put two threads on the same banks.
//   On the H200: 29.3 TFLOP/s at 4096^3 with ReLU(A @ B + C) (bench/results/h200-ladder-fp32,
//   2026-11-24); the figure for contiguous sub-tiles was not recorded.
// Global loads stay scalar (one float per thread per load); widening them is the next step.
// Follows the structure of siboehm/SGEMM_CUDA kernel 5 ("2D blocktiling").
#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef BLOCK_K
#define BLOCK_K 8
#endif
#ifndef TM
#define TM 8  // rows of D per thread
#endif
#ifndef TN
#define TN 8  // columns of D per thread
#endif
#define THREADS ((BLOCK_M / TM) * (BLOCK_N / TN))
#define A_PAD 4  // keeps rows 16-byte aligned and spreads the transposing stores over banks
#define HALF_TM (TM / 2)
#define HALF_TN (TN / 2)

static_assert(BLOCK_M % TM == 0 && BLOCK_N % TN == 0, "tile must split into TM x TN sub-tiles");
static_assert(TM % 2 == 0 && TN % 2 == 0, "a sub-tile is two halves in each dimension");
static_assert((BLOCK_M * BLOCK_K) % THREADS == 0 && (BLOCK_K * BLOCK_N) % THREADS == 0,
              "each thread loads the same number of tile elements");

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_regblock(const float* __restrict__ A, const float* __restrict__ B,
              const float* __restrict__ C, float* __restrict__ D,
              int M, int N, int K, long long ldc, int relu) {
    __shared__ __align__(16) float As[BLOCK_K][BLOCK_M + A_PAD];  // As[k][m] = A[m0 + m][k0 + k]
    __shared__ __align__(16) float Bs[BLOCK_K][BLOCK_N];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    // This thread owns rows row0 + [0, HALF_TM) and BLOCK_M/2 + row0 + [0, HALF_TM) of the
    // tile, and likewise for columns.
    const int row0 = threadIdx.y * HALF_TM;
    const int col0 = threadIdx.x * HALF_TN;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;

    float acc[TM][TN] = {};
    float a_reg[TM], b_reg[TN];
    for (int k0 = 0; k0 < K; k0 += BLOCK_K) {
        // Consecutive threads read consecutive k of one row of A and consecutive n of one
        // row of B (coalesced); out-of-range elements are staged as zeros.
#pragma unroll
        for (int i = tid; i < BLOCK_M * BLOCK_K; i += THREADS) {
            const int m = i / BLOCK_K, k = i % BLOCK_K;
            As[k][m] = (m0 + m < M && k0 + k < K) ? A[(long long)(m0 + m) * K + k0 + k] : 0.0f;
        }
#pragma unroll
        for (int i = tid; i < BLOCK_K * BLOCK_N; i += THREADS) {
            const int k = i / BLOCK_N, n = i % BLOCK_N;
            Bs[k][n] = (k0 + k < K && n0 + n < N) ? B[(long long)(k0 + k) * N + n0 + n] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BLOCK_K; ++k) {
#pragma unroll
            for (int i = 0; i < HALF_TM; ++i) {
                a_reg[i] = As[k][row0 + i];
                a_reg[HALF_TM + i] = As[k][BLOCK_M / 2 + row0 + i];
            }
#pragma unroll
            for (int j = 0; j < HALF_TN; ++j) {
                b_reg[j] = Bs[k][col0 + j];
                b_reg[HALF_TN + j] = Bs[k][BLOCK_N / 2 + col0 + j];
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a_reg[i], b_reg[j], acc[i][j]);
        }
        __syncthreads();  // the tiles are overwritten next step
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + row0 + (i < HALF_TM ? i : BLOCK_M / 2 + i - HALF_TM);
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + col0 + (j < HALF_TN ? j : BLOCK_N / 2 + j - HALF_TN);
            if (m < M && n < N) D[(long long)m * N + n] = gemm_epilogue(acc[i][j], C, ldc, m, n, relu);
        }
    }
}
