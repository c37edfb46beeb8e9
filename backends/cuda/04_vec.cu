// Ladder step 4, cuda_vec: 128-bit global loads and shared-memory stores.
//
// The structure of cuda_regblock (a THREADS-thread block computes a BLOCK_M x BLOCK_N tile of
// D, each thread a TM x TN sub-tile in registers), with the tile loads widened: a thread reads
// 4 consecutive floats of a row of A or B with one 16-byte load (LDG.128) instead of four
// 4-byte ones, and writes B's four to shared memory with one STS.128. That is 4x fewer load
// instructions and address computations for the same bytes, which matters once register
// blocking has made the inner loop cheap. siboehm/SGEMM_CUDA kernel 6 ("vectorize") did the
// same and measured a clear gain over its kernel 5.
//
// Layouts:
// - As[k][m] holds A transposed (k-major), so a thread's values of A at one k are contiguous
//   and read with LDS.128, like B's. The float4 of A (4 consecutive k of one row) is
//   scattered into 4 rows of As by scalar stores. Its rows are padded by A_PAD = 4 floats
//   (still 16-byte aligned) and a warp loads 2 float4s of each of 16 rows (A_PAIR), so each
//   of its transposing stores writes 16 consecutive m in two rows of As 4 apart, that is
//   4 * (BLOCK_M + 4) = 16 (mod 32) banks apart: 32 distinct banks, no conflict.
// - A thread's TM rows are TM/4 groups of 4 consecutive rows, the groups 4 * BLOCK_M / TM
//   rows apart (at TM = 8: two halves BLOCK_M/2 apart, cuda_regblock's quadrants); likewise
//   for its TN columns. In the inner loop the 8 threads of a quarter warp then read 8
//   consecutive float4s of a row of Bs (128 contiguous bytes, all 32 banks once) and one
//   float4 of As (a broadcast): no bank conflict on any load of the inner loop.
// - 16-byte loads need 16-byte aligned addresses: a row of A is aligned only if K % 4 == 0,
//   a row of B only if N % 4 == 0 (the base pointers are checked too). One uniform branch
//   per launch picks the float4 path (pointers stepped along k, one predicate per float4:
//   a float4 is wholly inside A or B or wholly outside) or four checked scalar loads per
//   float4 otherwise: correct at any M, N, K, fast when K and N are multiples of 4.
//   Elements outside A and B are staged as zeros, so partial tiles need no special case.
// BLOCK_K stays at 8 here, as in cuda_regblock, to isolate the technique. Measured numbers:
// the README's ladder tables (bench/results/h200-ladder-fp32).
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
#ifndef THREADS
#define THREADS ((BLOCK_M / TM) * (BLOCK_N / TN))
#endif
#define M_GAP (4 * BLOCK_M / TM)           // rows between a thread's groups of 4 rows
#define N_GAP (4 * BLOCK_N / TN)           // columns between its groups of 4 columns

static_assert(THREADS == (BLOCK_M / TM) * (BLOCK_N / TN), "THREADS must be (BLOCK_M/TM)*(BLOCK_N/TN)");
static_assert(BLOCK_M % TM == 0 && BLOCK_N % TN == 0, "tile must split into TM x TN sub-tiles");

#include "float4_tiles.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_vec(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
         const elem_t* __restrict__ C, elem_t* __restrict__ D,
         int M, int N, int K, long long ldc, int relu) {
    // This thread owns rows ty*4 + g*M_GAP + [0, 4) and columns tx*4 + h*N_GAP + [0, 4).
    const int tx = threadIdx.x % (BLOCK_N / TN);
    const int ty = threadIdx.x / (BLOCK_N / TN);
    gemm_float4_tiles<M_GAP, N_GAP>(A, B, C, D, M, N, K, ldc, relu, ty * 4, tx * 4);
}
