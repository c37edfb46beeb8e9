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
// H200, 4096^3 (2026-11-21): 39.8 TFLOP/s against cuda_vec's 37.4 (BLOCK_K = 8) and cuBLAS's
// 49.9 in the same run; much of the gain is BLOCK_K = 16 (cuda_vec at 16: 39.7). The step
// that pays off the warp tiling is cuda_pipelined.
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
#define WM_ITER (TM / 4)                   // 4-row blocks per lane, 4*LANES_M rows apart
#define WN_ITER (TN / 4)                   // 4-column blocks per lane, 4*LANES_N columns apart
#define A_PAD 4                            // keeps float4 alignment, spreads the A stores
#define A_VECS (BLOCK_M * BLOCK_K / 4 / THREADS)  // float4s of A each thread loads per tile
#define B_VECS (BLOCK_K * BLOCK_N / 4 / THREADS)  // float4s of B each thread loads per tile
#define A_PAIR ((BLOCK_K / 4) % 2 == 0 ? 2 : 1)  // float4s of one row of A per pair of lanes

static_assert(sizeof(elem_t) == sizeof(float), "cuda_warptile is an fp32 kernel");
static_assert(BLOCK_M % WARP_M == 0 && BLOCK_N % WARP_N == 0, "block tile must split into warp tiles");
static_assert(THREADS == 32 * (BLOCK_M / WARP_M) * (BLOCK_N / WARP_N),
              "THREADS must be 32 * (BLOCK_M/WARP_M) * (BLOCK_N/WARP_N)");
static_assert(TM % 4 == 0 && TN % 4 == 0, "a thread tile is made of 4 x 4 blocks read as float4s");
static_assert(WARP_M % TM == 0 && WARP_N % TN == 0 && LANES_M * LANES_N == 32,
              "the 32 lanes must tile the warp tile: (WARP_M/TM) * (WARP_N/TN) == 32");
static_assert(BLOCK_K % 4 == 0, "rows of the A tile are loaded as float4s");
static_assert((BLOCK_M * BLOCK_K) % (4 * THREADS) == 0 && (BLOCK_K * BLOCK_N) % (4 * THREADS) == 0,
              "each thread loads the same number of float4s of each tile");
static_assert(BLOCK_K * (BLOCK_M + A_PAD + BLOCK_N) * 4 <= 48 * 1024, "static shared memory <= 48 KiB");

// Elements [col, col+4) of row `row` of a row-major rows x cols matrix, zeros outside it, as
// four checked scalar loads: the path for rows that are not 16-byte aligned.
__device__ __forceinline__ float4 load4_scalar(const float* __restrict__ p, int rows, int cols,
                                               int row, int col) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row >= rows) return v;
    const float* q = p + (long long)row * cols;
    if (col < cols) v.x = q[col];
    if (col + 1 < cols) v.y = q[col + 1];
    if (col + 2 < cols) v.z = q[col + 2];
    if (col + 3 < cols) v.w = q[col + 3];
    return v;
}

