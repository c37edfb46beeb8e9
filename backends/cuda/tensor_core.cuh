// Shared by the tensor-core rungs (07_wmma to 10_wgmma_persistent): 16-bit element bits,
// ldmatrix, staging of unaligned rows, the grouped tile order and the epilogue of an
// accumulator pair.
#pragma once
#include "common.cuh"

#if !defined(GEMM_FP16) && !defined(GEMM_BF16)
#error "the tensor-core kernels need 16-bit operands: compile with -DGEMM_FP16 or -DGEMM_BF16"
#endif

// The operand type as PTX's mma and wgmma instructions spell it.
#if defined(GEMM_BF16)
#define MMA_TYPE "bf16"
#else
#define MMA_TYPE "f16"
#endif

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned elem_bits(elem_t x) {
#if defined(GEMM_BF16)
    return __bfloat16_as_ushort(x);
#else
    return __half_as_ushort(x);
#endif
}

// Four 8x8 matrices of 16-bit elements from shared memory (PTX ISA "ldmatrix"): lanes
// 8 i .. 8 i + 7 give the addresses of matrix i's 8 rows (16 bytes each), and r[i] receives
// the calling lane's pair of matrix i, row lane / 4, columns 2 (lane % 4) and + 1: the pair
// layout of mma.sync's and wgmma's accumulators.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Two fp32 values rounded to elem_t in one conversion (cvt.rn.bf16x2.f32 / f16x2), lo in the
// low 16 bits: a pair of D as one 32-bit word.
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
#if defined(GEMM_BF16)
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
#else
    const __half2 v = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<const unsigned*>(&v);
}
// pack_pair of ReLU(lo), ReLU(hi) in the same one instruction (cvt.rn.relu: a negative result
// becomes +0, a NaN stays a NaN, the canonical one; PTX ISA "cvt", sm_80+), where a compare
// and select per value took four more instructions per pair.
__device__ __forceinline__ unsigned pack_pair_relu(float lo, float hi) {
    unsigned v;
#if defined(GEMM_BF16)
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;\n" : "=r"(v) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;\n" : "=r"(v) : "f"(hi), "f"(lo));
#endif
    return v;
}
// The two elem_t of a 32-bit word (lo: the low 16 bits) as fp32.
__device__ __forceinline__ void unpack_pair(unsigned bits, float& lo, float& hi) {
#if defined(GEMM_BF16)
    lo = __uint_as_float(bits << 16);
    hi = __uint_as_float(bits & 0xFFFF0000u);
#else
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
    lo = f.x;
    hi = f.y;
#endif
}

// 8 consecutive elements of row `row` of a rows x cols row-major matrix, from column `col`,
// zeros outside it; for operands whose rows are not 16-byte aligned.
__device__ __forceinline__ uint4 load8_scalar(const elem_t* __restrict__ base, int row, int col,
                                              int rows, int cols) {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(base);
    unsigned short v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = (row < rows && col + e < cols) ? p[(long long)row * cols + col + e] : 0;
    return make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16,
                      v[4] | (unsigned)v[5] << 16, v[6] | (unsigned)v[7] << 16);
}

// Grouped tile order (Triton's matmul tutorial): tiles 0, 1, ... of a tiles_m x tiles_n grid
// walk group_m tile rows column by column, so the tiles computed together reuse a few A
// row-panels and B column-panels from L2.
__device__ __forceinline__ void grouped_tile_of(long long pid, int tiles_m, int tiles_n,
                                                int group_m, int& tile_m, int& tile_n) {
    const long long per_group = (long long)group_m * tiles_n;
    const int first_m = (int)(pid / per_group) * group_m;
    const int group_rows = min(tiles_m - first_m, group_m);
    const int in_group = (int)(pid % per_group);
    tile_m = first_m + in_group % group_rows;
    tile_n = in_group / group_rows;
}

// The grouped tile of this block, one block per tile. Grid: x over the tiles along N, y over
// the tiles along M.
__device__ __forceinline__ void grouped_tile(int group_m, int& tile_m, int& tile_n) {
    grouped_tile_of((long long)blockIdx.y * gridDim.x + blockIdx.x, gridDim.y, gridDim.x,
                    group_m, tile_m, tile_n);
}

// D[m, n] and D[m, n + 1] = act(acc + C) from the accumulator pair (a0, a1) that the mma and
// wgmma fragment layouts give a thread; d_row is row m of D, columns past N are dropped.
// pair_ok (N even and D 4-byte aligned, so every pair's address, D + m * N + n with n even,
// is 4-byte aligned) sends the pair out as one 4-byte store.
__device__ __forceinline__ void store_pair(elem_t* __restrict__ d_row,
                                           const elem_t* __restrict__ C, long long ldc, int N,
                                           int m, int n, float a0, float a1, int relu,
                                           bool pair_ok) {
    if (n >= N) return;
    const elem_t v0 = from_float(gemm_epilogue(a0, C, ldc, m, n, relu));
    if (n + 1 < N) {
        const elem_t v1 = from_float(gemm_epilogue(a1, C, ldc, m, n + 1, relu));
        if (pair_ok) {
            *reinterpret_cast<unsigned*>(d_row + n) = elem_bits(v0) | elem_bits(v1) << 16;
        } else {
            d_row[n] = v0;
            d_row[n + 1] = v1;
        }
    } else {
        d_row[n] = v0;
    }
}
