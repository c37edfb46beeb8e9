// Ladder step 10, cuda_wgmma_persistent: cuda_wgmma made persistent (one CTA per SM loops over
// the tiles), with the epilogue's loads and stores done by the TMA while the next tile computes.
//
// cuda_wgmma launches one CTA per tile: every tile pays the CTA's start (barrier set-up, the
// first TMA loads of an empty pipeline) and its end (the epilogue, with the tensor cores idle
// and no loads in flight). Here the grid is min(#SMs, #tiles) CTAs, each walking tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... in the grouped order, and the pipeline never drains:
// - the producer's stage ring runs across tile boundaries (one k-tile counter for the CTA's
//   whole life), so while the consumers finish tile i, the TMA is already loading tile i+1's
//   first STAGES k-tiles;
// - the consumers write act(acc + C) into a staging tile in shared memory, laid out as the
//   TMA's 64 x 64 boxes with the 128-byte swizzle, and go straight on to tile i+1's mainloop;
// - a storer thread per consumer warpgroup (idle lanes of the producer warpgroup) sends the
//   boxes to D with TMA tensor stores (cp.async.bulk.tensor, global <- shared) and, once they
//   have read the staging, has the TMA load tile i+1's C into it, so the epilogue reads C
//   from shared memory and the producer's k-tile loads never wait for an epilogue;
// - one m64n256k16 wgmma per k16 step (BLOCK_N = 256) reads the A tile once for all 256
//   columns; two m64n128k16 read it twice.
// Measured on the H200 (bench/results/h200-wgmma-tma-epilogue/ and the README): the first
// version stored D by one bulk copy per row, prefetched C the same way from the producer, and
// ran the epilogue with a bounds check and a branch per pair; its epilogue took ~9000 cycles
// per tile with no store at all (clock64 stamps), i.e. 44-54% of the best cuBLAS on short K.
// The changes were measured one by one on variants of this file (probes/ in that folder);
// together they brought short K to 89-95% and the square shapes to 90-97% (pct_best_cublas
// of cuda_wgmma_persistent in bench/results/h200-wgmma-tma-epilogue/results.json). The epilogue
// then moved its pairs by ldmatrix/stmatrix (stage_tile): with ReLU(A @ B + C), short K at
// 100-105% of the best cuBLAS (bench/results/h200-wgmma-stmatrix/).
// With 4 stages the staging holds half a tile row (two passes); the second pass's C comes
// from global memory into registers during the last k-tile (late_c): the ReLU(A @ B + C)
// epilogue went from ~5,050 to ~4,300 cycles per tile at 8192^3 (clock64 stamps,
// bench/results/h200-wgmma-late-c/probes/).
// What it still lacks (cuBLAS's sm90 kernels have it): the epilogue still runs with the
// tensor cores idle (with 4 stages 1.8-3.1% of the time at 8192^3, 3.4-5.7% at 4096^3, while
// the mainloop keeps the tensor cores at their peak per cycle: clock64 stamps in
// bench/results/h200-wgmma-late-c/probes/timeline3-sustained.txt). Clusters with TMA multicast are step 11
// (11_wgmma_cluster.cu), this file built with CLUSTER_M = 2: the `CLUSTER_M > 1` branches; the
// two consumer warpgroups taking turns on whole tiles (CUTLASS's "ping-pong"), so that one's
// epilogue runs during the other's mainloop, are step 12 (12_wgmma_pingpong.cu), this file
// built with PINGPONG = 1: the `TURNS > 1` branches.
// C_LEAD = L (the registry: 4 for step 10, 8 for step 11; `gemmlab tune` searches 0, 4, 8): a
// later tile's C loads once the tile's k-tile k_end - L is ready, not as soon as the previous
// D has left the staging, i.e. at the tile's start, where every CTA (they run their rounds
// nearly in step) also stores its D and loads its first k-tiles. Measured on the H200 against
// L = 0 (bench/results/h200-wgmma-c-lead/): step 10's ReLU(A @ B + C) at 4096^3 and 8192^3
// +0.75 points of the best cuBLAS in the median (-0.3 to +3.0), 16384 x 4096 x 512 -0.1 to +2.0.
// STREAM_K = 1 (a build `gemmlab tune` may pick): after the whole rounds of tiles, the k-tiles of
// the tiles left over are cut into one contiguous range per CTA (WorkUnits below), so the last,
// partly filled round is spread over every SM; a tile several CTAs share is finished by the
// one holding its k-tile 0, which adds the others' fp32 accumulators from a workspace. It
// should buy the idle SMs of that round, and where there are fewer tiles than SMs, the rest
// of the GPU. Measured on the H200 (bench/results/h200-stream-k/): 1.76x at 1024 x 1024 x
// 8192 (32 tiles), 1.22x at 512 x 4096 x 16384; but at 4096^3 2-8% slower, the split tiles'
// accumulators going out and back in all at once while the tensor cores wait.
// The tensor maps of D and C are kernel parameters (__grid_constant__): a CUDA graph that
// captures a call with a fresh D keeps that D's map. A map needs a 16-byte aligned base and
// row stride, so the staging path needs N % 8 == 0 and a 16-byte aligned D (else the kernel
// stores from registers as cuda_wgmma does) and the C load the same of C (a bias, or an
// unaligned C, is read from global memory). Boxes past M or N are clipped by the TMA.
// Mainloop, the tensor maps of A and B, alignment and any M, N, K: as 09_wgmma.cu. The
// consumer mainloop and the register epilogue are written out here as there: built from one
// shared header instead, this kernel ran 9% slower at 8192^3 and 6% on 16384x4096x512 on the
// H200 (bf16 ReLU(A @ B + C), kernel time 1.090x and 1.058x, step 9 unchanged:
// bench/results/h200-wgmma-shared-mainloop/ against the baseline run of
// bench/results/h200-wgmma-persistent/, 564.2 and 200.0 against 614.9 and 211.6 TFLOP/s),
// so the copy stays.
// References: PTX ISA, "cp.async.bulk.tensor", "cp.async.bulk.commit_group/wait_group",
// "membar/fence" (fence.proxy.async), "bar.sync", "setmaxnreg"; CUDA C++ Programming Guide,
// "Tensor Memory Accelerator" (tensor maps as __grid_constant__ parameters); CUTLASS's sm90
// persistent kernels (tile scheduler, TMA store epilogue); pranjalssh/fast.cu (m64n256k16,
// TMA-store epilogue on H100); the wgmma references of 09_wgmma.cu.
#include "wgmma.cuh"

