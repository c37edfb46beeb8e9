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
// H200, 4096^3 (2026-11-21): 37.4 TFLOP/s against cuda_regblock's 29.0 and cuBLAS's ~50;
// 39.7 with BLOCK_K = 16 (kept at 8 here, as in cuda_regblock, to isolate the technique).
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
#define A_PAD 4                            // see the header: keeps float4 alignment, no conflicts
#define M_GAP (4 * BLOCK_M / TM)           // rows between a thread's groups of 4 rows
#define N_GAP (4 * BLOCK_N / TN)           // columns between its groups of 4 columns
#define A_VECS (BLOCK_M * BLOCK_K / 4 / THREADS)  // float4s of A each thread loads per tile
#define B_VECS (BLOCK_K * BLOCK_N / 4 / THREADS)  // float4s of B each thread loads per tile
#define A_PAIR ((BLOCK_K / 4) % 2 == 0 ? 2 : 1)  // float4s of one row of A taken by one warp

static_assert(sizeof(elem_t) == sizeof(float), "cuda_vec is an fp32 kernel");
static_assert(THREADS == (BLOCK_M / TM) * (BLOCK_N / TN), "THREADS must be (BLOCK_M/TM)*(BLOCK_N/TN)");
static_assert(BLOCK_M % TM == 0 && BLOCK_N % TN == 0, "tile must split into TM x TN sub-tiles");
static_assert(TM % 4 == 0 && TN % 4 == 0, "a sub-tile is made of 4 x 4 blocks read as float4s");
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
                                         int tx, int ty) {
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
            for (int g = 0; g < TM / 4; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&As[k][ty * 4 + g * M_GAP]);
                a_reg[4 * g] = v.x, a_reg[4 * g + 1] = v.y;
                a_reg[4 * g + 2] = v.z, a_reg[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int h = 0; h < TN / 4; ++h) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[k][tx * 4 + h * N_GAP]);
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
gemm_vec(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
         const elem_t* __restrict__ C, elem_t* __restrict__ D,
         int M, int N, int K, long long ldc, int relu) {
    __shared__ __align__(16) float As[BLOCK_K][BLOCK_M + A_PAD];  // As[k][m] = A[m0 + m][k0 + k]
    __shared__ __align__(16) float Bs[BLOCK_K][BLOCK_N];          // Bs[k][n] = B[k0 + k][n0 + n]
    // This thread owns rows ty*4 + g*M_GAP + [0, 4) and columns tx*4 + h*N_GAP + [0, 4).
    const int tx = threadIdx.x % (BLOCK_N / TN);
    const int ty = threadIdx.x / (BLOCK_N / TN);
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;

    float acc[TM][TN] = {};
    // One uniform branch per launch: 16-byte loads when both operands' rows are 16-byte
    // aligned, the per-element path otherwise.
    const unsigned long long bases = reinterpret_cast<unsigned long long>(A) |
                                     reinterpret_cast<unsigned long long>(B);
    const bool vec = K % 4 == 0 && N % 4 == 0 && (bases & 15) == 0;
    if (vec)
        mainloop<true>(A, B, M, N, K, As, Bs, acc, tx, ty);
    else
        mainloop<false>(A, B, M, N, K, As, Bs, acc, tx, ty);

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty * 4 + (i / 4) * M_GAP + i % 4;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx * 4 + (j / 4) * N_GAP + j % 4;
            if (m < M && n < N)
                D[(long long)m * N + n] = from_float(gemm_epilogue(acc[i][j], C, ldc, m, n, relu));
        }
    }
}
