// Ladder step 11, cuda_wgmma_cluster: cuda_wgmma_persistent in 2-CTA thread block clusters that share B, each CTA loading half of B's k-tile and the TMA multicasting it into both.
//
// Two CTAs on consecutive tile rows (tiles (2 i, n) and (2 i + 1, n), 128 x 256 each) need the
// same 64 x 256 k-tile of B every step. In step 10 each CTA fetches it from L2 on its own; here
// the two are one cluster (`__cluster_dims__(2, 1, 1)`: the hardware places them on one GPC and
// lets each address the other's shared memory), each CTA's producer loads half of B's boxes
// with `cp.async.bulk.tensor ... .multicast::cluster`, and the TMA writes each box into both
// CTAs' stages at the same offset and counts down both CTAs' full barriers. Per k-tile a CTA
// pulls 16 KB of A and 16 KB of B from L2 instead of 16 + 32 KB: a third less L2 -> SM traffic.
// What changes in 10_wgmma_persistent.cu (its `CLUSTER_M > 1` branches):
// - a stage may be refilled only when the consumers of both CTAs are done with it (the peer's
//   multicast lands in it too): its empty barrier counts 2 x CONSUMERS arrivals, and each
//   consumer warpgroup arrives on its own CTA's barrier and, through `mapa`, on the peer's;
// - the clusters, not the CTAs, walk the tiles: a cluster takes a 256 x 256 cluster tile in
//   the grouped order, its CTA of rank r the tile row 2 i + r (with an odd number of tile rows
//   the last cluster tile's second CTA computes rows past M and stores none);
// - a cluster barrier after the barriers are initialised (no multicast may reach a barrier the
//   peer has not set up) and one before the CTAs exit (no remote arrive may reach a CTA that is
//   gone).
// What it should buy: where L2 bandwidth, not the tensor cores, limits the mainloop (the large
// square shapes). Each cluster needs two SMs of one
// GPC free at once, so the grid is #SMs / 2 clusters.
// References: CUDA C++ Programming Guide, "Thread Block Clusters" and "Distributed Shared
// Memory"; PTX ISA, "cp.async.bulk.tensor" (.multicast::cluster), "mapa", "barrier.cluster";
// CUTLASS's sm90 TMA warp-specialized kernels (ClusterShape 2x1x1, multicast TMA loads,
// cluster-wide empty barriers); pranjalssh/fast.cu (2-CTA clusters with B multicast on H100).
#ifndef CLUSTER_M
#define CLUSTER_M 2
#endif
#define KERNEL gemm_wgmma_cluster
#include "10_wgmma_persistent.cu"
