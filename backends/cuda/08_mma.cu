// Ladder step 8, cuda_mma: tensor cores through inline PTX (mma.sync + ldmatrix + cp.async).
//
// The same tensor cores as cuda_wmma, with every data movement spelled out, as CUTLASS's
// Ampere-style kernels do it, since that is where cuda_wmma loses its time:
// - mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: WMMA's 16x16x16 is built from this
//   instruction, whose register layout is documented, so the epilogue stores straight from
//   the accumulators (no trip through shared memory).
// - ldmatrix.x4 feeds the operands: one instruction gives a warp four 8x8 matrices, a whole
//   16x16 A fragment or the B fragments of two n8 tiles. B is row-major K x N in memory and
//   the mma wants it "col" (k pairs per register), so B uses ldmatrix.trans.
// - A STAGES-deep cp.async pipeline (16-byte cp.async.cg: no L1, no registers) keeps
//   STAGES-1 k-tiles of A and B in flight while the tensor cores work. Out-of-range chunks
//   use the src-size operand (0 bytes read, 16 bytes of zeros written): edge tiles need no
//   other path.
// - Two-level software pipeline: the fragments of the next k16 step are loaded while the
//   mmas of the current one run (two register buffers), and the one __syncthreads per
//   k-tile sits before the tile's last k16 step, so the next tile's first fragments load
//   during the last mmas rather than after a barrier, so the tensor cores do not idle at
//   each k-tile boundary (measured numbers: the README's ladder tables).
// - Shared memory rows are XOR-swizzled in 16-byte chunks: chunk c of row r is stored at
//   chunk c ^ f(r), where f spreads the 8 rows that one ldmatrix phase reads (and the 8
//   consecutive chunks that cp.async writes) over the 8 16-byte bank groups of a 128-byte
//   line. f(r) = r & 7 for rows of >= 128 bytes; 64- (32-) byte rows share a line two (four)
//   at a time, and f(r) = (r / 2) & 3 ((r / 4) & 1). No padding, so the tiles stay dense.
// - Warp tile 64x64 at the defaults (4 x 8 mma tiles, 128 fp32 accumulators per thread):
//   8 ldmatrix.x4 per 32 mma per k16 step. Blocks take their tiles in groups of GROUP_M tile
//   rows (Triton's grouped ordering), so blocks resident together share A and B in L2.
// The ceiling is mma.sync's, well below Hopper's wgmma (what cuBLAS uses, with TMA).
// Alignment: 16-byte cp.async needs 16-byte aligned rows, i.e. K % 8 == 0 for A and
// N % 8 == 0 for B, and a 16-byte aligned base; otherwise that operand is staged element
// by element (zeros outside the matrix): slow but correct for any M, N, K >= 1.
// References: PTX ISA, "Warp-level matrix instructions": mma (m16n8k16 fragment layouts for
// .f16/.bf16), ldmatrix; "Data movement": cp.async, cp.async.commit_group,
// cp.async.wait_group; CUTLASS docs, efficient_gemm.md (block and warp tiling, software
// pipelining) and cute's Swizzle.
#include "tensor_core.cuh"

#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 256
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
#ifndef STAGES
#define STAGES 4  // k-tiles of A and B resident in shared memory
#endif
#ifndef GROUP_M
#define GROUP_M 8  // tile rows per group of the block order (1: plain row-major order)
#endif

#define WARPS (THREADS / 32)
#define WARPS_N (WARPS / WARPS_M)
#define WARP_M (BLOCK_M / WARPS_M)
#define WARP_N (BLOCK_N / WARPS_N)
#define MT (WARP_M / 16)  // m16 tiles per warp
#define NT (WARP_N / 8)   // n8 tiles per warp
#define A_CHUNKS (BLOCK_K / 8)  // 16-byte chunks per row of the A tile
#define B_CHUNKS (BLOCK_N / 8)  // 16-byte chunks per row of the B tile
#define A_STAGE_BYTES (BLOCK_M * BLOCK_K * 2)
#define B_STAGE_BYTES (BLOCK_K * BLOCK_N * 2)
#define STAGE_BYTES (A_STAGE_BYTES + B_STAGE_BYTES)
#define SMEM_BYTES (STAGES * STAGE_BYTES)
#define A_LOADS (BLOCK_M * A_CHUNKS / THREADS)  // 16-byte chunks per thread per k-tile
#define B_LOADS (BLOCK_K * B_CHUNKS / THREADS)