#ifndef BLOCK_M
#define BLOCK_M 128  // 64 rows per consumer warpgroup
#endif
#ifndef BLOCK_N
#define BLOCK_N 256
#endif
#ifndef BLOCK_K
#define BLOCK_K 64  // one 128-byte swizzled row of 16-bit elements
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef THREADS
#define THREADS 384  // the producer warpgroup and BLOCK_M / 64 consumer warpgroups
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1  // CTAs per cluster, on consecutive tile rows, sharing B (step 11: 2)
#endif
#ifndef PINGPONG
#define PINGPONG 0  // 1: the consumer warpgroups take turns on whole tiles (step 12)
#endif
#ifndef STREAM_K
#define STREAM_K 0  // 1: the tiles the whole rounds leave are shared out by k-tiles (stream-K)
#endif
#ifndef C_LEAD
#define C_LEAD 0  // > 0: a tile's C loads when its k-tile k_end - C_LEAD is ready (0: at once)
#endif
#ifndef KERNEL
#define KERNEL gemm_wgmma_persistent
#endif

#if PINGPONG
#define CONSUMERS 2  // each computes whole BLOCK_M x BLOCK_N tiles: the CTA's tiles 0, 2, ... / 1, 3, ...
#define TURNS 2
#else
#define CONSUMERS (BLOCK_M / 64)  // 64 rows of every tile each
#define TURNS 1
#endif
#define STAGE_READERS (CONSUMERS / TURNS)  // consumer warpgroups that read each stage
// setmaxnreg: the producer warpgroup (the TMA thread and the storers) gives registers to the
// consumers, which hold 128 accumulators each. An inc waits until the pool has the
// registers, so the consumers may take only what the producer gave back: with 384 threads
// launched at 168 registers, 128 x (168 - 48) >= 256 x (224 - 168).
#define PRODUCER_REGS 48
#define CONSUMER_REGS 224
#define N_SUB (BLOCK_N / 128)  // 128-column halves of a consumer's accumulator
#define A_STAGE_BYTES (BLOCK_M * BLOCK_K * 2)
#define B_BOX_BYTES (BLOCK_K * 64 * 2)  // BLOCK_K rows x 64 columns of B
#define STAGE_BYTES (A_STAGE_BYTES + BLOCK_N * BLOCK_K * 2)
#define BOX_BYTES (64 * 128)  // a 64 x 64 box of D or C in the staging tile, 128B-swizzled
// Stages (1024-aligned for the swizzle), the staging tile of 64 x EPILOGUE_N per consumer
// warpgroup (its boxes 1024-aligned too), then a full and an empty mbarrier per stage and
// three per consumer warpgroup (four taking turns); + 1024 to align the dynamic shared
// memory's base.
#define SMEM_BYTES_FOR(epilogue_n)                                               \
    (STAGES * STAGE_BYTES + CONSUMERS * 64 * (epilogue_n) * 2 + 1024 +           \
     (2 * STAGES + (TURNS > 1 ? 5 : 4) * CONSUMERS) * 8)
// EPILOGUE_N: the columns of D a consumer warpgroup stages per epilogue pass. Its whole
// 64 x BLOCK_N when that fits beside the stages (one pass); else 64 x 128 or 64 x 64 in
// several passes, each later one waiting until the TMA has read the one before (their C is
// in registers, late_c): 128 x 256 tiles fit 4 stages that way instead of 3, 64 x 256 tiles
// taking turns 5 instead of 4. Measured on the H200 (bf16/fp16, A/B in one process,
// bench/results/h200-wgmma-epilogue-passes/): 4 stages and two passes ran 8192^3 1-3 points
// of cuBLAS faster, short K up to 11 points slower; but that 3-stage ring paid a 64-bit
// division per k-tile, and without it 3 stages keep the tensor cores as busy as 4
// (bench/results/h200-wgmma-pingpong/): `gemmlab tune` picks STAGES per shape.
#ifndef EPILOGUE_N
#if SMEM_BYTES_FOR(BLOCK_N) <= 227 * 1024
#define EPILOGUE_N BLOCK_N
#elif SMEM_BYTES_FOR(128) <= 227 * 1024
#define EPILOGUE_N 128
#else
#define EPILOGUE_N 64
#endif
#endif
// A piece: the columns of one stage_tile call, within one 128-column half of the accumulator.
#define PIECE_N (EPILOGUE_N < 128 ? EPILOGUE_N : 128)
#define PIECE_J (PIECE_N / 8)  // 8-column groups of a piece
#define PASS_SUB (EPILOGUE_N / PIECE_N)  // pieces per pass
#define PASSES (BLOCK_N / EPILOGUE_N)  // epilogue passes per tile, through one staging buffer
#define STAGING_BYTES (CONSUMERS * 64 * EPILOGUE_N * 2)
#define SMEM_BYTES SMEM_BYTES_FOR(EPILOGUE_N)

static_assert(BLOCK_K == 64, "a k-tile is one 128-byte swizzle span of 16-bit elements");
static_assert(BLOCK_M == 64 || BLOCK_M == 128, "one or two consumer warpgroups of 64 rows");
static_assert(!PINGPONG || BLOCK_M == 64, "taking turns, a warpgroup computes a 64-row tile");
static_assert(BLOCK_N % 128 == 0 && BLOCK_N <= 256, "BLOCK_N: 128 or 256");
static_assert((EPILOGUE_N == 64 || EPILOGUE_N % 128 == 0) && BLOCK_N % EPILOGUE_N == 0,
              "EPILOGUE_N: 64, or 128-column halves of the tile, dividing BLOCK_N");
static_assert(!STREAM_K || PASSES == 1,
              "stream-K: the epilogue in one pass (registers: the later passes' C would spill)");
