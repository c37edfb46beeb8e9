// Shared by every CUDA C kernel of the ladder: the element type and the fused epilogue
// D = act(acc + C).
#pragma once

// The launcher compiles 16-bit kernels with -DGEMM_FP16 or -DGEMM_BF16; A, B, C and D then
// hold that type and the kernel accumulates in fp32. Without either, everything is float.
#if defined(GEMM_BF16)
#include <cuda_bf16.h>
typedef __nv_bfloat16 elem_t;
__device__ __forceinline__ float to_float(elem_t x) { return __bfloat162float(x); }
__device__ __forceinline__ elem_t from_float(float x) { return __float2bfloat16_rn(x); }
#elif defined(GEMM_FP16)
#include <cuda_fp16.h>
typedef __half elem_t;
__device__ __forceinline__ float to_float(elem_t x) { return __half2float(x); }
__device__ __forceinline__ elem_t from_float(float x) { return __float2half_rn(x); }
#else
typedef float elem_t;
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float from_float(float x) { return x; }
#endif

// C is optional (nullptr) and is either a full row-major (M, N) matrix (ldc = N) or a
// length-N bias broadcast over the rows of D (ldc = 0). The comparison is written so that
// a NaN stays NaN, as in torch.relu: an error upstream is never hidden by the epilogue.
// Returns the value to store in fp32; from_float() rounds it to elem_t once.
__device__ __forceinline__ float gemm_epilogue(float acc, const elem_t* __restrict__ C,
                                               long long ldc, int m, int n, int relu) {
    if (C != nullptr) acc += to_float(C[m * ldc + n]);
    return (relu && acc < 0.0f) ? 0.0f : acc;
}
