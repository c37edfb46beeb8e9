// Ladder step 10, cuda_wgmma_persistent: cuda_wgmma made persistent (one CTA per SM loops over
// the tiles) with D leaving through shared memory by TMA bulk copies while the next tile computes.
//
// cuda_wgmma launches one CTA per tile: every tile pays the CTA's start (barrier set-up, the
// first TMA loads of an empty pipeline) and its end (the epilogue, with the tensor cores idle
// and no loads in flight). Here the grid is min(#SMs, #tiles) CTAs, each walking tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... in the grouped order, and the pipeline never drains:
// - the producer's stage ring runs across tile boundaries (one k-tile counter for the CTA's
//   whole life), so while the consumers finish tile i and write it out, the TMA is already
//   loading tile i+1's first STAGES k-tiles;
// - a full C is prefetched: once tile i's first k-tiles are on their way, the producer has the
//   TMA copy tile i's rows of C into the staging tile (cp.async.bulk, shared <- global, one
//   copy per row), so the epilogue reads C from shared memory, not from DRAM with the tensor
//   cores waiting;
// - the epilogue writes act(acc + C) into the staging tile (over C, each thread where it read)
//   and one lane per row hands the row to the TMA unit (cp.async.bulk, global <- shared); the
//   consumers go on to tile i+1's mainloop as soon as the copies have read the staging.
// What it should buy: the per-tile start and the global stores stop costing tensor-core time;
// the most on short K (few k-tiles per tile, so the fixed costs weigh more) and on shapes with
// more tiles than SMs. What it still lacks (cuBLAS's sm90 kernels have them): the epilogue's
// own math overlapping the next mainloop (two consumer warpgroups taking turns, CUTLASS's
// "ping-pong"); clusters with TMA multicast are step 11 (11_wgmma_cluster.cu), which is this
// file built with CLUSTER_M = 2: the `CLUSTER_M > 1` branches below are what it adds.
// The staging rows are BLOCK_N * 2 + 16 bytes apart: each warp's 4-byte writes then fall in 32
// different banks, and every row stays 16-byte aligned as cp.async.bulk requires. A bulk copy
// moves a whole number of 16-byte units to a 16-byte aligned address, so it needs N % 8 == 0
// and a 16-byte aligned D; otherwise the kernel stores from registers as cuda_wgmma does. The
// prefetch of C needs the same of C (a bias, or an unaligned C, is read from global memory).
// Mainloop, tensor maps, alignment and any M, N, K: as 09_wgmma.cu. The consumer mainloop and
// the register epilogue are written out here as there: built from one shared header instead,
// this kernel ran 9% slower at 8192^3 and 6% on 16384x4096x512 on the H200 (bf16, step 9
// unchanged; bench/results/h200-wgmma-shared-mainloop/), so the copy stays.
// References: PTX ISA, "cp.async.bulk", "cp.async.bulk.commit_group/wait_group", "membar/fence"
// (fence.proxy.async), "bar.sync"; CUTLASS's sm90 persistent kernels (tile scheduler, TMA store
// epilogue); the wgmma references of 09_wgmma.cu.
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
#ifndef KERNEL
#define KERNEL gemm_wgmma_persistent
#endif

#define CONSUMERS (BLOCK_M / 64)
#define N_SUB (BLOCK_N / 128)  // m64n128k16 instructions per k16 step
#define A_STAGE_BYTES (BLOCK_M * BLOCK_K * 2)
#define B_BOX_BYTES (BLOCK_K * 64 * 2)  // BLOCK_K rows x 64 columns of B
#define STAGE_BYTES (A_STAGE_BYTES + BLOCK_N * BLOCK_K * 2)
#define STAGING_ROW_BYTES (BLOCK_N * 2 + 16)  // + 16: 4 banks of skew per row
#define STAGING_BYTES (BLOCK_M * STAGING_ROW_BYTES)
// Stages (1024-aligned for the swizzle), the staging tile, then a full and an empty mbarrier
// per stage and per consumer warpgroup's staging rows; + 1024 to align the dynamic shared
// memory's base.
#define SMEM_BYTES (STAGES * STAGE_BYTES + STAGING_BYTES + 1024 + 2 * (STAGES + CONSUMERS) * 8)

static_assert(BLOCK_K == 64, "a k-tile is one 128-byte swizzle span of 16-bit elements");
static_assert(BLOCK_M == 64 || BLOCK_M == 128, "one or two consumer warpgroups of 64 rows");
static_assert(BLOCK_N % 128 == 0 && BLOCK_N <= 256, "BLOCK_N: 128 or 256");
static_assert(THREADS == 128 * (1 + CONSUMERS), "THREADS: one producer + consumer warpgroups");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than a block can have on sm_90");
static_assert(GROUP_M >= 1, "GROUP_M >= 1");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "CLUSTER_M: 1 or 2 CTAs per cluster");
static_assert(BLOCK_N / 64 % CLUSTER_M == 0, "each CTA of a cluster loads as many B boxes");

