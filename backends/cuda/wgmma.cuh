// Shared by the wgmma rungs (09_wgmma, 10_wgmma_persistent, 11_wgmma_cluster): PTX wrappers
// for the mbarrier, TMA, cluster, stmatrix and wgmma instructions, and the matrix descriptor
// of a 128-byte swizzled tile.
// References: PTX ISA, "mbarrier", "Tensor copy" (cp.async.bulk.tensor), "mapa",
// "barrier.cluster", "Asynchronous warpgroup level matrix instructions", setmaxnreg; CUTLASS's
// cute/arch/mma_sm90_desc.hpp and cutlass/arch/barrier.h.
#pragma once
#include "tensor_core.cuh"

// --- mbarrier (PTX ISA "Parallel synchronization and communication: mbarrier") ---
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count));
}
// Arrive once and expect `bytes` more transaction bytes (the TMA copies of a stage).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Wait until the phase with parity `parity` of the barrier has completed. SUSPEND_NS > 0 is
// try_wait's suspend-time hint (CUTLASS's ClusterBarrier::wait passes 10 ms): ptxas then puts
// the thread to sleep between polls (NANOSLEEP.SYNCS) instead of polling in a loop, for a
// wait expected to be long.
template <unsigned SUSPEND_NS = 0>
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        if (SUSPEND_NS > 0)
            asm volatile("{\n.reg .pred p;\n"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                         "selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done) : "r"(bar), "r"(parity), "n"(SUSPEND_NS) : "memory");
        else
            asm volatile("{\n.reg .pred p;\n"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         "selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}

// --- thread block clusters (PTX ISA "mapa", "barrier.cluster") ---
// Arrive once on barrier `bar` (a shared::cta address of this CTA) of CTA `cta` of the
// cluster: the barrier at the same offset in that CTA's shared memory. The default semantics
// (release at CTA scope), as CUTLASS's ClusterBarrier::arrive: the consumers signal that
// wgmma has read a stage, and they wrote nothing the peer reads. `.release.cluster` would
// make ptxas put a MEMBAR.ALL.GPU before every arrive, a full memory fence per k-tile in the
// consumers' loop (it ran the cluster rung at 1.24-1.37 us per k-tile and CTA in four
// configurations at 132 CTAs, whatever the tile size: bf16 8192^3,
// bench/results/h200-wgmma-cluster-fence/probe_clusters.txt).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
    asm volatile("{\n.reg .b32 remote;\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
                 :: "r"(bar), "r"(cta) : "memory");
}
// Every non-exited thread of the cluster arrives, then waits for the others: what one CTA
// wrote before (barrier initialisation included) is visible to all after.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n"
                 ::: "memory");
}

// --- TMA (PTX ISA "cp.async.bulk.tensor") ---
// A CUtensorMap's 128 opaque bytes (cuda.h, which NVRTC does not see), for tensor maps passed
// as __grid_constant__ kernel parameters: the copy instructions take their address.
struct __align__(64) TensorMap {
    unsigned long long raw[16];
};
// The tensor maps live in global memory (written by the host before the launch): acquire
// them for the tensor-map proxy before the first copy uses them.
__device__ __forceinline__ void tensormap_acquire(const void* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n"
                 :: "l"(map) : "memory");
}
// Box at element coordinates (x: innermost, y) of `map` into shared memory at dst; its bytes
// count down the transaction count of barrier `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* map, unsigned bar, int x,
                                            int y) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}
// tma_load_2d into every CTA of the cluster whose bit is set in `ctas`, at the same offset
// dst in each one's shared memory, counting down each one's barrier at offset bar.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const void* map,
                                                      unsigned bar, int x, int y,
                                                      unsigned short ctas) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar), "h"(ctas) : "memory");
}

// Box at element coordinates (x, y) of `map` from shared memory at src to global memory, as
// a bulk group of this thread (cp.async.bulk.commit_group / wait_group); the parts of the box
// outside the matrix are not written.
__device__ __forceinline__ void tma_store_2d(const void* map, unsigned src, int x, int y) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n"
                 :: "l"(map), "r"(x), "r"(y), "r"(src) : "memory");
}

// --- stmatrix (PTX ISA "stmatrix", sm_90): ldmatrix_x4's inverse ---
// Lanes 8 i .. 8 i + 7 give the addresses of matrix i's 8 rows (16 bytes each) and r[i] is
// the calling lane's pair of matrix i (row lane / 4, columns 2 (lane % 4) and + 1): a warp
// writes four 8x8 matrices of an accumulator's pairs in one instruction.
__device__ __forceinline__ void stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// --- wgmma (PTX ISA "Asynchronous warpgroup level matrix instructions") ---
// Matrix descriptor of a 128-byte swizzled operand tile at shared address addr: bits 0-13
// address / 16, 16-29 leading-dimension byte offset / 16, 32-45 stride-dimension byte offset
// / 16, 62-63 swizzle mode (1: 128 bytes). In both layouts here the stride offset is 1024
// bytes, from one group of 8 rows of 128 bytes to the next. The leading offset is ignored for
// the K-major A; for the N-major B it is the distance between 64-column boxes.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned leading_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) |
           (unsigned long long)(leading_bytes >> 4) << 16 |
           (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int n>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(n) : "memory");
}
template <int regs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(regs));
}
template <int regs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(regs));
}

// d (64 x 128 fp32, this warpgroup's fragment) += A (64 x 16, K-major) * B (16 x 128,
// N-major: imm-trans-b = 1), both read from shared memory through their descriptors. The 64
// accumulator operands are spelled out: inline PTX has no loops.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], unsigned long long desc_a,
                                                 unsigned long long desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." MMA_TYPE "." MMA_TYPE " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
        " %64, %65, p, 1, 1, 0, 1;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b));
}

// As wgmma_m64n128k16, 256 columns wide: one instruction reads the 64 x 16 A tile once for
// all 256 columns (two m64n128k16 read it twice). d: 128 fp32 accumulators per thread, the
// fragment of m64n128k16's layout continued: d[64 h + e] is m64n128k16's d[e] of columns
// 128 h .. 128 h + 127.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long desc_a,
                                                 unsigned long long desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." MMA_TYPE "." MMA_TYPE " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"
        " %128, %129, p, 1, 1, 0, 1;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b));
}
