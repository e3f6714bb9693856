// sm90 family: warp-specialized FlashAttention forward for Hopper (sm_90a), no CUTLASS.
//
// One producer warpgroup (a single thread issues every TMA load) and kConsumerWgs consumer
// warpgroups of 64 query rows each; registers move from producer to consumers with
// setmaxnreg; kCtasPerSm CTAs share an SM. Work units and their order: tile_scheduler.cuh (one
// per CTA, or a persistent loop with one or two Q stages). With FT_CTA_MODE=2 the CTAs come in clusters
// of two along the query blocks and each loads half of every K/V tile for both. Semantics:
// kernel_src/README.md; ABI sm90_tma_sched: Q, K, V, O arrive as 4-D tensor maps (tuner/gpu/tma.py),
// LSE as a pointer, the dynamic scheduler's zeroed counter (FT_SCHEDULER=1; null and unread otherwise), and
// split-KV's (or the tail split's) zeroed counters and fp32 partials (FT_KV_SPLITS > 1 or FT_TAIL_SPLITS > 1;
// null and unread otherwise; epilogue.cuh).
#include "sm90/block_info.cuh"
#include "sm90/config.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/mask.cuh"
#include "sm90/ptx/cluster.cuh"
#include "sm90/ptx/tma.cuh"
#include "sm90/ptx/warpgroup.cuh"
#include "sm90/smem_layout.cuh"
#include "sm90/softmax.cuh"
#include "sm90/tile_scheduler.cuh"

using namespace ft_sm90;

#if FT_CTA_MODE == 2
#define FT_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define FT_CLUSTER_DIMS
#endif

extern "C" __global__ void __launch_bounds__(kThreads, kCtasPerSm) FT_CLUSTER_DIMS
    flashtune_fwd(const __grid_constant__ ptx::TmaDesc tma_q, const __grid_constant__ ptx::TmaDesc tma_k,
                  const __grid_constant__ ptx::TmaDesc tma_v, const __grid_constant__ ptx::TmaDesc tma_o,
                  float* __restrict__ lse, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                  float softmax_scale, unsigned int* __restrict__ tile_counter,
                  unsigned int* __restrict__ split_counters, float* __restrict__ split_partials) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024 - raw % 1024) % 1024));

  const int warp_in_cta = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 32, 0);  // warp-uniform
  const int wg = warp_in_cta / 4;
  const int lane = threadIdx.x % 32;
  const int rank = kClusterCtas == 1 ? 0 : static_cast<int>(ptx::cluster_ctarank());
  TileScheduler sched(batch, seqlen_q, seqlen_k, heads_q, heads_kv, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x);

  if (threadIdx.x == 0) {
    smem.k_ring.init(4 * kConsumerWgs * kClusterCtas);
    if constexpr (kSplitKvBarriers) smem.v_ring.init(4 * kConsumerWgs * kClusterCtas);
    smem.q_ring.init(kConsumerWgs);  // the Q stage is free again once every warpgroup's O store read it
    ptx::fence_barrier_init();
  }
  if constexpr (kClusterCtas > 1)
    ptx::cluster_sync();  // the peer's barriers exist before anything arrives on them
  else
    __syncthreads();

  if (wg == 0) {  // producer warpgroup
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (warp_in_cta == 0 && ptx::elect_one()) {
      ptx::tma_prefetch_desc(&tma_q);
      ptx::tma_prefetch_desc(&tma_k);
      ptx::tma_prefetch_desc(&tma_v);
      producer_loads(smem, sched, rank, seqlen_q, seqlen_k, heads_q, heads_kv, &tma_q, &tma_k, &tma_v,
                     tile_counter);
    }
  } else {  // consumer warpgroups
    ptx::setmaxnreg_inc<kConsumerRegs>();
    const int cwg = wg - 1;
    const int warp = warp_in_cta % 4;
    KvState st;
    HeldQStage held;  // the previous unit's Q stage, while its O store may still read it
    open_gemm_turns(cwg);
    for (QState qs; consumer_unit(smem, sched, qs); consumer_next(sched, qs)) {
      const BlockInfo blk(sched.m_block(rank), sched.head(), sched.batch(), seqlen_q, seqlen_k, heads_q, heads_kv,
                          sched.split(), sched.splits());
      const Consumer consumer{smem, blk, cwg, warp, lane, blk.m0() + cwg * kWgRows, qs};
      float o[kORegs];
#pragma unroll
      for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
      OnlineSoftmax<kSRegs> softmax(softmax_scale);
      consumer.run(o, softmax, st, held);
      float row_lse[2];
      softmax.finalize(o, row_lse);
      const SplitSlot split{split_counters, split_partials,
                            (sched.split_tile() * kClusterCtas + rank) * kConsumerWgs + cwg, sched.split(),
                            sched.splits()};
      store_o_lse(smem, blk, qs.index, cwg, warp, lane, o, row_lse, &tma_o, lse, heads_q, held, split);
    }
    close_gemm_turns(cwg);
    drain_o_stores(warp, lane);
  }
  if constexpr (kClusterCtas > 1) ptx::cluster_sync();  // the peer may still multicast into us or arrive here
}
