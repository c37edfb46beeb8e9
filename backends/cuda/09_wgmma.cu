// Ladder step 9, cuda_wgmma: Hopper's warpgroup MMA (wgmma) fed by the tensor memory
// accelerator (TMA), with a producer warpgroup and consumer warpgroups (sm_90a only).
//
// What cuda_mma still does by hand, Hopper does in hardware, and this is the structure of
// cuBLAS's and CUTLASS's sm90 kernels:
// - TMA (cp.async.bulk.tensor): one thread issues the copy of a whole A or B box from a tensor
//   map (a 128-byte descriptor the host encodes with cuTensorMapEncodeTiled: address, sizes,
//   strides, box, swizzle). The copy engine computes the addresses, zero-fills what lies
//   outside the matrix (edge tiles need no other path) and writes shared memory in the 128-byte
//   swizzled layout wgmma reads without bank conflicts. No registers, no per-thread loads.
// - mbarriers with transaction counts: the producer arms the stage's "full" barrier with the
//   bytes it expects; the TMA's completions count them down, and the consumers wait on it.
//   Consumers arrive on the stage's "empty" barrier once their wgmmas have read it.
// - wgmma.mma_async: a warpgroup (4 warps) multiplies a 64 x 16 A tile by a 16 x 128 B tile,
//   both read straight from shared memory through 64-bit matrix descriptors (no ldmatrix, no
//   operand registers), into 64 fp32 accumulators per thread. It is asynchronous: the
//   consumer commits a k-tile's wgmmas as a group and waits only for the previous group
//   (wgmma.wait_group 1), so the tensor cores always have the next tile queued.
// - Warp specialization: warpgroup 0 only issues TMA copies, BLOCK_M / 64 consumer
//   warpgroups only compute; setmaxnreg moves registers from the producer (40 per thread) to
//   the consumers (232), which hold 128 accumulators each at BLOCK_N = 256.
// B stays row-major K x N ("N-major" for wgmma, imm-trans-b = 1): each stage loads it as
// BLOCK_N / 64 boxes of BLOCK_K rows x 64 columns (128 bytes, the swizzle span).
// Not here (what separates it from cuBLAS, whose sm90 kernels have all of these): thread-block
// clusters with TMA multicast (one L2 read feeds two SMs), a persistent tile scheduler, a
// consumer ping-pong that overlaps one tile's epilogue with the next tile's mainloop, and
// epilogue stores through shared memory and TMA.
// Alignment: a tensor map needs 16-byte aligned rows (K % 8 == 0 for A, N % 8 == 0 for B);
// the launcher copies an operand into a padded buffer when they are not, so any M, N, K >= 1
// works. Epilogue: D = act(acc + C) from the accumulators, as cuda_mma.
// References: PTX ISA, "Asynchronous warpgroup level matrix instructions" (wgmma.mma_async,
// matrix descriptors, register fragments), "Tensor copy" (cp.async.bulk.tensor), "mbarrier",
// setmaxnreg; CUDA C++ Programming Guide, "Tensor Memory Accelerator"; CUDA driver API,
// cuTensorMapEncodeTiled; CUTLASS's cute/arch/mma_sm90_desc.hpp (descriptor layouts).
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
#define STAGES 4
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef THREADS
#define THREADS 384  // the producer warpgroup and BLOCK_M / 64 consumer warpgroups
#endif

#define CONSUMERS (BLOCK_M / 64)
#define N_SUB (BLOCK_N / 128)  // m64n128k16 instructions per k16 step
#define A_STAGE_BYTES (BLOCK_M * BLOCK_K * 2)
#define B_BOX_BYTES (BLOCK_K * 64 * 2)  // BLOCK_K rows x 64 columns of B
#define STAGE_BYTES (A_STAGE_BYTES + BLOCK_N * BLOCK_K * 2)
// + 1024: the 128-byte swizzle repeats every 1024 bytes, so stages start 1024-aligned; the
// dynamic shared memory's base is only 16-byte aligned. Then a full and an empty mbarrier
// (8 bytes each) per stage.
#define SMEM_BYTES (STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8)

static_assert(BLOCK_K == 64, "a k-tile is one 128-byte swizzle span of 16-bit elements");
static_assert(BLOCK_M == 64 || BLOCK_M == 128, "one or two consumer warpgroups of 64 rows");
static_assert(BLOCK_N % 128 == 0 && BLOCK_N <= 256, "BLOCK_N: 128 or 256");
static_assert(THREADS == 128 * (1 + CONSUMERS), "THREADS: one producer + consumer warpgroups");
static_assert(STAGES >= 2, "the pipeline needs at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than a block can have on sm_90");
static_assert(GROUP_M >= 1, "GROUP_M >= 1");

// Read by the launcher, which raises the kernel's dynamic shared memory limit to it.
extern "C" __constant__ int gemm_dynamic_smem = SMEM_BYTES;

