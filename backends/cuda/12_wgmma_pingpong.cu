// Ladder step 12, cuda_wgmma_pingpong: the two consumer warpgroups of cuda_wgmma_persistent take
// turns on whole tiles, so that one's epilogue runs while the other's mainloop keeps the tensor
// cores busy (CUTLASS's "ping-pong" schedule).
//
// In steps 10 and 11 both consumer warpgroups compute one 128 x 256 tile (64 rows each) and
// finish it together: the whole SM then runs the epilogue with the tensor cores idle, about
// 4,240 cycles per tile with ReLU(A @ B + C) against a mainloop of ~67,000 at 4096^3 with 4
// stages (clock64 stamps, bench/results/h200-wgmma-late-c/probes/timeline3-sustained.txt),
// 1.8-5.7% of the time at 4096^3 and 8192^3 with and without C. Here a tile is
// 64 x 256 and each warpgroup computes every other tile of the CTA on its own (one
// m64n256k16 per k16 step, 128 accumulators per thread as before): warpgroup 0 takes the
// CTA's tiles 0, 2, 4, ..., warpgroup 1 tiles 1, 3, 5, .... The producer fills the stages in
// tile order, so the mainloops follow each other, and while one warpgroup writes its tile
// into its own staging tile (its own storer thread sends it by TMA and loads its next C),
// the other is already issuing its wgmmas. What changes in 10_wgmma_persistent.cu (its
// `TURNS > 1` branches):
// - a stage is read by one warpgroup: its empty barrier counts one arrival per CTA;
// - a warpgroup's k-tile counter skips the other's tiles (tile `local` of the CTA starts at
//   k-tile local x KT), and its epilogue barriers count its own tiles;
// - an mbarrier parity wait tells only whether the phase of that parity is done, so it is
//   exact only when the barrier's previous phase has completed. A warpgroup's first k-tile
//   wait of a tile is on a stage whose previous fill belongs to the other warpgroup's tile:
//   it first waits on a "turn" barrier, which the other arrives on once it has waited for
//   the last k-tile of its tile (every earlier fill is then complete).
// A 64-row tile halves the A rows that share each B k-tile, so on its own it pulls 1.67x the
// L2 -> SM bytes per FLOP of a 128 x 256 tile; with 2-CTA clusters multicasting B (CLUSTER_M
// = 2, the default, step 11's branches) it pulls the same as step 10. A stage of 64 x 256
// holds half the work of step 10's 128 x 256 (512 cycles of wgmma at the peak), so the stage
// ring must be deeper to cover the same load latency: 5 stages of 40 KB, with one 64 x 64
// staging box per warpgroup (four epilogue passes per tile, C in registers after the first).
// First measured with 4 stages and a whole 64 x 256 staging row per warpgroup: 82-88% of
// the best cuBLAS on the square shapes, 62-65% with 3 (bench/results/h200-wgmma-pingpong/).
// What it should buy: the square shapes with ReLU(A @ B + C), where the epilogue is exposed;
// on short K (a few k-tiles per tile) a warpgroup's epilogue outlasts the other's mainloop
// and the cooperative steps 10 and 11 should stay ahead.
// Measured on the H200 (bench/results/h200-wgmma-pingpong/ and the README): the overlap
// works (some warpgroup is in its mainloop 98-99.9% of a CTA's span at 4096^3 and 8192^3)
// and its CTAs take about the cycles of step 10's, but it runs at 82-92% of the best cuBLAS,
// behind steps 10 and 11 on every shape: the GPU runs it at a lower clock (1.39 against
// 1.56 GHz of cycles per microsecond at 8192^3), and it reads 1.65x the DRAM bytes of step
// 10's earlier profile at 4096^3 (its default GROUP_M band is half as tall; GROUP_M 16 was
// no faster in its tune). Under sustained load it draws the 700 W limit as they do, at
// 1305-1320 against 1455-1500 MHz with as much work per cycle
// (bench/results/h200-clocks-power-pingpong/): more energy per FLOP, paid in clock.
// The wait for its turn is a warpgroup's one long wait (the rest of the other's mainloop
// after its own epilogue): with try_wait's suspend-time hint it sleeps between polls, as
// CUTLASS's barriers do. Measured on the H200 against the polling wait, both built with a
// probe's other change (9 rounds, bench/results/h200-wgmma-wait-hint/ab14.txt, `tree` -
// `desc`): -0.4 to +2.3 points of the best cuBLAS, median +0.50, up in 12 of 16 rows. Steps
// 10 and 11 keep polling: the hint on every wait of theirs moved them -2.3 to +2.7 points, no
// better on the whole.
// References: CUTLASS's sm90 "KernelTmaWarpSpecializedPingpong" (math warpgroups alternating
// over tiles, its ordered barrier between them); PTX ISA, "mbarrier.try_wait.parity"
// (phase parity); the references of 10_wgmma_persistent.cu.
#ifndef BLOCK_M
#define BLOCK_M 64
#endif
#ifndef STAGES
#define STAGES 5
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2
#endif
#define PINGPONG 1
#define KERNEL gemm_wgmma_pingpong
#include "10_wgmma_persistent.cu"