static_assert(sizeof(elem_t) == 2, "16-bit operands");
static_assert(THREADS % 32 == 0 && WARPS % WARPS_M == 0, "whole warps, WARPS_M divides them");
static_assert(BLOCK_M % (16 * WARPS_M) == 0, "warp tile rows: a multiple of 16");
static_assert(BLOCK_N % (16 * WARPS_N) == 0,
              "warp tile columns: a multiple of 16 (one ldmatrix.x4.trans covers 16)");
static_assert(BLOCK_K % 16 == 0, "BLOCK_K: a multiple of the mma's k16");
// The swizzle XORs a row's chunk index with at most min(chunks, 8) - 1.
static_assert(A_CHUNKS % 8 == 0 || A_CHUNKS == 2 || A_CHUNKS == 4, "BLOCK_K: 16, 32 or 64n");
static_assert(B_CHUNKS % 8 == 0 || B_CHUNKS == 2 || B_CHUNKS == 4, "BLOCK_N: 16, 32 or 64n");
static_assert((BLOCK_M * A_CHUNKS) % THREADS == 0 && (BLOCK_K * B_CHUNKS) % THREADS == 0,
              "each thread copies the same number of 16-byte chunks");
static_assert(THREADS % BLOCK_K == 0 && THREADS % BLOCK_N == 0,
              "a thread's chunks are a multiple of 8 rows apart (same swizzle term)");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than a block can have on sm_90");
static_assert(GROUP_M >= 1, "GROUP_M >= 1");

// Read by the launcher, which raises the kernel's dynamic shared memory limit to it.
extern "C" __constant__ int gemm_dynamic_smem = SMEM_BYTES;

// Physical 16-byte chunk of logical chunk c in row r of a tile with `chunks` chunks per row.
// Rows of < 128 bytes share a 128-byte line, so f uses the line index, not r.
template <int chunks>
__device__ __forceinline__ int swz(int r, int c) {
    constexpr int line_rows = chunks >= 8 ? 1 : 8 / chunks;
    constexpr int mask = (chunks >= 8 ? 8 : chunks) - 1;
    return c ^ ((r / line_rows) & mask);
}

