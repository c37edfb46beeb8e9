// Ladder step 6, cuda_pipelined: cp.async into double-buffered shared memory.
//
// cuda_warptile's warp and thread tiling, with the copies of the next tile in flight while
// the current one is multiplied. cuda_warptile loads a tile through registers, waits at a
// barrier and only then computes, so a block's FMAs stall for a global-memory latency per
// BLOCK_K step unless another block on the SM computes meanwhile. Here shared memory holds
// STAGES tiles (default 2: double buffering) filled by cp.async (sm_80+), which copies
// global -> shared without registers or waiting instructions. Step t: cp.async.wait_group
// until tile t has landed, one __syncthreads (tile t visible to all, and everyone is done
// with the buffer of tile t-1), issue tile t+STAGES-1 into that buffer and
// cp.async.commit_group, then compute tile t: one barrier per step instead of two.
//
// Layout of A. cp.async copies bytes as they are and cannot transpose A into the k-major
// tile of cuda_vec and cuda_warptile. Transposing through registers for A alone would keep
// half of the loads synchronous and their registers live, so A stays as loaded:
// - As[m][k] (k contiguous), rows padded to A_STRIDE floats, an odd number of 16-byte units
//   (20 floats at BLOCK_K = 16). One float4 of a row of As holds 4 consecutive k of one row,
//   so per 4 steps of k a thread issues TM LDS.128 for A: the same TM/4 per k as from a
//   transposed tile, paid with 4*TM registers.
// - A thread's TM rows are LANES_M apart (cuda_warptile: blocks of 4), so the LANES_M (<= 8)
//   rows a warp reads at once are consecutive and, with the odd stride, start in distinct
//   16-byte bank groups: no bank conflict. The 16-byte copies into As spread the same way.
// - Bs[k][n] is B as loaded, read as in cuda_warptile (4 x 4 blocks, float4s, no conflict).
// Bounds: the src-size operand of cp.async (0 outside A or B) zero-fills, so partial tiles
// need no special case. One uniform branch per launch: 16-byte copies (cp.async.cg, L2 only)
// when the rows of A and B are 16-byte aligned (K % 4 == 0 and N % 4 == 0), else 4-byte
// copies per element (cp.async.ca; .cg copies 16 bytes only), correct but slow.
// Tile shape: a 64 x 128 block tile of 4 warps (64 x 32 each, 8 x 8 per thread) needs about
// 168 registers per thread, so 3 blocks (12 warps, 3 x 26 KiB of shared memory) share an SM
// and overlap each other's barriers. At 128 x 128 with 8 warps (~170 registers) only one
// block fits. Measured numbers: the README's ladder tables (bench/results/h200-ladder-fp32).
// Follows the multistage cp.async mainloop of CUTLASS (sm80 pipelines), siboehm/SGEMM_CUDA
// kernels 11-12 ("double buffering"), and the PTX ISA on cp.async, cp.async.commit_group
// and cp.async.wait_group.
#include "common.cuh"

#ifndef BLOCK_M
#define BLOCK_M 64
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
#ifndef STAGES
#define STAGES 2  // tiles of A and B in shared memory; 2 = double buffering
#endif
#ifndef THREADS
#define THREADS (32 * (BLOCK_M / WARP_M) * (BLOCK_N / WARP_N))
#endif
#define LANES_M (WARP_M / TM)              // lanes along M in a warp, and a thread's row spacing
#define LANES_N (WARP_N / TN)              // lanes along N in a warp
#define WN_ITER (TN / 4)                   // 4-column blocks per lane, 4*LANES_N columns apart
#define A_STRIDE (BLOCK_K + ((BLOCK_K / 4) % 2 == 0 ? 4 : 0))  // odd number of 16-byte units
#define A_VECS (BLOCK_M * BLOCK_K / 4 / THREADS)  // 16-byte pieces of A each thread copies per tile
#define B_VECS (BLOCK_K * BLOCK_N / 4 / THREADS)  // 16-byte pieces of B each thread copies per tile
#define SMEM_BYTES (STAGES * (BLOCK_M * A_STRIDE + BLOCK_K * BLOCK_N) * 4)

static_assert(sizeof(elem_t) == sizeof(float), "cuda_pipelined is an fp32 kernel");
static_assert(BLOCK_M % WARP_M == 0 && BLOCK_N % WARP_N == 0, "block tile must split into warp tiles");
static_assert(THREADS == 32 * (BLOCK_M / WARP_M) * (BLOCK_N / WARP_N),
              "THREADS must be 32 * (BLOCK_M/WARP_M) * (BLOCK_N/WARP_N)");
