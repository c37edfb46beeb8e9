// Shared by the wgmma rungs (09_wgmma, 10_wgmma_persistent), included after their tile macros
// (BLOCK_K, STAGES, N_SUB, STAGE_BYTES, A_STAGE_BYTES, B_BOX_BYTES): one consumer
// warpgroup's mainloop over a tile, and the store of its accumulators from registers.
#pragma once
#include "wgmma.cuh"

// The tile's KT k-tiles, at positions it0 .. it0 + KT - 1 of the CTA's stage ring (position i
// sits in stage i % STAGES, in its full barrier's phase i / STAGES), into acc (zeroed first)
// for this consumer warpgroup (rows 64 * consumer of each A tile). A k-tile's wgmmas stay
// queued while the next is issued; a stage is released once the wgmmas reading it are done,
// all but the last, which the caller releases when the producer will refill it (a persistent
// CTA; releasing it in 09_wgmma made ptxas serialize the wgmmas, info C7515). Counter: the
// ring position's type (a persistent CTA's count can pass int).
template <typename Counter>
__device__ __forceinline__ void consume_tile(float (&acc)[N_SUB][64], unsigned base,
                                             unsigned full_bar, unsigned empty_bar,
                                             int consumer, int KT, Counter it0) {
#pragma unroll
    for (int h = 0; h < N_SUB; ++h)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[h][e] = 0.0f;
    for (int kt = 0; kt < KT; ++kt) {
        const Counter it = it0 + kt;
        const int s = (int)(it % STAGES);
        mbar_wait(full_bar + 8 * s, (unsigned)(it / STAGES) & 1);
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
        // k-tile kt's wgmmas stay queued; once kt - 1's have finished, release its stage.
        wgmma_wait<1>();
        if (kt > 0 && threadIdx.x % 128 == 0)
            mbar_arrive(empty_bar + 8 * (int)((it - 1) % STAGES));
    }
    wgmma_wait<0>();
}

// D = act(acc + C) for the warpgroup's 64 rows from m0 and BLOCK_N columns from n0, straight
// from the accumulators. The wgmma accumulator layout: warp w of the warpgroup holds rows
// 16 w .. 16 w + 15; within it, as the m16n8 mma fragment repeated along N,
// acc[h][4 j + 2 r + e] is row lane / 4 + 8 r, column 128 h + 8 j + 2 (lane % 4) + e.
__device__ __forceinline__ void store_tile(const float (&acc)[N_SUB][64], elem_t* D,
                                           const elem_t* C, long long ldc, int M, int N, int m0,
                                           int n0, int relu) {
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x % 128) / 32;
    const bool pair_ok = (N & 1) == 0 && (reinterpret_cast<unsigned long long>(D) & 3) == 0;
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
                           acc[h][4 * j + 2 * r], acc[h][4 * j + 2 * r + 1], relu, pair_ok);
    }
}
