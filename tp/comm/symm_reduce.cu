// symm's one-shot all_reduce and reduce_scatter on GPUs as one kernel: copy in, barrier,
// sum every rank's buffer, barrier. It replaces the five or more host-issued operations of
// symm.py's algorithms (copies in and out, two barrier kernels, the widening sum) by one
// launch, so a small collective costs one launch of host time.
//
// The design is vLLM's custom all-reduce (csrc/custom_all_reduce.cuh: per-block flags in
// peer memory, its 1-stage kernel) and the one_shot_all_reduce of PyTorch's
// SymmetricMemory; no NVLink multicast.
//
// Every rank launches the same grid for the same sizes, and block b handles the same
// elements of every chunk on every rank (a grid-stride loop over 16-byte packs, then the
// tail of fewer than one pack in block 0). So block b only has to wait for block b of every
// peer:
//   1. block b copies its elements of every chunk of src into this rank's heap buffer;
//   2. barrier of block b across the ranks (epoch 2c + 1 for this rank's c-th call);
//   3. block b sums its elements of one chunk (all_reduce: the only one; reduce_scatter:
//      chunk `rank`) of every rank's buffer, in rank order 0..P-1, in fp32 for 16-bit
//      types, rounded once (round to nearest even), and writes them to dst;
//   4. barrier again (epoch 2c + 2): no peer still reads this rank's buffer when the kernel
//      ends, so the next operation may overwrite it.
// The call count c lives on the GPU (counters[0]) and the last block to finish advances it,
// so a launch captured in a CUDA graph takes the next epochs at every replay.
//
// A flag area per rank: flags[block][peer] (uint32, SYMM_MAX_RANKS per block), then the
// counters {calls, blocks done}.
// flags[q] points to rank q's area, data[q] to rank q's heap buffer; src may be dst.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// The launch shape and flag layout come from symm_heap.py, which allocates the flag areas.
#if !defined(SYMM_MAX_RANKS) || !defined(SYMM_THREADS)
#error "compile with -DSYMM_MAX_RANKS=... -DSYMM_THREADS=... (tp/comm/symm_heap.py)"
#endif

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T narrow(float x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ __half narrow<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

template <typename T, int V> struct __align__(sizeof(T) * V) Pack { T v[V]; };

// Block blockIdx.x of every rank meets here. The block's earlier writes (ordered by
// __syncthreads, then released at system scope) are visible to the peers' blocks after it,
// and theirs to this block. Flags only grow, so ">= epoch" (a fast peer may be ahead),
// as a signed difference that survives the 32-bit wrap-around.
__device__ __forceinline__ void block_barrier(const unsigned long long* flags, int rank,
                                              int size, unsigned int epoch) {
    __syncthreads();
    const int q = threadIdx.x;
    if (q < size) {
        volatile unsigned int* mine =
            (volatile unsigned int*)flags[rank] + blockIdx.x * SYMM_MAX_RANKS;
        volatile unsigned int* theirs =
            (volatile unsigned int*)flags[q] + blockIdx.x * SYMM_MAX_RANKS;
        __threadfence_system();
        theirs[rank] = epoch;
        while ((int)(mine[q] - epoch) < 0) {
        }
        __threadfence_system();
    }
    __syncthreads();
}

// dst pack i = the sum over the ranks of pack i of their buffers' chunk at element `base`.
template <typename T, int V>
__device__ __forceinline__ void sum_pack(const unsigned long long* data, int size,
                                         long long base, long long i, T* dst) {
    using P = Pack<T, V>;
    float acc[V];
    const P first = ((const P*)((const T*)data[0] + base))[i];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = widen(first.v[j]);
    for (int q = 1; q < size; ++q) {
        const P part = ((const P*)((const T*)data[q] + base))[i];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += widen(part.v[j]);
    }
    P out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = narrow<T>(acc[j]);
    ((P*)dst)[i] = out;
}

// `chunks` chunks of n elements, chunk j of src at src + j * src_stride, are copied into this
// rank's buffer back to back; dst (n elements) gets the sum of one chunk (0 for
// all_reduce, this rank for reduce_scatter). V elements per pack: 16 bytes when every
// chunk's start in src, dst and the buffer is 16-byte aligned, else 1.
template <typename T, int V>
__device__ void reduce(const unsigned long long* data, const unsigned long long* flags,
                       unsigned int* counters, const T* src, long long src_stride, T* dst,
                       long long n, int chunks, int rank, int size) {
    const unsigned int epoch = 2u * ((volatile unsigned int*)counters)[0];
    const long long packs = n / V, tail = packs * V;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    using P = Pack<T, V>;
    T* mine = (T*)data[rank];
    for (int j = 0; j < chunks; ++j) {
        P* to = (P*)(mine + j * n);
        const P* from = (const P*)(src + j * src_stride);
        for (long long i = first; i < packs; i += stride) to[i] = from[i];
        if (blockIdx.x == 0 && tail + threadIdx.x < n)
            mine[j * n + tail + threadIdx.x] = src[j * src_stride + tail + threadIdx.x];
    }
    block_barrier(flags, rank, size, epoch + 1);
    const long long base = (chunks == 1 ? 0 : rank) * n;
    for (long long i = first; i < packs; i += stride) sum_pack<T, V>(data, size, base, i, dst);
    if (blockIdx.x == 0 && tail + threadIdx.x < n)
        sum_pack<T, 1>(data, size, base, tail + threadIdx.x, dst);
    block_barrier(flags, rank, size, epoch + 2);
    if (threadIdx.x == 0 && atomicAdd(&counters[1], 1u) == gridDim.x - 1) {
        counters[1] = 0;  // every block has read counters[0]: the next call may begin
        counters[0] += 1;
    }
}

#define SYMM_REDUCE(NAME, T, V)                                                             \
    extern "C" __global__ void __launch_bounds__(SYMM_THREADS) NAME(                        \
        const unsigned long long* data, const unsigned long long* flags,                    \
        unsigned int* counters, const T* src, long long src_stride, T* dst, long long n,    \
        int chunks, int rank, int size) {                                                   \
        reduce<T, V>(data, flags, counters, src, src_stride, dst, n, chunks, rank, size);   \
    }

SYMM_REDUCE(symm_reduce_fp32_v4, float, 4)
SYMM_REDUCE(symm_reduce_fp32_v1, float, 1)
SYMM_REDUCE(symm_reduce_fp16_v8, __half, 8)
SYMM_REDUCE(symm_reduce_fp16_v1, __half, 1)
SYMM_REDUCE(symm_reduce_bf16_v8, __nv_bfloat16, 8)
SYMM_REDUCE(symm_reduce_bf16_v1, __nv_bfloat16, 1)