// The k loop: D's tile of this thread accumulated into acc. VEC: the rows of A and B are
// 16-byte aligned, so every float4 of a tile is wholly inside A (B) or wholly outside (the
// fast path); else every element is loaded and checked on its own.
template <bool VEC>
__device__ __forceinline__ void mainloop(const float* __restrict__ A, const float* __restrict__ B,
                                         int M, int N, int K, float (&As)[BLOCK_K][BLOCK_M + A_PAD],
                                         float (&Bs)[BLOCK_K][BLOCK_N], float (&acc)[TM][TN],
                                         int row0, int col0) {
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;
    // The float4s this thread loads are the same in every tile: float4 r of A is row A_M(r),
    // columns A_K(r)..+3 of the tile, A_PAIR consecutive float4s of a row per pair of threads
    // and consecutive rows next (so a warp reads whole 32-byte sectors of 16 rows); float4 r
    // of B is row B_K(r), columns B_N(r)..+3, consecutive threads along the row. The VEC path
    // keeps a pointer per float4 and moves it along k; rows past M and columns past N are
    // clamped to a valid address and loaded as zeros.
#define A_M(r) (((tid + (r) * THREADS) / A_PAIR) % BLOCK_M)
#define A_K(r) \
    (4 * ((tid + (r) * THREADS) % A_PAIR + A_PAIR * ((tid + (r) * THREADS) / (A_PAIR * BLOCK_M))))
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
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    for (int k0 = 0; k0 < K; k0 += BLOCK_K) {
#pragma unroll
        for (int r = 0; r < A_VECS; ++r) {
            float4 v;
            if (VEC) {
                const bool valid = m0 + A_M(r) < M && k0 + A_K(r) < K;
                v = valid ? *reinterpret_cast<const float4*>(a_src[r]) : zero;
                a_src[r] += BLOCK_K;
            } else {
                v = load4_scalar(A, M, K, m0 + A_M(r), k0 + A_K(r));
            }
            As[A_K(r) + 0][A_M(r)] = v.x;
            As[A_K(r) + 1][A_M(r)] = v.y;
            As[A_K(r) + 2][A_M(r)] = v.z;
            As[A_K(r) + 3][A_M(r)] = v.w;
        }
#pragma unroll
        for (int r = 0; r < B_VECS; ++r) {
            float4 v;
            if (VEC) {
                const bool valid = k0 + B_K(r) < K && n0 + B_N(r) < N;
                v = valid ? *reinterpret_cast<const float4*>(b_src[r]) : zero;
                b_src[r] += (long long)BLOCK_K * N;
            } else {
                v = load4_scalar(B, K, N, k0 + B_K(r), n0 + B_N(r));
            }
            *reinterpret_cast<float4*>(&Bs[B_K(r)][B_N(r)]) = v;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BLOCK_K; ++k) {
            float a_reg[TM], b_reg[TN];
#pragma unroll
            for (int g = 0; g < WM_ITER; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&As[k][row0 + g * 4 * LANES_M]);
                a_reg[4 * g] = v.x, a_reg[4 * g + 1] = v.y;
                a_reg[4 * g + 2] = v.z, a_reg[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int h = 0; h < WN_ITER; ++h) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[k][col0 + h * 4 * LANES_N]);
                b_reg[4 * h] = v.x, b_reg[4 * h + 1] = v.y;
                b_reg[4 * h + 2] = v.z, b_reg[4 * h + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a_reg[i], b_reg[j], acc[i][j]);
        }
        __syncthreads();  // the tiles are overwritten next step
    }
#undef A_M
#undef A_K
#undef B_K
#undef B_N
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_warptile(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
              const elem_t* __restrict__ C, elem_t* __restrict__ D,
              int M, int N, int K, long long ldc, int relu) {
    __shared__ __align__(16) float As[BLOCK_K][BLOCK_M + A_PAD];  // As[k][m] = A[m0 + m][k0 + k]
    __shared__ __align__(16) float Bs[BLOCK_K][BLOCK_N];          // Bs[k][n] = B[k0 + k][n0 + n]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // This thread owns rows row0 + g*4*LANES_M + [0, 4) for g < WM_ITER and columns
    // col0 + h*4*LANES_N + [0, 4) for h < WN_ITER of the block tile.
    const int row0 = (warp / (BLOCK_N / WARP_N)) * WARP_M + (lane / LANES_N) * 4;
    const int col0 = (warp % (BLOCK_N / WARP_N)) * WARP_N + (lane % LANES_N) * 4;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;

    float acc[TM][TN] = {};
    // One uniform branch per launch: 16-byte loads when both operands' rows are 16-byte
    // aligned, the per-element path otherwise.
    const unsigned long long bases = reinterpret_cast<unsigned long long>(A) |
                                     reinterpret_cast<unsigned long long>(B);
    const bool vec = K % 4 == 0 && N % 4 == 0 && (bases & 15) == 0;
    if (vec)
        mainloop<true>(A, B, M, N, K, As, Bs, acc, row0, col0);
    else
        mainloop<false>(A, B, M, N, K, As, Bs, acc, row0, col0);

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + row0 + (i / 4) * 4 * LANES_M + i % 4;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + col0 + (j / 4) * 4 * LANES_N + j % 4;
            if (m < M && n < N)
                D[(long long)m * N + n] = from_float(gemm_epilogue(acc[i][j], C, ldc, m, n, relu));
        }
    }
}
