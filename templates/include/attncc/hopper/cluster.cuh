// attncc/hopper/cluster.cuh: a 2-CTA cluster's primitives (PTX ISA: mbarrier at .cluster
// scope, st.async, mapa, barrier.cluster), one function per instruction: what the crossover
// schedule (produce.cuh) shares dequantized tiles with.
//
//   the peer's address:   peer_base(sbase) + offset (the same offset in the peer CTA's shared memory)
//   a store into the peer: st_async_16(peer dst, 16 bytes, peer FULL): counted on the peer's
//                          barrier as transaction bytes when they land
//   an arrival there:     mbarrier_arrive_peer(peer bar) (a thread's; the default semantics:
//                          release, CTA scope), waited for by the peer's plain mbarrier_wait (acquire, CTA
//                          scope): CUTLASS's cluster pipelines (ClusterBarrier::arrive(cta_id),
//                          try_wait.shared::cta) and FlashMLA's crossover do the same. The
//                          cluster-scope forms compile to MEMBAR.ALL.GPU (an arrival) and
//                          CCTL.IVALL, an L1 invalidation (a wait): session 13's multicast
//                          clusters measured 1.585 of a single CTA's time with them, 1.221
//                          without (bench/RESULTS.md). What the barriers order here is shared
//                          memory the other side has finished with (a stage released, then
//                          stored into by the peer) or filled (st.async bytes, counted as
//                          the barrier's transactions): both completed before the phase does.
//   the whole cluster:    cluster_sync() (every thread of both CTAs; after the barriers' inits,
//                          and before a CTA exits, so that no CTA leaves while its peer may still
//                          write to its shared memory or arrive on its barriers)
#pragma once

#include <cstdint>

namespace attncc {
namespace hopper {

// This CTA's rank in its cluster.
__device__ __forceinline__ int cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}

// The shared::cluster address of the same shared-memory offset in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

// The peer's (the other CTA of a 2-CTA cluster) shared::cluster address of this CTA's
// shared-memory base `sbase`: an offset from it addresses the same place in the peer.
__device__ __forceinline__ uint32_t peer_base(uint32_t sbase) { return cluster_address(sbase, cluster_rank() ^ 1); }

// 16 bytes into the peer's shared memory at `dst` (a shared::cluster address), counted as
// transaction bytes on the peer's mbarrier `bar` (shared::cluster) when they land.
__device__ __forceinline__ void st_async_16(uint32_t dst, const uint4& v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(dst), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}

// This thread's arrival on a barrier of the peer CTA (a shared::cluster address), release at CTA
// scope (the default; see the top of this file).
__device__ __forceinline__ void mbarrier_arrive_peer(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Every thread of the cluster arrives (release) and waits for all the others (acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace hopper
}  // namespace attncc