static_assert(PASSES == 1 || PASS_SUB == 1,
              "a later pass is one piece (its C held in registers)");
static_assert(THREADS == 128 * (1 + CONSUMERS), "THREADS: one producer + consumer warpgroups");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than a block can have on sm_90");
static_assert(GROUP_M >= 1, "GROUP_M >= 1");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "CLUSTER_M: 1 or 2 CTAs per cluster");
static_assert(STREAM_K == 0 || STREAM_K == 1, "STREAM_K: 0 or 1");
static_assert(!STREAM_K || (CLUSTER_M == 1 && !PINGPONG),
              "stream-K: one CTA per tile (no cluster), both warpgroups on every tile");
static_assert(BLOCK_N / 64 % CLUSTER_M == 0, "each CTA of a cluster loads as many B boxes");
static_assert(CONSUMERS == 1 || 128 * PRODUCER_REGS + 256 * CONSUMER_REGS <=
                                    THREADS * (65536 / THREADS / 8 * 8),
              "setmaxnreg: the consumers can only take the registers the producer gives up");

#if CLUSTER_M > 1
#define CLUSTER_DIMS __cluster_dims__(CLUSTER_M, 1, 1)
#else
#define CLUSTER_DIMS
#endif

// Read by the launcher, which raises the kernel's dynamic shared memory limit to it.
extern "C" __constant__ int gemm_dynamic_smem = SMEM_BYTES;

// --- bulk groups of the TMA stores (PTX ISA "cp.async.bulk.commit_group/wait_group") ---
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Wait until this thread's bulk groups have read their shared-memory source.
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Wait until this thread's bulk groups have completed (their writes are done).
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Make this thread's shared-memory writes visible to the async proxy (the TMA stores).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier `id` (1, 2, ...; 0 is __syncthreads) over the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier(int id) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory");
}

// Walk entry `tile` of the CTA's tiles: the grouped order, or with clusters the cluster tile
// (CLUSTER_M tile rows by one column) in the grouped order, of which this CTA (rank r in its
// cluster) has tile row r.
__device__ __forceinline__ void walk_tile(int tile, int tiles_m, int tiles_n, int& tile_m,
                                          int& tile_n) {
#if CLUSTER_M > 1
    int cluster_m;
    grouped_tile_of(tile, (tiles_m + CLUSTER_M - 1) / CLUSTER_M, tiles_n,
                    (GROUP_M + CLUSTER_M - 1) / CLUSTER_M, cluster_m, tile_n);
    tile_m = cluster_m * CLUSTER_M + (int)(blockIdx.x % CLUSTER_M);
#else
    grouped_tile_of(tile, tiles_m, tiles_n, GROUP_M, tile_m, tile_n);
#endif
}

// A unit of a CTA's work: k-tiles k_begin .. k_end - 1 of entry `tile` of the walk. `part`:
// WHOLE, or with STREAM_K a part of a tile that several CTAs share: its FIRST_PART (from
// k-tile 0; that CTA adds the accumulators of the `later` CTAs after it, then runs the
// epilogue) or a LATER_PART (its accumulator goes to the workspace; no epilogue).
enum { WHOLE = 0, FIRST_PART = 1, LATER_PART = 2 };
struct WorkUnit {
    int tile, k_begin, k_end, part, later;
};

// The units of one CTA (or one warpgroup taking turns), in order: whole tiles first, first +
// step, ...; with STREAM_K only the tiles of the whole rounds (tiles - tiles % step of them),
// then the CTA's share of the rest: their k-tiles laid end to end, cut into as many
// contiguous, non-empty ranges of near-equal length as there are CTAs (or k-tiles, if fewer),
// range `first` this CTA's. Each range starts with at most one LATER_PART and ends with at
// most one FIRST_PART, so a CTA writes at most one partial tile, early in its share, and the
// CTA that finishes a tile reads the others' late in its own.
// Stream-K after Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense
// Matrix-Matrix Multiplication on the GPU" (PPoPP 2023), in its data-parallel + one stream-K
// round hybrid; CUTLASS's sm90 stream-K tile scheduler does the same with a fixup workspace.
struct WorkUnits {
    int tiles, kt, next_tile, step;
#if STREAM_K
    int whole;      // tiles of the whole rounds
    int t, k;       // where the rest of this CTA's range begins: leftover tile t, k-tile k
    int remaining;  // k-tiles left in the range
    int later;      // CTAs after this one whose ranges begin inside the tile this one ends in
#endif
    __device__ __forceinline__ WorkUnits(int tiles_, int kt_, int first, int step_)
        : tiles(tiles_), kt(kt_), next_tile(first), step(step_) {
#if STREAM_K
        whole = tiles - tiles % step;
        const long long left = (long long)(tiles % step) * kt;  // k-tiles of the rest
        const long long ranges = min((long long)step, left);
        const long long begin = first < ranges ? left * first / ranges : 0;
        const long long end = first < ranges ? left * (first + 1) / ranges : 0;
        t = (int)(begin / kt);
        k = (int)(begin - (long long)t * kt);
        remaining = (int)(end - begin);
        // Range c begins at floor(left c / ranges): it begins before the end of the tile
        // holding this range's last k-tile when c < ceil(that end x ranges / left).
        const long long tile_end = (end + kt - 1) / kt * kt;
        later = left > 0 ? (int)((tile_end * ranges + left - 1) / left) - first - 1 : 0;
#endif
    }
    __device__ __forceinline__ bool next(WorkUnit& u) {
#if STREAM_K
        if (next_tile < whole) {
            u = {next_tile, 0, kt, WHOLE, 0};
            next_tile += step;
            return true;
        }
        if (remaining <= 0) return false;
        const int k1 = min(kt, k + remaining);
        u = {whole + t, k, k1, k > 0 ? LATER_PART : k1 < kt ? FIRST_PART : WHOLE, later};
        remaining -= k1 - k;
        ++t;
        k = 0;
        return true;
#else
        if (next_tile >= tiles) return false;
        u = {next_tile, 0, kt, WHOLE, 0};
        next_tile += step;
        return true;
#endif
    }
};

