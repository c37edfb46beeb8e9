// Ladder step 7, cuda_wmma: tensor cores through the WMMA API (nvcuda::wmma).
//
// The CUDA-core kernels do one fp32 FMA per thread per instruction; a tensor-core
// mma_sync makes a warp do a 16x16x16 matrix multiply-accumulate (4096 FMAs) in one
// operation, on 16-bit operands (fp16 or bf16) with fp32 accumulation. On Hopper the tensor
// cores have an order of magnitude more throughput than the fp32 pipes, so the kernel is
// bound by feeding them, not by arithmetic.
// Structure, the register-blocked one of the earlier steps lifted to fragments:
// - A block computes a BLOCK_M x BLOCK_N tile of D with WARPS_M x WARPS_N warps; each warp
//   owns a WARP_M x WARP_N warp tile (64x32 at the defaults) = (WARP_M/16) x (WARP_N/16)
//   accumulator fragments, so each A fragment loaded from shared memory serves WARP_N/16
//   mma_syncs and each B fragment WARP_M/16.
// - Tiles of A (BLOCK_M x BLOCK_K) and B (BLOCK_K x BLOCK_N) are double-buffered in shared
//   memory; the next k-tile is read from global memory into registers (16-byte loads) while
//   the tensor cores work on the current one, then stored to the other buffer: one
//   __syncthreads per k-tile.
// - Shared-memory rows are padded by 8 elements (16 bytes), which makes the row stride an
//   odd number of 16-byte units: the 8 rows that one 16-byte-per-row fragment load touches
//   land in 8 different bank groups. The pad keeps the 32-byte alignment load_matrix_sync
//   requires for each fragment's first element.
// - Fragment layout in registers is opaque in WMMA, so the epilogue stores each accumulator
//   fragment to a per-warp fp32 scratch tile in shared memory (reusing the operand buffers)
//   and applies C, ReLU and the bounds checks from there.
// Measured numbers: the README's ladder tables (bench/results/h200-ladder-fp16, -bf16).
// Alignment: 16-byte global loads need 16-byte aligned rows, i.e. K % 8 == 0 for A and
// N % 8 == 0 for B, and a 16-byte aligned base; otherwise that operand is read element by
// element with zeros outside the matrix (and D, likewise, stored element by element). Any
// M, N, K >= 1 works; partial edge tiles compute on zeros and are not stored.
// References: CUDA C++ Programming Guide, "Warp Matrix Functions" (wmma fragments,
// load_matrix_sync alignment and ldm rules, bf16 support on sm_80+); CUTLASS docs,
// efficient_gemm.md (block/warp tiling, shared-memory double buffering).
#include "tensor_core.cuh"
#include <mma.h>

#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef BLOCK_K
#define BLOCK_K 32
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef WARPS_M
#define WARPS_M 2  // warps along M; THREADS / 32 / WARPS_M along N
#endif

#define WARPS (THREADS / 32)
#define WARPS_N (WARPS / WARPS_M)
#define WARP_M (BLOCK_M / WARPS_M)
#define WARP_N (BLOCK_N / WARPS_N)
#define FM (WARP_M / 16)  // accumulator fragments per warp along M
#define FN (WARP_N / 16)  // and along N
#define A_LD (BLOCK_K + 8)  // padded row lengths in elements (see above)
#define B_LD (BLOCK_N + 8)
#define SC_LD 20            // fp32 scratch row: multiple of 4 floats, as store_matrix_sync needs
#define A_CHUNKS (BLOCK_K / 8)  // 16-byte chunks per row of a tile
#define B_CHUNKS (BLOCK_N / 8)
#define A_LOADS (BLOCK_M * A_CHUNKS / THREADS)  // chunks per thread per k-tile
#define B_LOADS (BLOCK_K * B_CHUNKS / THREADS)
#define A_STAGE_BYTES (BLOCK_M * A_LD * 2)
#define B_STAGE_BYTES (BLOCK_K * B_LD * 2)
#define PIPE_BYTES (2 * (A_STAGE_BYTES + B_STAGE_BYTES))
#define SCRATCH_BYTES (WARPS * 16 * SC_LD * 4)
#define SMEM_BYTES (PIPE_BYTES > SCRATCH_BYTES ? PIPE_BYTES : SCRATCH_BYTES)

static_assert(sizeof(elem_t) == 2, "16-bit operands");
static_assert(THREADS % 32 == 0 && WARPS % WARPS_M == 0, "whole warps, WARPS_M divides them");
static_assert(BLOCK_M % (16 * WARPS_M) == 0 && BLOCK_N % (16 * WARPS_N) == 0,
              "warp tiles are whole 16x16 fragments");
static_assert(BLOCK_K % 16 == 0, "BLOCK_K: a multiple of the fragments' k16");
static_assert((BLOCK_M * A_CHUNKS) % THREADS == 0 && (BLOCK_K * B_CHUNKS) % THREADS == 0,
              "each thread loads the same number of 16-byte chunks");
static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory is limited to 48 KiB");

