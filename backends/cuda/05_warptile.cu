// Ladder step 5, cuda_warptile: a warp-level tile between the block tile and the thread tile.
//
// The BLOCK_M x BLOCK_N block tile is split among the block's warps into WARP_M x WARP_N warp
// tiles, and each warp tile among its 32 lanes, LANES_M x LANES_N of them. A lane owns
// TM x TN elements of D as WM_ITER x WN_ITER = (TM/4) x (TN/4) blocks of 4 x 4: the warp
// sweeps its tile in WM_ITER x WN_ITER sub-tiles of (4*LANES_M) x (4*LANES_N), one 4 x 4
// block per lane each (siboehm's WMITER/WNITER with a 4 x 4 thread sub-tile).
// What it buys over cuda_vec, whose threads are spread over the whole block tile:
// - A warp's shared-memory reads at one k touch only WARP_M + WARP_N values (96 here), so
//   an LDS.128 has at most 8 distinct 16-byte addresses in A and in B, the rest broadcast:
//   the block -> warp -> thread hierarchy of CUTLASS that tensor-core kernels keep later.
// - BLOCK_K = 16: per k a lane does TM*TN = 64 FMAs for (TM + TN)/4 = 4 LDS.128, and the
//   two barriers and the tile loads are paid once per 16 steps of k instead of 8.
// - Occupancy at the defaults: 256 threads x 128 registers = 32K registers and 16.3 KiB of
//   shared memory per block, so two blocks (16 warps) share an SM of 64K registers; while
//   one waits at a barrier or for its global loads, the other computes.
// Layouts, as in cuda_vec (which gives the reasoning): As[k][m] is A transposed, rows padded
// by 4 floats, written by conflict-free scalar stores; Bs[k][n] is B as loaded, one STS.128
// per float4; inner-loop reads are float4s at consecutive 16-byte offsets of one row of As
// or Bs, or the same one (broadcast): no bank conflicts. One uniform branch per launch picks
// 16-byte loads (rows of A and B 16-byte aligned: K % 4 == 0 and N % 4 == 0) or per-element
// checked loads; zeros outside A and B.
// Much of the gain over cuda_vec's defaults is BLOCK_K = 16 (measured numbers: the README's
// ladder tables, bench/results/h200-ladder-fp32). The step that pays off the warp tiling is
// cuda_pipelined.
// Follows siboehm/SGEMM_CUDA kernel 10 ("warptiling") and the thread block / warp / thread
// tiling of CUTLASS's "Efficient GEMM in CUDA" documentation.
#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef BLOCK_K
#define BLOCK_K 16
#endif
#ifndef WARP_M
#define WARP_M 64  // rows of D per warp
#endif
#ifndef WARP_N
#define WARP_N 32  // columns of D per warp
#endif
#ifndef TM
#define TM 8  // rows of D per thread
#endif
#ifndef TN
#define TN 8  // columns of D per thread
#endif
#ifndef THREADS
#define THREADS (32 * (BLOCK_M / WARP_M) * (BLOCK_N / WARP_N))
#endif
#define LANES_M (WARP_M / TM)              // lanes along M in a warp
#define LANES_N (WARP_N / TN)              // lanes along N in a warp

static_assert(BLOCK_M % WARP_M == 0 && BLOCK_N % WARP_N == 0, "block tile must split into warp tiles");
static_assert(THREADS == 32 * (BLOCK_M / WARP_M) * (BLOCK_N / WARP_N),
              "THREADS must be 32 * (BLOCK_M/WARP_M) * (BLOCK_N/WARP_N)");
static_assert(WARP_M % TM == 0 && WARP_N % TN == 0 && LANES_M * LANES_N == 32,
              "the 32 lanes must tile the warp tile: (WARP_M/TM) * (WARP_N/TN) == 32");

#include "float4_tiles.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_warptile(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
              const elem_t* __restrict__ C, elem_t* __restrict__ D,
              int M, int N, int K, long long ldc, int relu) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // This thread owns rows row0 + g*4*LANES_M + [0, 4) for g < TM/4 and columns
    // col0 + h*4*LANES_N + [0, 4) for h < TN/4 of the block tile.
    const int row0 = (warp / (BLOCK_N / WARP_N)) * WARP_M + (lane / LANES_N) * 4;
    const int col0 = (warp % (BLOCK_N / WARP_N)) * WARP_N + (lane % LANES_N) * 4;
    gemm_float4_tiles<4 * LANES_M, 4 * LANES_N>(A, B, C, D, M, N, K, ldc, relu, row0, col0);
}