// The next unit of `units` that runs an epilogue (not a LATER_PART).
__device__ __forceinline__ bool next_epilogue(WorkUnits& units, WorkUnit& u) {
    while (units.next(u))
        if (u.part != LATER_PART) return true;
    return false;
}

// The stream-K workspace: per CTA and consumer warpgroup, a flag (the launch's token once its
// LATER_PART accumulator is written, reset to 0 by the CTA that reads it), then from the next
// 16 bytes the accumulators (64 x BLOCK_N floats each, float4 q of thread t at q * 128 + t:
// each warp's stores are 512 contiguous bytes). Sized by the launcher (StreamKWorkspace).
__device__ __forceinline__ void flag_release(unsigned long long* flag, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;\n" :: "l"(flag), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long flag_acquire(const unsigned long long* flag) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(flag) : "memory");
    return v;
}

// The boxes of a consumer warpgroup's 64 x EPILOGUE_N pass at (m0, n0) that start inside the
// M x N matrix (the TMA zero-fills, or does not store, the rest of a box).
__device__ __forceinline__ int boxes_inside(int M, int N, int m0, int n0) {
    return m0 < M && n0 < N ? min(EPILOGUE_N / 64, (N - n0 + 63) / 64) : 0;
}

// Consumer warpgroup c's 64 x EPILOGUE_N of C for the pass at (m0, n0) into its staging (free:
// the stores of its last pass have read it), by the TMA: arm barrier `bar` with the bytes of
// the boxes that start inside C and copy them.
__device__ __forceinline__ void load_c(const void* map_c, int M, int N, int m0, int n0,
                                       unsigned my_staging, unsigned bar) {
    const int boxes = boxes_inside(M, N, m0, n0);
    mbar_arrive_expect_tx(bar, boxes * BOX_BYTES);
    for (int j = 0; j < boxes; ++j)
        tma_load_2d(my_staging + j * BOX_BYTES, map_c, bar, n0 + 64 * j, m0);
}

// The k-tile of unit `u` (one with an epilogue) at whose arrival its storer may load its C,
// or -1: at once. The warpgroup's first unit: once its first ring of stages has landed; with
// C_LEAD, a unit of more than C_LEAD k-tiles: no sooner than its k-tile k_end - C_LEAD.
__device__ __forceinline__ int c_go(const WorkUnit& u, bool first) {
    int go = first ? min(u.k_begin + STAGES, u.k_end) - 1 : -1;
    if (C_LEAD > 0 && u.k_end - u.k_begin > C_LEAD) go = max(go, u.k_end - C_LEAD);
    return go;
}

// Advance a k-tile's stage `s` and its fill's parity `phase` by `n` k-tiles.
__device__ __forceinline__ void skip_k_tiles(int& s, unsigned& phase, int n) {
    const int t = s + n;
    phase ^= (unsigned)(t / STAGES) & 1;
    s = t % STAGES;
}

// A stage is free again for this consumer warpgroup: tell every CTA that loads into it (with
// clusters, the peer's multicast half of B lands in it too).
__device__ __forceinline__ void release_stage(unsigned empty) {
#if CLUSTER_M > 1
#pragma unroll
    for (unsigned cta = 0; cta < CLUSTER_M; ++cta) mbar_arrive_cluster(empty, cta);
#else
    mbar_arrive(empty);
#endif
}

// The staging address of D's pair at (row, col) of a consumer warpgroup's 64 x BLOCK_N: box
// col / 64, its 16-byte chunks permuted by the row as the TMA's 128-byte swizzle expects
// (which also spreads a warp's 32 writes over the 32 banks).
__device__ __forceinline__ unsigned staging_at(unsigned my_staging, int row, int col) {
    return my_staging + (col / 64) * BOX_BYTES + row * 128 +
           ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// The epilogue into the staging tile where nothing needs a bounds check: act(acc), or with
// kC act(acc + C) with C read from where D goes, for every pair of one piece (PIECE_N
// columns from 8-column group j_first) of a 128-column half of the warpgroup's fragment
// (`piece`: its first box in the staging tile). Pairs past M or N are
// written too; the TMA stores only what lies inside D. The fragment's pairs are 8 x 8
// matrices of the staging tile (rows 8 r .. 8 r + 7 of the warp's 16, columns 8 j .. 8 j + 7
// of the piece), so a warp moves four of them per ldmatrix_x4 / stmatrix_x4: 8 instructions
// each per thread for a half's 32 pairs, where one 32-bit ld/st.shared per pair took 32, the
// loads of C serialized behind each pair's store (asm volatile). The C
// loads of a batch of four are issued before any of its math. ReLU and the pack are one
// cvt.rn.relu per pair (NaN stays NaN). This runs once per tile with the tensor cores
// waiting, so its length is the cost: the general form (bounds checks and a branch per pair)
// took ~9000 cycles per tile on the H200 (the probes of bench/results/h200-wgmma-tma-epilogue/);
// a compare and select per value, four instructions more per pair than cvt.rn.relu, cost
// ReLU(A @ B + C) 0.5-2.1 points of the best cuBLAS at 4096^3 and 8192^3 and 2.8-6.6 on short
// K (bench/results/h200-wgmma-relu-cvt/).
// kC: 0 no C; 1 C in the staging tile (ldmatrix_x4 before the math); 2 C in `creg`, the
// pairs of this piece as the fragment holds them (creg[r][j]: row lane / 4 + 8 r, column
// 8 j + 2 (lane % 4) of the piece), loaded from global memory by late_c.
template <int kC, bool kRelu>
__device__ __forceinline__ void stage_tile(const float (&acc)[64], int j_first, unsigned piece,
                                           int warp, int lane,
                                           const unsigned (&creg)[2][PIECE_J]) {
    // Lane L gives row L % 8 of matrix q = L / 8 of an x4: q = r + 2 (j' - j), j' = j or j + 1.
    const int row = warp * 16 + 8 * ((lane / 8) % 2) + lane % 8;
    constexpr int kBatch = 4;  // x4 instructions whose C loads are in flight together
#pragma unroll
    for (int j0 = 0; j0 < PIECE_J; j0 += 2 * kBatch) {
        unsigned pairs[kBatch][4];
        unsigned at[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            at[b] = staging_at(piece, row, 8 * (j0 + 2 * b + lane / 16));
            if (kC == 1) ldmatrix_x4(pairs[b], at[b]);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int e = 4 * (j_first + j0 + 2 * b + q / 2) + 2 * (q % 2);  // acc[e], [e + 1]
                float a0 = acc[e], a1 = acc[e + 1];
                if (kC) {
                    float c0, c1;
                    unpack_pair(kC == 1 ? pairs[b][q] : creg[q % 2][j0 + 2 * b + q / 2], c0, c1);
                    a0 += c0;
                    a1 += c1;
                }
                pairs[b][q] = kRelu ? pack_pair_relu(a0, a1) : pack_pair(a0, a1);
            }
            stmatrix_x4(at[b], pairs[b]);
        }
    }
}

