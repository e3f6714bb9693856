// Thread-block cluster wrappers, sm_90: rank, cluster-wide barrier, remote mbarrier arrive; the SM count.
#pragma once

#include <cstdint>

namespace ft_sm90::ptx {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// SM identifiers of the device (%nsmid): at least its SM count; identifiers need not be contiguous, so it may be more.
__device__ __forceinline__ uint32_t sm_ids() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%nsmid;\n" : "=r"(n));
  return n;
}

// Every thread of every CTA of the cluster: barriers initialised before any remote use,
// and no CTA exits while a peer may still write its shared memory or arrive on its barriers.
// Not .aligned: threads of one warp may arrive from different branches.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The address of this CTA's shared variable at `addr` in the shared memory of CTA `rank`.
__device__ __forceinline__ uint32_t map_shared_rank(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// Arrive on an mbarrier anywhere in the cluster (address from map_shared_rank). Default
// .release.cta semantics, as CUTLASS's ClusterBarrier::arrive: the arrival only orders reads
// that wgmma.wait already completed before the peer's TMA overwrites the stage, and
// .release.cluster would put a GPU-wide MEMBAR before every arrival in the consumer loop.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

}  // namespace ft_sm90::ptx
