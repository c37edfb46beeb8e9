// Shared by cuda_vec and cuda_warptile: float4 tile loads into shared memory and the
// register-blocked inner loop, for a thread that owns TM x TN elements of D as (TM/4) x (TN/4)
// blocks of 4 x 4 starting at (row0, col0) of the block tile, ROW_STEP rows and COL_STEP
// columns apart. The two kernels differ only in how they place those blocks (cuda_vec: over
// the whole block tile; cuda_warptile: inside a warp tile), so they pass different row0, col0
// and steps. The including file defines BLOCK_M, BLOCK_N, BLOCK_K, TM, TN and THREADS.
#pragma once

#define A_PAD 4                            // keeps float4 alignment, spreads the A stores
#define A_VECS (BLOCK_M * BLOCK_K / 4 / THREADS)  // float4s of A each thread loads per tile
#define B_VECS (BLOCK_K * BLOCK_N / 4 / THREADS)  // float4s of B each thread loads per tile
#define A_PAIR ((BLOCK_K / 4) % 2 == 0 ? 2 : 1)  // float4s of one row of A per pair of threads

static_assert(sizeof(elem_t) == sizeof(float), "the float4 tiles hold fp32 operands");
static_assert(TM % 4 == 0 && TN % 4 == 0, "a thread tile is made of 4 x 4 blocks read as float4s");
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
template <bool VEC, int ROW_STEP, int COL_STEP>
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
            for (int g = 0; g < TM / 4; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&As[k][row0 + g * ROW_STEP]);
                a_reg[4 * g] = v.x, a_reg[4 * g + 1] = v.y;
                a_reg[4 * g + 2] = v.z, a_reg[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int h = 0; h < TN / 4; ++h) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[k][col0 + h * COL_STEP]);
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

// The whole kernel body: tiles in shared memory, one uniform branch per launch (16-byte loads
// when both operands' rows are 16-byte aligned, the per-element path otherwise), then the fused
// epilogue over this thread's blocks.
template <int ROW_STEP, int COL_STEP>
__device__ __forceinline__ void gemm_float4_tiles(const float* __restrict__ A,
                                                  const float* __restrict__ B,
                                                  const float* __restrict__ C,
                                                  float* __restrict__ D, int M, int N, int K,
                                                  long long ldc, int relu, int row0, int col0) {
    __shared__ __align__(16) float As[BLOCK_K][BLOCK_M + A_PAD];  // As[k][m] = A[m0 + m][k0 + k]
    __shared__ __align__(16) float Bs[BLOCK_K][BLOCK_N];          // Bs[k][n] = B[k0 + k][n0 + n]
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;

    float acc[TM][TN] = {};
    const unsigned long long bases = reinterpret_cast<unsigned long long>(A) |
                                     reinterpret_cast<unsigned long long>(B);
    const bool vec = K % 4 == 0 && N % 4 == 0 && (bases & 15) == 0;
    if (vec)
        mainloop<true, ROW_STEP, COL_STEP>(A, B, M, N, K, As, Bs, acc, row0, col0);
    else
        mainloop<false, ROW_STEP, COL_STEP>(A, B, M, N, K, As, Bs, acc, row0, col0);

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + row0 + (i / 4) * ROW_STEP + i % 4;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + col0 + (j / 4) * COL_STEP + j % 4;
            if (m < M && n < N)
                D[(long long)m * N + n] = from_float(gemm_epilogue(acc[i][j], C, ldc, m, n, relu));
        }
    }
}