using namespace nvcuda;

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_wmma(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
          const elem_t* __restrict__ C, elem_t* __restrict__ D,
          int M, int N, int K, long long ldc, int relu) {
    __shared__ __align__(128) unsigned char smem[SMEM_BYTES];
    // As[s][m][k] = A[m0 + m][k0 + k], Bs[s][k][n] = B[k0 + k][n0 + n] for buffer s.
    elem_t (*As)[BLOCK_M][A_LD] = reinterpret_cast<elem_t (*)[BLOCK_M][A_LD]>(smem);
    elem_t (*Bs)[BLOCK_K][B_LD] =
        reinterpret_cast<elem_t (*)[BLOCK_K][B_LD]>(smem + 2 * A_STAGE_BYTES);

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;
    const int KT = (K + BLOCK_K - 1) / BLOCK_K;
    // Rows of A (B) 16-byte aligned: uniform over the grid.
    const bool a_vec = (K & 7) == 0 && (reinterpret_cast<unsigned long long>(A) & 15) == 0;
    const bool b_vec = (N & 7) == 0 && (reinterpret_cast<unsigned long long>(B) & 15) == 0;

    // Thread t handles chunks t, t + THREADS, ... of each tile: consecutive threads read
    // consecutive 16-byte chunks of a row (coalesced).
    uint4 a_reg[A_LOADS], b_reg[B_LOADS];
    auto load_regs = [&](int kt) {
        const int k0 = kt * BLOCK_K;
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int id = tid + i * THREADS;
            const int gm = m0 + id / A_CHUNKS, gk = k0 + (id % A_CHUNKS) * 8;
            if (a_vec)  // K % 8 == 0: a chunk is all inside or all outside
                a_reg[i] = (gm < M && gk < K)
                               ? *reinterpret_cast<const uint4*>(A + (long long)gm * K + gk)
                               : make_uint4(0, 0, 0, 0);
            else
                a_reg[i] = load8_scalar(A, gm, gk, M, K);
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int id = tid + i * THREADS;
            const int gk = k0 + id / B_CHUNKS, gn = n0 + (id % B_CHUNKS) * 8;
            if (b_vec)
                b_reg[i] = (gk < K && gn < N)
                               ? *reinterpret_cast<const uint4*>(B + (long long)gk * N + gn)
                               : make_uint4(0, 0, 0, 0);
            else
                b_reg[i] = load8_scalar(B, gk, gn, K, N);
        }
    };
    auto store_smem = [&](int s) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int id = tid + i * THREADS;
            *reinterpret_cast<uint4*>(&As[s][id / A_CHUNKS][(id % A_CHUNKS) * 8]) = a_reg[i];
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int id = tid + i * THREADS;
            *reinterpret_cast<uint4*>(&Bs[s][id / B_CHUNKS][(id % B_CHUNKS) * 8]) = b_reg[i];
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    load_regs(0);
    store_smem(0);
    __syncthreads();
    for (int kt = 0; kt < KT; ++kt) {
        const int s = kt & 1;
        if (kt + 1 < KT) load_regs(kt + 1);  // in flight during the mma_syncs below
#pragma unroll
        for (int ks = 0; ks < BLOCK_K; ks += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> af[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> bf[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i)
                wmma::load_matrix_sync(af[i], &As[s][wm * WARP_M + 16 * i][ks], A_LD);
#pragma unroll
            for (int j = 0; j < FN; ++j)
                wmma::load_matrix_sync(bf[j], &Bs[s][ks][wn * WARP_N + 16 * j], B_LD);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
        }
        // Buffer s ^ 1 was last read in iteration kt - 1, which every warp finished before
        // the __syncthreads that ended it.
        if (kt + 1 < KT) store_smem(s ^ 1);
        __syncthreads();
    }

    // Epilogue. The loop ended with __syncthreads, so the operand buffers are free. Each
    // warp goes through its fragments one at a time via its own 16 x SC_LD scratch tile;
    // lane l then handles row l / 2, columns 8 * (l % 2) + [0, 8) of the fragment.
    float* scratch = reinterpret_cast<float*>(smem) + warp * 16 * SC_LD;
    const int r = lane >> 1, c0 = (lane & 1) * 8;
    const bool d_vec = (N & 7) == 0 && (reinterpret_cast<unsigned long long>(D) & 15) == 0;
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            wmma::store_matrix_sync(scratch, acc[i][j], SC_LD, wmma::mem_row_major);
            __syncwarp();
            const int m = m0 + wm * WARP_M + 16 * i + r;
            const int n = n0 + wn * WARP_N + 16 * j + c0;
            const float* src = scratch + r * SC_LD + c0;
            if (m < M) {
                elem_t* d = D + (long long)m * N + n;
                if (d_vec && n + 8 <= N) {
                    unsigned h[8];  // the 8 results' bits, packed 2 per word below
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        h[e] = elem_bits(from_float(gemm_epilogue(src[e], C, ldc, m, n + e, relu)));
                    *reinterpret_cast<uint4*>(d) = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16,
                                                              h[4] | h[5] << 16, h[6] | h[7] << 16);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        if (n + e < N)
                            d[e] = from_float(gemm_epilogue(src[e], C, ldc, m, n + e, relu));
                }
            }
            __syncwarp();  // the scratch tile is overwritten by the next fragment
        }
    }
}