// stage_tile with the ReLU chosen at run time (one branch per piece, none per pair).
template <int kC>
__device__ __forceinline__ void stage_tile(const float (&acc)[64], int j_first, unsigned piece,
                                           int warp, int lane, int relu,
                                           const unsigned (&creg)[2][PIECE_J]) {
    if (relu)
        stage_tile<kC, true>(acc, j_first, piece, warp, lane, creg);
    else
        stage_tile<kC, false>(acc, j_first, piece, warp, lane, creg);
}

// The C pairs of one piece of a consumer warpgroup's fragment (its first column n0, rows
// from m0), from global memory into registers in the fragment's layout (creg as for
// stage_tile); pairs past M or N are zero (their D is never stored). C is row-major with
// ldc == N, N % 8 == 0 and 4-byte aligned pairs (the `prefetch` condition).
__device__ __forceinline__ void late_c(const elem_t* __restrict__ C, int M, int N, int m0,
                                       int n0, int warp, int lane,
                                       unsigned (&creg)[2][PIECE_J]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int m = m0 + warp * 16 + lane / 4 + 8 * r;
#pragma unroll
        for (int j = 0; j < PIECE_J; ++j) {
            const int n = n0 + 8 * j + 2 * (lane % 4);
            creg[r][j] = m < M && n < N
                ? __ldg(reinterpret_cast<const unsigned*>(C + (long long)m * N + n)) : 0u;
        }
    }
}