#if CLUSTER_M > 1
#define CLUSTER_DIMS __cluster_dims__(CLUSTER_M, 1, 1)
#else
#define CLUSTER_DIMS
#endif

// Read by the launcher, which raises the kernel's dynamic shared memory limit to it.
extern "C" __constant__ int gemm_dynamic_smem = SMEM_BYTES;

// --- bulk copies shared -> global and their groups (PTX ISA "cp.async.bulk") ---
__device__ __forceinline__ void bulk_store(void* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Copy `bytes` from global src to shared dst; they count down barrier `bar`'s transactions.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// Wait until this thread's bulk groups have read their shared-memory source.
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Wait until this thread's bulk groups have completed (their writes are done).
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Make this thread's shared-memory writes visible to the async proxy (the bulk copies).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier `id` (1, 2, ...; 0 is __syncthreads) over the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier(int id) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory");
}

// The producer's prefetch of C for the tile at (m0, n0), tile number `local` of the CTA: per
// consumer warpgroup c, wait until its staging rows are free (its stores of tile local - 1
// have read them), arm its barrier with the bytes of its rows inside M, and copy each row.
__device__ __forceinline__ void prefetch_c_rows(const elem_t* C, int N, int M, int m0, int n0,
                                                unsigned staging, unsigned c_full_bar,
                                                unsigned c_empty_bar, int local) {
    const unsigned bytes = (unsigned)min(BLOCK_N, N - n0) * 2;
    for (int c = 0; c < CONSUMERS; ++c) {
        if (local > 0) mbar_wait(c_empty_bar + 8 * c, (unsigned)(local + 1) & 1);
        const int first = m0 + 64 * c;
        const int rows = max(0, min(64, M - first));
        mbar_arrive_expect_tx(c_full_bar + 8 * c, rows * bytes);
        for (int r = 0; r < rows; ++r)
            bulk_load(staging + (64 * c + r) * STAGING_ROW_BYTES,
                      C + (long long)(first + r) * N + n0, bytes, c_full_bar + 8 * c);
    }
}

#if CLUSTER_M > 1
// Tile `tile` of the clusters' walk: cluster tile (row of CLUSTER_M tile rows, column) in the
// grouped order; this CTA, `rank` in its cluster, has the tile row rank of it.
__device__ __forceinline__ void cluster_tile_of(int tile, int tiles_m, int tiles_n, int rank,
                                                int& tile_m, int& tile_n) {
    int cluster_m;
    grouped_tile_of(tile, (tiles_m + CLUSTER_M - 1) / CLUSTER_M, tiles_n,
                    (GROUP_M + CLUSTER_M - 1) / CLUSTER_M, cluster_m, tile_n);
    tile_m = cluster_m * CLUSTER_M + rank;
}
#endif

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

// tmaps: the tensor maps of A and B, as for 09_wgmma.cu. Grid: 1-D, CLUSTER_M x at most one
// cluster per cluster tile; a cluster's CTAs are consecutive blocks.
extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_DIMS
KERNEL(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
       const elem_t* __restrict__ C, elem_t* __restrict__ D,
       int M, int N, int K, long long ldc, int relu,
       const unsigned long long* __restrict__ tmaps) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_u32(smem) + 1023) & ~1023u;
    const unsigned staging = base + STAGES * STAGE_BYTES;
    const unsigned full_bar = staging + STAGING_BYTES;  // + 8 * s
    const unsigned empty_bar = full_bar + STAGES * 8;
    // Per consumer warpgroup c (+ 8 * c): its staging rows hold this tile's C / are free again.
    const unsigned c_full_bar = empty_bar + STAGES * 8;
    const unsigned c_empty_bar = c_full_bar + CONSUMERS * 8;

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M;
    const int tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
#if CLUSTER_M > 1
    // Cluster tiles: CLUSTER_M tile rows by one tile column (with an odd tiles_m, the last
    // cluster tile's second row is past M: computed, never stored).
    const int tiles = (tiles_m + CLUSTER_M - 1) / CLUSTER_M * tiles_n;
    const int rank = blockIdx.x % CLUSTER_M;
    const int first_tile = blockIdx.x / CLUSTER_M, tile_step = gridDim.x / CLUSTER_M;
#else
    const int tiles = tiles_m * tiles_n;
