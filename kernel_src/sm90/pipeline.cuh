// A ring of shared-memory stages guarded by "full" (TMA landed) and "empty" (consumers
// done) mbarriers, and the position (stage index + phase parity) each side keeps in it.
#pragma once

#include <cstdint>

#include "sm90/ptx/cluster.cuh"
#include "sm90/ptx/mbarrier.cuh"
#include "sm90/ptx/tma.cuh"

namespace ft_sm90 {

template <int kStages>
struct PipelineState {
  int index = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1;
    }
  }
};

// Barriers of one ring, living in shared memory. full[s]: one producer arrival plus the
// TMA bytes. empty[s]: one arrival per consumer warp of every CTA that reads the stage (in a
// 2-CTA cluster each CTA's producer multicasts half of every tile into both CTAs' rings).
template <int kStages>
struct RingBarriers {
  uint64_t full[kStages];
  uint64_t empty[kStages];

  __device__ __forceinline__ void init(uint32_t consumer_arrivals) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(ptx::smem_addr(&full[s]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&empty[s]), consumer_arrivals);
    }
  }

  // Producer: wait until stage `st.index` is free (a fresh ring counts as free), call `publish`
  // (what it writes to shared memory there, the consumers see once the phase completes: the arrival
  // releases it), then arm the full barrier for `bytes` of TMA traffic. Returns the barrier's address.
  template <class Publish>
  __device__ __forceinline__ uint32_t producer_acquire(const PipelineState<kStages>& st, uint32_t bytes,
                                                       Publish&& publish) {
    ptx::mbarrier_wait(ptx::smem_addr(&empty[st.index]), st.phase ^ 1);
    publish();
    const uint32_t bar = ptx::smem_addr(&full[st.index]);
    ptx::mbarrier_arrive_expect_tx(bar, bytes);
    return bar;
  }
  __device__ __forceinline__ uint32_t producer_acquire(const PipelineState<kStages>& st, uint32_t bytes) {
    return producer_acquire(st, bytes, [] {});
  }

  // Producer: wait until stage `st.index` is free, call `publish` (as above), then complete its full
  // barrier's phase with nothing loaded (a work unit without key blocks: its consumers only write
  // O = 0 into the stage; or the dynamic scheduler's "no more units").
  template <class Publish>
  __device__ __forceinline__ void producer_skip(const PipelineState<kStages>& st, Publish&& publish) {
    ptx::mbarrier_wait(ptx::smem_addr(&empty[st.index]), st.phase ^ 1);
    publish();
    ptx::mbarrier_arrive(ptx::smem_addr(&full[st.index]));
  }
  __device__ __forceinline__ void producer_skip(const PipelineState<kStages>& st) { producer_skip(st, [] {}); }

  __device__ __forceinline__ void consumer_wait(const PipelineState<kStages>& st) {
    ptx::mbarrier_wait(ptx::smem_addr(&full[st.index]), st.phase);
  }

  // Called by one lane of every consumer warp once its reads of the stage have completed.
  __device__ __forceinline__ void consumer_release(const PipelineState<kStages>& st) {
    ptx::mbarrier_arrive(ptx::smem_addr(&empty[st.index]));
  }

  // The same, on the ring of CTA `rank` of the cluster (whose producer writes into this stage).
  __device__ __forceinline__ void consumer_release_to(const PipelineState<kStages>& st, uint32_t rank) {
    ptx::mbarrier_arrive_cluster(ptx::map_shared_rank(ptx::smem_addr(&empty[st.index]), rank));
  }
};

// A stage that a consumer warpgroup's TMA store may still be reading (a persistent CTA's Q stage,
// in which the previous work unit's O was staged). `release` is called by the whole warpgroup;
// the thread that issued the store waits until the store has read shared memory and then
// arrives, once, on the stage's empty barrier (one arrival per consumer warpgroup).
// kReloaded = false (one unit per CTA): the stage is never loaded again, nothing to hand back.
template <int kStages, bool kReloaded>
struct StoreHeldStage {
  int index = -1;  // the held stage, or -1 (warp-uniform)

  __device__ __forceinline__ void hold(int stage) {
    if constexpr (kReloaded) index = stage;
  }

  __device__ __forceinline__ void release(RingBarriers<kStages>& ring, bool storing_thread) {
    if constexpr (kReloaded) {
      if (index >= 0) {
        if (storing_thread) {
          ptx::tma_store_wait_read();
          ptx::mbarrier_arrive(ptx::smem_addr(&ring.empty[index]));
        }
        index = -1;
      }
    }
  }
};

}  // namespace ft_sm90