static_assert(TN % 4 == 0, "a thread's columns are 4-wide blocks read as float4s");
static_assert(WARP_M % TM == 0 && WARP_N % TN == 0 && LANES_M * LANES_N == 32,
              "the 32 lanes must tile the warp tile: (WARP_M/TM) * (WARP_N/TN) == 32");
static_assert(BLOCK_K % 4 == 0, "rows of the A tile are copied and read in 16-byte pieces");
static_assert((BLOCK_M * BLOCK_K) % (4 * THREADS) == 0 && (BLOCK_K * BLOCK_N) % (4 * THREADS) == 0,
              "each thread copies the same number of 16-byte pieces of each tile");
static_assert(STAGES >= 2, "the pipeline needs at least two buffers");
static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory <= 48 KiB");

// 16 bytes global -> shared, asynchronously; zeros instead when !valid (src-size 0: nothing
// is read, and src is then any valid address).
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0) : "memory");
}

// 4 bytes global -> shared, asynchronously; a zero instead when !valid.
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 4 : 0) : "memory");
}

// Elements [col, col+4) of row `row` of a row-major rows x cols matrix -> dst[0..4), zeros
// outside it, as four 4-byte copies: the path for rows that are not 16-byte aligned.
__device__ __forceinline__ void copy4_scalar(float* dst, const float* __restrict__ p, int rows,
                                             int cols, int row, int col) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const bool valid = row < rows && col + j < cols;
        cp_async4(dst + j, valid ? p + (long long)row * cols + col + j : p, valid);
    }
}