#endif
    const int KT = (K + BLOCK_K - 1) / BLOCK_K;
    const int warpgroup = threadIdx.x / 128;
    // Bulk copies move 16-byte units to and from 16-byte aligned addresses: rows of D (and of
    // C, to prefetch it) must be.
    const bool bulk = (N % 8) == 0 && (reinterpret_cast<unsigned long long>(D) % 16) == 0;
    const bool prefetch_c = bulk && C != nullptr && ldc == N &&
                            (reinterpret_cast<unsigned long long>(C) % 16) == 0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, CONSUMERS * CLUSTER_M);
        }
        for (int c = 0; c < CONSUMERS; ++c) {
            mbar_init(c_full_bar + 8 * c, 1);  // the producer's arrive (plus C's bytes)
            mbar_init(c_empty_bar + 8 * c, 1);  // the warpgroup's, once its stores read it
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#if CLUSTER_M > 1
    cluster_sync();  // the peers' barriers are ready before a multicast signals one
#else
    __syncthreads();
#endif

    if (warpgroup == 0) {  // producer: k-tile `it` of the CTA's life goes to stage it % STAGES
#if CONSUMERS == 2
        setmaxnreg_dec<40>();
#endif
        if (threadIdx.x == 0) {
            const void* map_a = tmaps;
            const void* map_b = tmaps + 16;
            tensormap_acquire(map_a);
            tensormap_acquire(map_b);
            long long it = 0;
            int local = 0;  // tiles this CTA has done
#if CLUSTER_M > 1
            for (int tile = first_tile; tile < tiles; tile += tile_step, ++local) {
                int tile_m, tile_n;
                cluster_tile_of(tile, tiles_m, tiles_n, rank, tile_m, tile_n);
#else
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
                int tile_m, tile_n;
                grouped_tile_of(tile, tiles_m, tiles_n, GROUP_M, tile_m, tile_n);
#endif
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = (int)(it % STAGES);
                    if (it >= STAGES) mbar_wait(empty_bar + 8 * s, (unsigned)((it / STAGES) + 1) & 1);
                    const unsigned stage = base + s * STAGE_BYTES;
                    mbar_arrive_expect_tx(full_bar + 8 * s, STAGE_BYTES);
#if CLUSTER_M > 1
                    // A row past M reads the last tile row's A: its D is never stored.
                    tma_load_2d(stage, map_a, full_bar + 8 * s, kt * BLOCK_K,
                                min(tile_m, tiles_m - 1) * BLOCK_M);
                    // This CTA's share of B's boxes, into every CTA of the cluster (the
                    // stage is free in all of them: its empty barrier counts their
                    // consumers), so each B byte leaves L2 once per cluster.
#pragma unroll
                    for (int j = rank * (BLOCK_N / 64 / CLUSTER_M);
                         j < (rank + 1) * (BLOCK_N / 64 / CLUSTER_M); ++j)
                        tma_load_2d_multicast(stage + A_STAGE_BYTES + j * B_BOX_BYTES, map_b,
                                              full_bar + 8 * s, tile_n * BLOCK_N + 64 * j,
                                              kt * BLOCK_K, (1 << CLUSTER_M) - 1);
#else
                    tma_load_2d(stage, map_a, full_bar + 8 * s, kt * BLOCK_K, tile_m * BLOCK_M);
#pragma unroll
                    for (int j = 0; j < BLOCK_N / 64; ++j)
                        tma_load_2d(stage + A_STAGE_BYTES + j * B_BOX_BYTES, map_b,
                                    full_bar + 8 * s, tile_n * BLOCK_N + 64 * j, kt * BLOCK_K);
#endif
                    // With the first k-tiles in flight (the consumers are finishing the last
                    // tile, so its staging frees soon), C's rows of this tile.
                    if (prefetch_c && kt == min(STAGES, KT) - 1)
                        prefetch_c_rows(C, N, M, tile_m * BLOCK_M, tile_n * BLOCK_N, staging,
                                        c_full_bar, c_empty_bar, local);
                }
            }
        }
        return;
    }

#if CONSUMERS == 2
    setmaxnreg_inc<232>();
#endif
    const int consumer = warpgroup - 1;  // rows 64 * consumer .. + 63 of each tile
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x % 128) / 32;
    const unsigned my_staging = staging + consumer * 64 * STAGING_ROW_BYTES;
    const bool pair_ok = (N & 1) == 0 && (reinterpret_cast<unsigned long long>(D) & 3) == 0;
    long long it = 0;
    int local = 0;