// tmaps: the tensor maps of A and B, as for 09_wgmma.cu. map_d, map_c: the tensor maps of D
// and of a full C (M x N, 64 x 64 boxes, 128-byte swizzle), kernel parameters; read only
// where the kernel's `stage` and `prefetch` conditions below hold (the launcher encodes
// them under the same conditions). Grid: 1-D, CLUSTER_M x at most one cluster per cluster
// tile; a cluster's CTAs are consecutive blocks.
extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_DIMS
KERNEL(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
       const elem_t* __restrict__ C, elem_t* __restrict__ D,
       int M, int N, int K, long long ldc, int relu,
       const unsigned long long* __restrict__ tmaps, void* __restrict__ workspace,
       unsigned long long token,
       const __grid_constant__ TensorMap map_d, const __grid_constant__ TensorMap map_c) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_u32(smem) + 1023) & ~1023u;
    const unsigned staging = base + STAGES * STAGE_BYTES;
    const unsigned full_bar = staging + STAGING_BYTES;  // + 8 * s
    const unsigned empty_bar = full_bar + STAGES * 8;
    // Per consumer warpgroup c (+ 8 * c): its staging holds this tile's C / holds D, ready to
    // store / is free again (the stores have read it; without a prefetch of C).
    const unsigned c_full_bar = empty_bar + STAGES * 8;
    const unsigned d_full_bar = c_full_bar + CONSUMERS * 8;
    const unsigned staging_free_bar = d_full_bar + CONSUMERS * 8;
    // Taking turns, per consumer warpgroup: the other has waited for every k-tile of its tile
    // (so every earlier fill of every stage is complete: see the mainloop).
    const unsigned turn_bar = staging_free_bar + CONSUMERS * 8;
    // Per consumer warpgroup: the storer may load its next tile's C (arrived once per tile).
    const unsigned c_go_bar = turn_bar + (TURNS > 1 ? CONSUMERS * 8 : 0);

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M;
    const int tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    // The clusters walk cluster tiles (with an odd tiles_m, the last cluster tile's second
    // row is past M: computed, never stored); without clusters, CTAs walk tiles.
    const int tiles = (tiles_m + CLUSTER_M - 1) / CLUSTER_M * tiles_n;
    const int first_tile = blockIdx.x / CLUSTER_M, tile_step = gridDim.x / CLUSTER_M;
    const int KT = (K + BLOCK_K - 1) / BLOCK_K;
    const int warpgroup = threadIdx.x / 128;
    const int warp_in_group = (threadIdx.x % 128) / 32;
    const int lane = threadIdx.x & 31;
    // A tensor map needs a 16-byte aligned base and row stride: D leaves through the staging
    // tile and the TMA when it has them (else from registers, as cuda_wgmma), and a full C
    // with them is prefetched into the staging tile (a bias, or an unaligned C, is read from
    // global memory).
    const bool stage = (N % 8) == 0 && (reinterpret_cast<unsigned long long>(D) % 16) == 0;
    const bool prefetch = stage && C != nullptr && ldc == N &&
                          (reinterpret_cast<unsigned long long>(C) % 16) == 0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, STAGE_READERS * CLUSTER_M);
        }
        for (int c = 0; c < CONSUMERS; ++c) {
            mbar_init(c_full_bar + 8 * c, 1);  // the storer's arrive (plus C's bytes)
            mbar_init(d_full_bar + 8 * c, 1);  // the warpgroup's, once D is in the staging
            mbar_init(staging_free_bar + 8 * c, 1);  // the storer's, once the stores read it
            if (TURNS > 1) mbar_init(turn_bar + 8 * c, 1);
            mbar_init(c_go_bar + 8 * c, 1);  // the warpgroup's, at the k-tile `go` of a tile
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#if CLUSTER_M > 1
    cluster_sync();  // the peers' barriers are ready before a multicast signals one
#else
    __syncthreads();
#endif

    if (warpgroup == 0) {
#if CONSUMERS == 2
        setmaxnreg_dec<PRODUCER_REGS>();
#endif
        if (threadIdx.x == 0) {  // producer: the CTA's k-tiles in turn -> stages 0, 1, ..., 0, ...
            const void* map_a = tmaps;
            const void* map_b = tmaps + 16;
            tensormap_acquire(map_a);
            tensormap_acquire(map_b);
            // The stage of the next k-tile, the parity of its fill, and whether the consumers
            // must have freed it first (every round of the ring but the first).
            int s = 0;
            unsigned phase = 0;
            bool refill = false;
            WorkUnits units(tiles, KT, first_tile, tile_step);
            for (WorkUnit u; units.next(u);) {
                int tile_m, tile_n;
                walk_tile(u.tile, tiles_m, tiles_n, tile_m, tile_n);
                for (int kt = u.k_begin; kt < u.k_end; ++kt) {
                    if (refill) mbar_wait(empty_bar + 8 * s, phase ^ 1);
                    const unsigned stage_at = base + s * STAGE_BYTES;
                    mbar_arrive_expect_tx(full_bar + 8 * s, STAGE_BYTES);
#if CLUSTER_M > 1
                    // A row past M reads the last tile row's A: its D is never stored.
                    tma_load_2d(stage_at, map_a, full_bar + 8 * s, kt * BLOCK_K,
                                min(tile_m, tiles_m - 1) * BLOCK_M);
                    // This CTA's share of B's boxes, into every CTA of the cluster (the
                    // stage is free in all of them: its empty barrier counts their
                    // consumers), so each B byte leaves L2 once per cluster.
                    const int rank = (int)(blockIdx.x % CLUSTER_M);
#pragma unroll
                    for (int j = rank * (BLOCK_N / 64 / CLUSTER_M);
                         j < (rank + 1) * (BLOCK_N / 64 / CLUSTER_M); ++j)
                        tma_load_2d_multicast(stage_at + A_STAGE_BYTES + j * B_BOX_BYTES, map_b,
                                              full_bar + 8 * s, tile_n * BLOCK_N + 64 * j,
                                              kt * BLOCK_K, (1 << CLUSTER_M) - 1);
#else
                    tma_load_2d(stage_at, map_a, full_bar + 8 * s, kt * BLOCK_K, tile_m * BLOCK_M);
#pragma unroll
                    for (int j = 0; j < BLOCK_N / 64; ++j)
                        tma_load_2d(stage_at + A_STAGE_BYTES + j * B_BOX_BYTES, map_b,
                                    full_bar + 8 * s, tile_n * BLOCK_N + 64 * j, kt * BLOCK_K);
#endif
                    if (++s == STAGES) {
                        s = 0;
                        phase ^= 1;
                        refill = true;
                    }
                }
            }
        } else if (stage && lane == 0 && warp_in_group >= 1 && warp_in_group <= CONSUMERS) {
            // Epilogue I/O of consumer warpgroup c, while the consumers run the next tile's
            // mainloop: once a pass of its D is in the staging, one TMA store per box; once
            // they have read it, the staging is free: for the tile's next pass (whose C, if
            // any, is in the consumers' registers), or after the last pass, with a full C,
            // the next tile's C goes into it at once (the producer's k-tile loads never wait
            // for the epilogue).
            const int c = warp_in_group - 1;
            const unsigned my_staging = staging + c * 64 * EPILOGUE_N * 2;
            // The tiles and rows of consumer warpgroup c (as in the consumers' loop below).
            const int row0 = TURNS > 1 ? 0 : 64 * c;
            const int my_first = first_tile + (TURNS > 1 ? c : 0) * tile_step;
            const int my_step = TURNS * tile_step;
            WorkUnits units(tiles, KT, my_first, my_step);
            WorkUnit u;
            bool have = next_epilogue(units, u);
            int tile_m, tile_n;
            int gos = 0;  // the waits on c_go_bar so far
            if (prefetch && have) {
                // The first tile's C is read at the tile's end. Loaded at the kernel's start,
                // its 64 KiB per CTA (8.65 MB on 132 SMs, all from DRAM) competed with the first
                // k-tiles' loads and held the first wgmma back by ~2.6 µs at 4096^3 and
                // 8192^3 (5.5 against 2.9 µs from entry to the first k-tile without a C:
                // %globaltimer stamps, bench/results/h200-wgmma-first-c/); it waits for the
                // warpgroup's first ring of stages. Step 10's ReLU(A @ B + C) at 4096 x 4096 x
                // 256 went from 1.02 to 1.08-1.10x the best cuBLAS (the README's targets).
                mbar_wait(c_go_bar + 8 * c, (unsigned)gos++ & 1);
                walk_tile(u.tile, tiles_m, tiles_n, tile_m, tile_n);
                load_c(&map_c, M, N, tile_m * BLOCK_M + row0, tile_n * BLOCK_N, my_staging,
                       c_full_bar + 8 * c);
            }
            int pass = 0;
            while (have) {
                walk_tile(u.tile, tiles_m, tiles_n, tile_m, tile_n);
                const int m0 = tile_m * BLOCK_M + row0;
                WorkUnit after;
                const bool more = next_epilogue(units, after);
                for (int p = 0; p < PASSES; ++p, ++pass) {
                    const int n0 = tile_n * BLOCK_N + p * EPILOGUE_N;
                    mbar_wait(d_full_bar + 8 * c, (unsigned)pass & 1);
                    const int boxes = boxes_inside(M, N, m0, n0);
                    for (int j = 0; j < boxes; ++j)
                        tma_store_2d(&map_d, my_staging + j * BOX_BYTES, n0 + 64 * j, m0);
                    bulk_commit();
                    bulk_wait_read();
                    if (!prefetch || p + 1 < PASSES) {  // a later pass's C is in registers
                        mbar_arrive(staging_free_bar + 8 * c);
                    } else if (more) {
                        if (c_go(after, false) >= 0)
                            mbar_wait(c_go_bar + 8 * c, (unsigned)gos++ & 1);
                        int next_m, next_n;
                        walk_tile(after.tile, tiles_m, tiles_n, next_m, next_n);
                        load_c(&map_c, M, N, next_m * BLOCK_M + row0, next_n * BLOCK_N,
                               my_staging, c_full_bar + 8 * c);
                    }
                }
                u = after;
                have = more;
            }
            bulk_wait_all();  // the copies read shared memory, which lives as long as the CTA
        }
#if CLUSTER_M > 1
        // Every thread takes part in the cluster's last barrier (below for the consumers):
        // a storer still running when the consumers arrived and exiting afterwards hung it.
        cluster_sync();
#endif
        return;
    }

#if CONSUMERS == 2
    setmaxnreg_inc<CONSUMER_REGS>();
#endif
    // Consumer warpgroup `consumer` computes rows row0 .. row0 + 63 of the CTA's tiles
    // `local` = turn, turn + TURNS, ... (all of them, or taking turns every other one).
    const int consumer = warpgroup - 1;
    const int turn = TURNS > 1 ? consumer : 0;
    const int row0 = TURNS > 1 ? 0 : 64 * consumer;
    const int warp = warp_in_group;
    const unsigned my_staging = staging + consumer * 64 * EPILOGUE_N * 2;
    const bool pair_ok = (N & 1) == 0 && (reinterpret_cast<unsigned long long>(D) & 3) == 0;
    // The stage of the next k-tile and the parity of its fill, kept by increments: taken from
    // a 64-bit k-tile count divided by STAGES, they delayed each next wgmma group where STAGES
    // is not a power of two (3 stages: 140.4k against 132.4k cycles per 8192^3 tile; clock64
    // stamps in bench/results/h200-wgmma-pingpong/probes/).
    int s = 0;
    unsigned phase = 0;
    if (TURNS > 1) skip_k_tiles(s, phase, turn * KT);  // the CTA's before this warpgroup's tile
    int local = turn;  // the CTA's tiles before this one
    int epilogues = 0;  // this warpgroup's epilogues so far
    WorkUnits units(tiles, KT, first_tile + turn * tile_step, TURNS * tile_step);
    for (WorkUnit u; units.next(u); local += TURNS) {
        int tile_m, tile_n;
        walk_tile(u.tile, tiles_m, tiles_n, tile_m, tile_n);
        const int m0 = tile_m * BLOCK_M + row0;  // this warpgroup's first row
        const int n0 = tile_n * BLOCK_N;
        float acc[N_SUB][64];
#pragma unroll
        for (int h = 0; h < N_SUB; ++h)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[h][e] = 0.0f;

#if TURNS > 1
        // A parity wait is exact only when the barrier's previous phase has completed: here
        // the previous fill of each stage this tile's first k-tiles wait on, which belongs to
        // the other warpgroup's tile until it has waited for all of that tile's k-tiles (it
        // arrives right after its last wait).
        // The warpgroup waits out the rest of the other's mainloop here: it sleeps between polls.
        if (local > 0)
            mbar_wait<10000000>(turn_bar + 8 * turn, (unsigned)((local - 1) / TURNS) & 1);
#endif
        const int go = prefetch && u.part != LATER_PART ? c_go(u, epilogues == 0) : -1;
        int last = 0;  // the stage of the k-tile before
        for (int kt = u.k_begin; kt < u.k_end; ++kt) {
            mbar_wait(full_bar + 8 * s, phase);
            if (kt == go && threadIdx.x % 128 == 0)
                mbar_arrive(c_go_bar + 8 * consumer);  // the storer may load this tile's C
#if TURNS > 1
            if (kt == u.k_end - 1 && threadIdx.x % 128 == 0)
                mbar_arrive(turn_bar + 8 * ((turn + 1) % TURNS));
#endif
            const unsigned a_tile = base + s * STAGE_BYTES + row0 * (BLOCK_K * 2);
            const unsigned b_tile = base + s * STAGE_BYTES + A_STAGE_BYTES;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BLOCK_K / 16; ++ks) {
                const unsigned long long desc_a = smem_desc(a_tile + ks * 32, 16);
#if BLOCK_N == 256
                // One instruction for all 256 columns reads A once (two n128 read it twice):
                // 94.3 -> 97.7% of cuBLAS at 8192^3 fp16, no epilogue (the probes of
                // bench/results/h200-wgmma-tma-epilogue/).
                wgmma_m64n256k16(reinterpret_cast<float(&)[128]>(acc), desc_a,
                                 smem_desc(b_tile + ks * 16 * 128, B_BOX_BYTES));
#else
                wgmma_m64n128k16(acc[0], desc_a, smem_desc(b_tile + ks * 16 * 128, B_BOX_BYTES));
#endif
            }
            wgmma_commit();
            wgmma_wait<1>();
            if (kt > u.k_begin && threadIdx.x % 128 == 0) release_stage(empty_bar + 8 * last);
            last = s;
            if (++s == STAGES) {
                s = 0;
                phase ^= 1;
            }
        }
        // With a full C and two passes, the second pass's C goes from global memory into
        // registers while the last k-tile's wgmma runs, so that pass waits only for the stores
        // to read the first (through the staging it waited for that read, then for the TMA
        // to load C: ~2500 cycles per tile, the timeline probes of
        // bench/results/h200-wgmma-epilogue-passes/).
        unsigned c_late[2][PIECE_J];
        if (PASSES > 1 && prefetch) late_c(C, M, N, m0, n0 + EPILOGUE_N, warp, lane, c_late);
        wgmma_wait<0>();
        // The tile's last stage is free too: the producer may refill it for the next tile.
        if (threadIdx.x % 128 == 0) release_stage(empty_bar + 8 * last);
        if (TURNS > 1) skip_k_tiles(s, phase, (TURNS - 1) * KT);  // the other's next tile
#if STREAM_K
        if (u.part != WHOLE) {
            // The workspace's layout: see flag_release. The accumulator of a shared tile's
            // later part goes there; the CTA of its first part adds them all, CTA by CTA.
            unsigned long long* flags = static_cast<unsigned long long*>(workspace);
            float4* parts = reinterpret_cast<float4*>(flags + (gridDim.x * CONSUMERS + 1) / 2 * 2);
            const int t = threadIdx.x % 128;
            if (u.part == LATER_PART) {
                float4* to =
                    parts + ((long long)blockIdx.x * CONSUMERS + consumer) * (N_SUB * 16 * 128);
#pragma unroll
                for (int h = 0; h < N_SUB; ++h)
#pragma unroll
                    for (int q = 0; q < 16; ++q)
                        __stcg(to + (h * 16 + q) * 128 + t,
                               make_float4(acc[h][4 * q], acc[h][4 * q + 1], acc[h][4 * q + 2],
                                           acc[h][4 * q + 3]));
                __threadfence();
                warpgroup_barrier(1 + consumer);
                if (t == 0) flag_release(flags + blockIdx.x * CONSUMERS + consumer, token);
                continue;
            }
            // The later parts are the next u.later CTAs'; each wrote its accumulator at the
            // start of its range, long before this CTA reaches the end of its own, so the
            // waits are short.
            for (int cta = blockIdx.x + 1; cta <= (int)blockIdx.x + u.later; ++cta) {
                unsigned long long* flag = flags + cta * CONSUMERS + consumer;
                if (t == 0) {
                    while (flag_acquire(flag) != token) {
                    }
                    flag_release(flag, 0ull);  // a replayed CUDA graph reuses the token
                }
                warpgroup_barrier(1 + consumer);
                const float4* from =
                    parts + ((long long)cta * CONSUMERS + consumer) * (N_SUB * 16 * 128);
#pragma unroll
                for (int h = 0; h < N_SUB; ++h)
#pragma unroll
                    for (int q = 0; q < 16; ++q) {
                        const float4 v = __ldcg(from + (h * 16 + q) * 128 + t);
                        acc[h][4 * q] += v.x;
                        acc[h][4 * q + 1] += v.y;
                        acc[h][4 * q + 2] += v.z;
                        acc[h][4 * q + 3] += v.w;
                    }
            }
        }
#endif
        const int mine = epilogues++;  // this warpgroup's epilogues before this one

        // Epilogue. The wgmma accumulator layout: warp w holds rows 16 w .. 16 w + 15 of the
        // warpgroup's 64; acc[h][4 j + 2 r + e] is row lane / 4 + 8 r, column
        // 128 h + 8 j + 2 (lane % 4) + e.
        if (!stage) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int m = m0 + warp * 16 + lane / 4 + 8 * r;
                if (m >= M) continue;
                elem_t* d_row = D + (long long)m * N;
#pragma unroll
                for (int h = 0; h < N_SUB; ++h)
#pragma unroll
                    for (int j = 0; j < 16; ++j)
                        store_pair(d_row, C, ldc, N, m, n0 + 128 * h + 8 * j + 2 * (lane % 4),
                                   acc[h][4 * j + 2 * r], acc[h][4 * j + 2 * r + 1], relu,
                                   pair_ok);
            }
            continue;
        }
        // Pass by pass (EPILOGUE_N columns each) through the staging, which is free (the
        // stores of the last pass have read it) and, with the prefetch, holds the first
        // pass's C (each later pass's is in c_late, loaded as soon as the pass before has
        // used it: the second's during the last k-tile).
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const int pass = mine * PASSES + p;  // this warpgroup's passes so far
            if (prefetch && p == 0) {
                mbar_wait(c_full_bar + 8 * consumer, (unsigned)mine & 1);
            } else if (prefetch) {  // the storer's arrives: one per tile's earlier passes
                mbar_wait(staging_free_bar + 8 * consumer,
                          (unsigned)(mine * (PASSES - 1) + p - 1) & 1);
            } else if (pass > 0) {
                mbar_wait(staging_free_bar + 8 * consumer, (unsigned)(pass + 1) & 1);
            }