// The k loop: D's tile of this thread accumulated into acc. VEC: the rows of A and B are
// 16-byte aligned (the fast path); else every element is copied and checked on its own.
template <bool VEC>
__device__ __forceinline__ void mainloop(const float* __restrict__ A, const float* __restrict__ B,
                                         int M, int N, int K, float (&As)[STAGES][BLOCK_M][A_STRIDE],
                                         float (&Bs)[STAGES][BLOCK_K][BLOCK_N], float (&acc)[TM][TN],
                                         int m0, int n0, int row0, int col0) {
    const int tid = threadIdx.x;
    const int tiles = (K + BLOCK_K - 1) / BLOCK_K;
    // The pieces this thread copies are the same in every tile: piece r of A is row A_M(r),
    // columns A_K(r)..+3 of the tile; piece r of B is row B_K(r), columns B_N(r)..+3.
    // Consecutive threads take consecutive pieces of a row (coalesced). The VEC path keeps a
    // pointer per piece and moves it along k; rows past M and columns past N are clamped
    // to a valid address and copied as zeros.
#define A_M(r) ((tid + (r) * THREADS) / (BLOCK_K / 4))
#define A_K(r) (4 * ((tid + (r) * THREADS) % (BLOCK_K / 4)))
#define B_K(r) ((tid + (r) * THREADS) / (BLOCK_N / 4))
#define B_N(r) (4 * ((tid + (r) * THREADS) % (BLOCK_N / 4)))
    const float* a_src[A_VECS];
    const float* b_src[B_VECS];
    if (VEC) {
#pragma unroll
        for (int r = 0; r < A_VECS; ++r)
            a_src[r] = A + (long long)min(m0 + A_M(r), M - 1) * K + A_K(r);
#pragma unroll
        for (int r = 0; r < B_VECS; ++r)
            b_src[r] = B + (long long)B_K(r) * N + min(n0 + B_N(r), N - 4);
    }
    int k_next = 0;  // k0 of the next tile to copy

    // Issue the copies of the next tile into buffer s and step to the tile after it.
    auto load_next = [&](int s) {
#pragma unroll
        for (int r = 0; r < A_VECS; ++r) {
            if (VEC) {
                const bool valid = m0 + A_M(r) < M && k_next + A_K(r) < K;
                cp_async16(&As[s][A_M(r)][A_K(r)], valid ? a_src[r] : A, valid);
                a_src[r] += BLOCK_K;
            } else {
                copy4_scalar(&As[s][A_M(r)][A_K(r)], A, M, K, m0 + A_M(r), k_next + A_K(r));
            }
        }
#pragma unroll
        for (int r = 0; r < B_VECS; ++r) {
            if (VEC) {
                const bool valid = k_next + B_K(r) < K && n0 + B_N(r) < N;
                cp_async16(&Bs[s][B_K(r)][B_N(r)], valid ? b_src[r] : B, valid);
                b_src[r] += (long long)BLOCK_K * N;
            } else {
                copy4_scalar(&Bs[s][B_K(r)][B_N(r)], B, K, N, k_next + B_K(r), n0 + B_N(r));
            }
        }
        k_next += BLOCK_K;
    };
#undef A_M
#undef A_K
#undef B_K
#undef B_N

    // Prologue: tiles 0 .. STAGES-2 in flight, one commit group each (empty past the end, so
    // that group t always holds tile t and the wait count below stays a constant).
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < tiles) load_next(t);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }

    int s_read = 0, s_write = STAGES - 1;  // buffers of tile t and of tile t + STAGES - 1
    for (int t = 0; t < tiles; ++t) {
        // Groups 0 .. t+STAGES-2 are committed; all but the newest STAGES-2 complete means
        // tile t has landed (this thread's copies). The barrier publishes everyone's, and
        // tells that all threads are done with buffer s_write (tile t-1's), refilled next.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        __syncthreads();
        if (t + STAGES - 1 < tiles) load_next(s_write);
        asm volatile("cp.async.commit_group;\n" ::: "memory");

#pragma unroll
        for (int kk = 0; kk < BLOCK_K; kk += 4) {
            float a_reg[TM][4];  // a_reg[g][q] = A[row g][k0 + kk + q]
#pragma unroll
            for (int g = 0; g < TM; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&As[s_read][row0 + g * LANES_M][kk]);
                a_reg[g][0] = v.x, a_reg[g][1] = v.y, a_reg[g][2] = v.z, a_reg[g][3] = v.w;
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float b_reg[TN];
#pragma unroll
                for (int h = 0; h < WN_ITER; ++h) {
                    const float4 v =
                        *reinterpret_cast<const float4*>(&Bs[s_read][kk + q][col0 + h * 4 * LANES_N]);
                    b_reg[4 * h] = v.x, b_reg[4 * h + 1] = v.y, b_reg[4 * h + 2] = v.z,
                    b_reg[4 * h + 3] = v.w;
                }
#pragma unroll
                for (int g = 0; g < TM; ++g)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[g][j] = fmaf(a_reg[g][q], b_reg[j], acc[g][j]);
            }
        }
        s_read = s_read == STAGES - 1 ? 0 : s_read + 1;
        s_write = s_write == STAGES - 1 ? 0 : s_write + 1;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_pipelined(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
               const elem_t* __restrict__ C, elem_t* __restrict__ D,
               int M, int N, int K, long long ldc, int relu) {
    __shared__ __align__(16) float As[STAGES][BLOCK_M][A_STRIDE];  // As[s][m][k] = A[m0 + m][k0 + k]
    __shared__ __align__(16) float Bs[STAGES][BLOCK_K][BLOCK_N];   // Bs[s][k][n] = B[k0 + k][n0 + n]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // This thread owns rows row0 + g*LANES_M for g < TM and columns col0 + h*4*LANES_N + [0, 4)
    // for h < WN_ITER of the block tile.
    const int row0 = (warp / (BLOCK_N / WARP_N)) * WARP_M + lane / LANES_N;
    const int col0 = (warp % (BLOCK_N / WARP_N)) * WARP_N + (lane % LANES_N) * 4;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;

    float acc[TM][TN] = {};
    // One uniform branch per launch: 16-byte copies when both operands' rows are 16-byte
    // aligned, the per-element path otherwise.
    const unsigned long long bases = reinterpret_cast<unsigned long long>(A) |
                                     reinterpret_cast<unsigned long long>(B);
    const bool vec = K % 4 == 0 && N % 4 == 0 && (bases & 15) == 0;
    if (vec)
        mainloop<true>(A, B, M, N, K, As, Bs, acc, m0, n0, row0, col0);
    else
        mainloop<false>(A, B, M, N, K, As, Bs, acc, m0, n0, row0, col0);

#pragma unroll
    for (int g = 0; g < TM; ++g) {
        const int m = m0 + row0 + g * LANES_M;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + col0 + (j / 4) * 4 * LANES_N + j % 4;
            if (m < M && n < N)
                D[(long long)m * N + n] = from_float(gemm_epilogue(acc[g][j], C, ldc, m, n, relu));
        }
    }
}