// 16 bytes global -> shared; bytes past src_bytes (0 or 16) are written as zeros.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int n>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(n) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// acc (16x8 fp32) += a (16x16, row) * b (16x8, col).
__device__ __forceinline__ void mma16816(float (&acc)[4], const unsigned (&a)[4],
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void st_shared16(unsigned dst, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n"
                 :: "r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_mma(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
         const elem_t* __restrict__ C, elem_t* __restrict__ D,
         int M, int N, int K, long long ldc, int relu) {
    extern __shared__ __align__(128) unsigned char smem[];
    // Stage s: A tile (BLOCK_M x BLOCK_K) at s * STAGE_BYTES, then B tile (BLOCK_K x BLOCK_N).
    const unsigned smem_base = smem_u32(smem);

    int tile_m, tile_n;
    grouped_tile(GROUP_M, tile_m, tile_n);
    const int m0 = tile_m * BLOCK_M;
    const int n0 = tile_n * BLOCK_N;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WARPS_N;  // warp's row of warp tiles
    const int wn = warp % WARPS_N;

    const int KT = (K + BLOCK_K - 1) / BLOCK_K;
    // Rows of A (B) are 16-byte aligned: uniform over the grid.
    const bool a_vec = (K & 7) == 0 && (reinterpret_cast<unsigned long long>(A) & 15) == 0;
    const bool b_vec = (N & 7) == 0 && (reinterpret_cast<unsigned long long>(B) & 15) == 0;

    // Copying k-tile kt into a stage. Thread t copies 16-byte chunks t, t + THREADS, ...:
    // consecutive threads take consecutive chunks of a row (coalesced reads). Its chunk i
    // is row r + i * ROWS_STEP, chunk column c; ROWS_STEP is a multiple of 8, which leaves
    // the swizzle term unchanged, so each chunk's shared-memory offset is the first one's
    // plus a constant. Tiles are copied in order 0, 1, 2, ..., so the global pointers are
    // simply advanced by one tile per call. Where a row is not 16-byte aligned the chunk is
    // built element by element (`#pragma unroll 1`: a slow path that must not add register
    // pressure to the fast one).
    constexpr int A_ROWS_STEP = THREADS / A_CHUNKS;
    constexpr int B_ROWS_STEP = THREADS / B_CHUNKS;
    const int a_r = tid / A_CHUNKS, a_c = tid % A_CHUNKS;
    const int b_r = tid / B_CHUNKS, b_c = tid % B_CHUNKS;
    const unsigned a_sts = a_r * (BLOCK_K * 2) + swz<A_CHUNKS>(a_r, a_c) * 16;
    const unsigned b_sts = A_STAGE_BYTES + b_r * (BLOCK_N * 2) + swz<B_CHUNKS>(b_r, b_c) * 16;
    const elem_t* a_src = A + (long long)(m0 + a_r) * K + a_c * 8;  // at k-tile a_kt
    const elem_t* b_src = B + (long long)b_r * N + n0 + b_c * 8;    // at k-tile b_kt
    const long long a_step = (long long)A_ROWS_STEP * K;  // elements between a thread's chunks
    const long long b_step = (long long)B_ROWS_STEP * N;
    const int a_rows = M - m0 - a_r;  // chunk i in range iff i * A_ROWS_STEP < a_rows
    const bool b_col_in = n0 + b_c * 8 < N;
    int a_kt = 0, b_kt = 0;

    auto load_a = [&](unsigned dst, bool vec) {
        const int gk = a_kt * BLOCK_K + a_c * 8;
        if (vec) {
            const elem_t* src = a_src;
#pragma unroll
            for (int i = 0; i < A_LOADS; ++i, src += a_step) {
                const bool ok = i * A_ROWS_STEP < a_rows && gk < K;  // K % 8 == 0: all or nothing
                cp_async16(dst + a_sts + i * A_ROWS_STEP * (BLOCK_K * 2), ok ? src : A,
                           ok ? 16 : 0);
            }
        } else {
#pragma unroll 1
            for (int i = 0; i < A_LOADS; ++i)
                st_shared16(dst + a_sts + i * A_ROWS_STEP * (BLOCK_K * 2),
                            load8_scalar(A, m0 + a_r + i * A_ROWS_STEP, gk, M, K));
        }
        a_src += BLOCK_K;
        ++a_kt;
    };
    auto load_b = [&](unsigned dst, bool vec) {
        const int gk = b_kt * BLOCK_K + b_r;
        if (vec) {
            const elem_t* src = b_src;
#pragma unroll
            for (int i = 0; i < B_LOADS; ++i, src += b_step) {
                const bool ok = b_col_in && gk + i * B_ROWS_STEP < K;  // N % 8 == 0: likewise
                cp_async16(dst + b_sts + i * B_ROWS_STEP * (BLOCK_N * 2), ok ? src : B,
                           ok ? 16 : 0);
            }
        } else {
#pragma unroll 1
            for (int i = 0; i < B_LOADS; ++i)
                st_shared16(dst + b_sts + i * B_ROWS_STEP * (BLOCK_N * 2),
                            load8_scalar(B, gk + i * B_ROWS_STEP, n0 + b_c * 8, K, N));
        }
        b_src += (long long)BLOCK_K * N;
        ++b_kt;
    };
    // Copies the next k-tile (0, 1, 2, ... in turn) into `stage`.
    auto load_tile = [&](int stage) {
        const unsigned dst = smem_base + stage * STAGE_BYTES;
        if (a_vec) load_a(dst, true); else load_a(dst, false);
        if (b_vec) load_b(dst, true); else load_b(dst, false);
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // ldmatrix addresses. Lane L points at row L % 8 of 8x8 matrix L / 8 and receives, of
    // each matrix, row L / 4, elements 2 * (L % 4) + {0, 1} (the transpose with .trans).
    // A (x4): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
    // (rows 8-15, k 8-15) = registers a0..a3 of the m16n8k16 A fragment.
    // B (x4.trans): matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
    // (k 8-15, n 8-15) = {b0, b1} of n8 tile 0, then of n8 tile 1.
    // Both: lane's row = L % 16 of the 16-row slab, its chunk = L / 16 of the 2-chunk pair.
    const int lrow = lane & 15, lchunk = lane >> 4;
    const int a_row0 = wm * WARP_M + lrow;  // + 16 * i
    const int b_col_chunk0 = wn * (WARP_N / 8) + lchunk;  // + 2 * j

    // Per-lane byte offsets of the ldmatrix rows within a stage. The swizzle term
    // (r / line_rows) & mask depends on r % 8 only (line_rows * (mask + 1) == 8), and the
    // warp tile's m16 tiles (A) and k16 steps (B) start at multiples of 16 rows, so their
    // offsets are these plus compile-time constants.
    unsigned a_off[BLOCK_K / 16], b_off[NT / 2];
#pragma unroll
    for (int ks = 0; ks < BLOCK_K / 16; ++ks)
        a_off[ks] = a_row0 * (BLOCK_K * 2) + swz<A_CHUNKS>(a_row0, 2 * ks + lchunk) * 16;
#pragma unroll
    for (int j = 0; j < NT / 2; ++j)
        b_off[j] = A_STAGE_BYTES + lrow * (BLOCK_N * 2) +
                   swz<B_CHUNKS>(lrow, b_col_chunk0 + 2 * j) * 16;

    // Fragments of k16 step ks of the tile in `stage`, into af / bf.
    auto load_frags = [&](unsigned (&af)[MT][4], unsigned (&bf)[NT][2], int stage, int ks) {
        const unsigned tile = smem_base + stage * STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < MT; ++i) ldmatrix_x4(af[i], tile + a_off[ks] + i * 16 * (BLOCK_K * 2));
#pragma unroll
        for (int j = 0; j < NT / 2; ++j) {
            unsigned t[4];
            ldmatrix_x4_trans(t, tile + b_off[j] + ks * 16 * (BLOCK_N * 2));
            bf[2 * j][0] = t[0];
            bf[2 * j][1] = t[1];
            bf[2 * j + 1][0] = t[2];
            bf[2 * j + 1][1] = t[3];
        }
    };

    // Prologue: tiles 0 .. STAGES-2 in flight, then the first fragments of tile 0.
    load_tile(0);
    cp_async_commit();
#pragma unroll
    for (int s = 1; s < STAGES - 1; ++s) {
        if (s < KT) load_tile(s);
        cp_async_commit();  // empty groups keep the wait_group count uniform
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    // Main loop, software-pipelined on two levels (as CUTLASS's multistage mainloop):
    // fragments of the next k16 step are loaded from shared memory while the mmas of the
    // current one run (double-buffered in registers), and the one __syncthreads per k-tile
    // sits before the last k16 step, so the first fragments of tile kt + 1 are loaded
    // during the last mmas of tile kt instead of after a barrier.
    // Hazards. (1) Tile kt + STAGES - 1 is copied, at the start of tile kt, into the stage
    // of tile kt - 1, whose fragment loads were all issued before the barrier of tile
    // kt - 1. (2) At the barrier of tile kt, STAGES + kt groups are committed (STAGES - 1 in
    // the prologue, one per tile since), so wait_group(STAGES - 2) means tiles 0 .. kt + 1
    // have landed for this thread, and after the barrier for every thread.
    constexpr int KS = BLOCK_K / 16;
    unsigned af[2][MT][4];
    unsigned bf[2][NT][2];
    load_frags(af[0], bf[0], 0, 0);
    int stage = 0;  // stage of tile kt
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int cur = ks & 1, nxt = (ks + 1) & 1;
            if (ks == 0) {
                if (kt + STAGES - 1 < KT) load_tile(stage == 0 ? STAGES - 1 : stage - 1);
                cp_async_commit();
            }
            if (ks == KS - 1) {
                cp_async_wait<STAGES - 2>();
                __syncthreads();
            }
            if (ks + 1 < KS) {
                load_frags(af[nxt], bf[nxt], stage, ks + 1);
            } else if (kt + 1 < KT) {
                load_frags(af[nxt], bf[nxt], stage + 1 == STAGES ? 0 : stage + 1, 0);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    mma16816(acc[i][j], af[cur][i], bf[cur][j][0], bf[cur][j][1]);
        }
        if (KS % 2 == 1) {  // the next tile's first fragments went to buffer 1: move them
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) af[0][i][e] = af[1][i][e];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                bf[0][j][0] = bf[1][j][0];
                bf[0][j][1] = bf[1][j][1];
            }
        }
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    cp_async_wait<0>();  // only empty groups are left; leave nothing in flight

    // Epilogue from registers: acc[i][j] holds D rows g and g + 8 (g = lane / 4), columns
    // 2 * (lane % 4) + {0, 1} of the 16x8 tile (i, j).
    const int g = lane >> 2, t4 = lane & 3;
    const bool pair_ok = (N & 1) == 0 && (reinterpret_cast<unsigned long long>(D) & 3) == 0;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm * WARP_M + 16 * i + g + 8 * h;
            if (m >= M) continue;
            elem_t* d_row = D + (long long)m * N;
#pragma unroll
            for (int j = 0; j < NT; ++j)
                store_pair(d_row, C, ldc, N, m, n0 + wn * WARP_N + 8 * j + 2 * t4,
                           acc[i][j][2 * h], acc[i][j][2 * h + 1], relu, pair_ok);
        }
    }
}