#pragma unroll
            for (int sub = 0; sub < PASS_SUB; ++sub) {
                const int col0 = p * EPILOGUE_N + sub * PIECE_N;  // the piece's, in the tile
                const float(&half)[64] = acc[col0 / 128];
                const int j_first = col0 % 128 / 8;
                const unsigned piece_at = my_staging + sub * (PIECE_N / 64) * BOX_BYTES;
                if (prefetch && p == 0) {
                    stage_tile<1>(half, j_first, piece_at, warp, lane, relu, c_late);
                } else if (prefetch) {
                    stage_tile<2>(half, j_first, piece_at, warp, lane, relu, c_late);
                } else if (C == nullptr) {
                    stage_tile<0>(half, j_first, piece_at, warp, lane, relu, c_late);
                } else {  // a bias, or a C the TMA cannot copy: from global memory, bounds checked
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int row = warp * 16 + lane / 4 + 8 * r;
                        const int m = m0 + row;
                        if (m >= M) continue;
#pragma unroll
                        for (int j = 0; j < PIECE_J; ++j) {
                            const int col = 8 * j + 2 * (lane % 4);  // within the piece
                            const int n = n0 + col0 + col;
                            if (n >= N) continue;  // N % 8 == 0 here: n + 1 < N as well
                            const int e = 4 * (j_first + j) + 2 * r;
                            const float v0 = gemm_epilogue(half[e], C, ldc, m, n, relu);
                            const float v1 = gemm_epilogue(half[e + 1], C, ldc, m, n + 1, relu);
                            asm volatile("st.shared.b32 [%0], %1;\n"
                                         :: "r"(staging_at(piece_at, row, col)),
                                            "r"(pack_pair(v0, v1)) : "memory");
                        }
                    }
                }
            }
            if (PASSES > 2 && prefetch && p >= 1 && p + 1 < PASSES)  // the next pass's C
                late_c(C, M, N, m0, n0 + (p + 1) * EPILOGUE_N, warp, lane, c_late);
            // Every thread's writes reach the async proxy, then the storer may send them.
            fence_proxy_async_shared();
            warpgroup_barrier(1 + consumer);
            if (threadIdx.x % 128 == 0) mbar_arrive(d_full_bar + 8 * consumer);
        }
    }
#if CLUSTER_M > 1
    // No CTA may leave while its peer can still arrive on its barriers.
    cluster_sync();
#endif
}