#if CLUSTER_M > 1
    for (int tile = first_tile; tile < tiles; tile += tile_step, ++local) {
        int tile_m, tile_n;
        cluster_tile_of(tile, tiles_m, tiles_n, rank, tile_m, tile_n);
#else
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
        int tile_m, tile_n;
        grouped_tile_of(tile, tiles_m, tiles_n, GROUP_M, tile_m, tile_n);
#endif
        const int m0 = tile_m * BLOCK_M + consumer * 64;  // this warpgroup's first row
        const int n0 = tile_n * BLOCK_N;
        float acc[N_SUB][64];
#pragma unroll
        for (int h = 0; h < N_SUB; ++h)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[h][e] = 0.0f;

        for (int kt = 0; kt < KT; ++kt, ++it) {
            const int s = (int)(it % STAGES);
            mbar_wait(full_bar + 8 * s, (unsigned)(it / STAGES) & 1);
            const unsigned a_tile = base + s * STAGE_BYTES + consumer * 64 * (BLOCK_K * 2);
            const unsigned b_tile = base + s * STAGE_BYTES + A_STAGE_BYTES;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BLOCK_K / 16; ++ks) {
                const unsigned long long desc_a = smem_desc(a_tile + ks * 32, 16);
#pragma unroll
                for (int h = 0; h < N_SUB; ++h)
                    wgmma_m64n128k16(acc[h], desc_a,
                                     smem_desc(b_tile + h * 2 * B_BOX_BYTES + ks * 16 * 128,
                                               B_BOX_BYTES));
            }
            wgmma_commit();
            wgmma_wait<1>();
            if (kt > 0 && threadIdx.x % 128 == 0)
                release_stage(empty_bar + 8 * (int)((it - 1) % STAGES));
        }
        wgmma_wait<0>();
        // The tile's last stage is free too: the producer may refill it for the next tile.
        if (threadIdx.x % 128 == 0) release_stage(empty_bar + 8 * (int)((it - 1) % STAGES));

        // Epilogue. The wgmma accumulator layout: warp w holds rows 16 w .. 16 w + 15 of the
        // warpgroup's 64; acc[h][4 j + 2 r + e] is row lane / 4 + 8 r, column
        // 128 h + 8 j + 2 (lane % 4) + e.
        if (!bulk) {
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
        // The previous tile's stores have read the staging: warp 0 waited for that before it
        // came here. With the prefetch, this tile's C is in it.
        warpgroup_barrier(1 + consumer);
        if (prefetch_c) mbar_wait(c_full_bar + 8 * consumer, (unsigned)local & 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = warp * 16 + lane / 4 + 8 * r;
            const int m = m0 + row;
            if (m >= M) continue;
#pragma unroll
            for (int h = 0; h < N_SUB; ++h)
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    const int col = 128 * h + 8 * j + 2 * (lane % 4);
                    const int n = n0 + col;
                    if (n >= N) continue;  // N % 8 == 0 here: n + 1 < N as well
                    const unsigned at = my_staging + row * STAGING_ROW_BYTES + col * 2;
                    float a0 = acc[h][4 * j + 2 * r], a1 = acc[h][4 * j + 2 * r + 1];
                    if (prefetch_c) {  // C's pair, where D's pair goes
                        unsigned c_bits;
                        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(c_bits) : "r"(at));
                        a0 += to_float(elem_of(c_bits & 0xFFFF));
                        a1 += to_float(elem_of(c_bits >> 16));
                    }
                    const elem_t* c_in = prefetch_c ? nullptr : C;  // else C from global
                    const elem_t v0 = from_float(gemm_epilogue(a0, c_in, ldc, m, n, relu));
                    const elem_t v1 = from_float(gemm_epilogue(a1, c_in, ldc, m, n + 1, relu));
                    asm volatile("st.shared.b32 [%0], %1;\n"
                                 :: "r"(at), "r"(elem_bits(v0) | elem_bits(v1) << 16)
                                 : "memory");
                }
        }
        fence_proxy_async_shared();
        warpgroup_barrier(1 + consumer);
        if (warp == 0) {  // lane l sends rows l and l + 32 of the warpgroup's 64
            const unsigned bytes = (unsigned)min(BLOCK_N, N - n0) * 2;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = lane + 32 * half;
                if (m0 + row < M)
                    bulk_store(D + (long long)(m0 + row) * N + n0,
                               my_staging + row * STAGING_ROW_BYTES, bytes);
            }
            bulk_commit();
            // Before the next tile: the staging is free once the stores have read it.
            bulk_wait_read();
            __syncwarp();
            if (lane == 0) mbar_arrive(c_empty_bar + 8 * consumer);
        }
    }
    // The copies read shared memory, which lives only as long as the CTA.
    if (warp == 0) bulk_wait_all();
#if CLUSTER_M > 1
    // Nor may a CTA leave while its peer can still arrive on its barriers.
    cluster_sync();
#endif
}