// tmaps: two CUtensorMap (128 bytes each) in global memory: A (inner dimension K, box
// BLOCK_K x BLOCK_M) and B (inner dimension N, box 64 x BLOCK_K); A and B are read only
// through them.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_wgmma(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
           const elem_t* __restrict__ C, elem_t* __restrict__ D,
           int M, int N, int K, long long ldc, int relu,
           const unsigned long long* __restrict__ tmaps) {
    extern __shared__ __align__(1024) unsigned char smem[];
    // Stage s: A tile (BLOCK_M rows of 128 bytes) at s * STAGE_BYTES, then BLOCK_N / 64 boxes
    // of B; the barriers after the last stage.
    const unsigned base = (smem_u32(smem) + 1023) & ~1023u;
    const unsigned full_bar = base + STAGES * STAGE_BYTES;  // + 8 * s
    const unsigned empty_bar = full_bar + STAGES * 8;

    int tile_m, tile_n;
    grouped_tile(GROUP_M, tile_m, tile_n);
    const int m0 = tile_m * BLOCK_M;
    const int n0 = tile_n * BLOCK_N;
    const int KT = (K + BLOCK_K - 1) / BLOCK_K;
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);  // the producer's arrive (plus the TMA bytes)
            mbar_init(empty_bar + 8 * s, CONSUMERS);  // one arrive per consumer warpgroup
        }
        // Make the initialised barriers visible to the TMA unit (the async proxy).
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warpgroup == 0) {  // producer
#if CONSUMERS == 2
        setmaxnreg_dec<40>();
#endif
        if (threadIdx.x == 0) {
            const void* map_a = tmaps;
            const void* map_b = tmaps + 16;
            tensormap_acquire(map_a);
            tensormap_acquire(map_b);
            for (int kt = 0; kt < KT; ++kt) {
                const int s = kt % STAGES;
                // Reusing a stage: wait until the consumers released the tile it held.
                if (kt >= STAGES) mbar_wait(empty_bar + 8 * s, ((kt / STAGES) + 1) & 1);
                const unsigned stage = base + s * STAGE_BYTES;
                mbar_arrive_expect_tx(full_bar + 8 * s, STAGE_BYTES);
                tma_load_2d(stage, map_a, full_bar + 8 * s, kt * BLOCK_K, m0);
#pragma unroll
                for (int j = 0; j < BLOCK_N / 64; ++j)
                    tma_load_2d(stage + A_STAGE_BYTES + j * B_BOX_BYTES, map_b, full_bar + 8 * s,
                                n0 + 64 * j, kt * BLOCK_K);
            }
        }
        return;
    }

#if CONSUMERS == 2
    setmaxnreg_inc<232>();
#endif
    const int consumer = warpgroup - 1;  // rows 64 * consumer .. + 63 of the tile
    float acc[N_SUB][64];
#pragma unroll
    for (int h = 0; h < N_SUB; ++h)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[h][e] = 0.0f;

    for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(full_bar + 8 * s, (kt / STAGES) & 1);
        const unsigned a_tile = base + s * STAGE_BYTES + consumer * 64 * (BLOCK_K * 2);
        const unsigned b_tile = base + s * STAGE_BYTES + A_STAGE_BYTES;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BLOCK_K / 16; ++ks) {
            // k16 step ks: 32 bytes along A's swizzled rows; 16 rows (2048 bytes) down B.
            const unsigned long long desc_a = smem_desc(a_tile + ks * 32, 16);
#pragma unroll
            for (int h = 0; h < N_SUB; ++h)
                wgmma_m64n128k16(acc[h], desc_a,
                                 smem_desc(b_tile + h * 2 * B_BOX_BYTES + ks * 16 * 128,
                                           B_BOX_BYTES));
        }
        wgmma_commit();
        // Tile kt's wgmmas stay queued; once tile kt - 1's have finished, release its stage.
        wgmma_wait<1>();
        if (kt > 0 && threadIdx.x % 128 == 0) mbar_arrive(empty_bar + 8 * ((kt - 1) % STAGES));
    }
    wgmma_wait<0>();

    // Epilogue from registers. The wgmma accumulator layout: warp w of the warpgroup holds
    // rows 16 w .. 16 w + 15; within it, as the m16n8 mma fragment repeated along N,
    // acc[h][4 j + 2 r + e] is row lane / 4 + 8 r, column 128 h + 8 j + 2 (lane % 4) + e.
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x % 128) / 32;
    const bool pair_ok = (N & 1) == 0 && (reinterpret_cast<unsigned long long>(D) & 3) == 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int m = m0 + consumer * 64 + warp * 16 + lane / 4 + 8 * r;
        if (m >= M) continue;
        elem_t* d_row = D + (long long)m * N;
#pragma unroll
        for (int h = 0; h < N_SUB; ++h)
#pragma unroll
            for (int j = 0; j < 16; ++j)
                store_pair(d_row, C, ldc, N, m, n0 + 128 * h + 8 * j + 2 * (lane % 4),
                           acc[h][4 * j + 2 * r], acc[h][4 * j + 2 * r + 1], relu, pair_ok);
    }
}
