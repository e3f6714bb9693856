// sm90 family: warp-specialized FlashAttention forward for Hopper (sm_90a), no CUTLASS.
//
// One producer warpgroup (a single thread issues every TMA load) and kConsumerWgs consumer
// warpgroups of 64 query rows each; registers move from producer to consumers with
// setmaxnreg. Grid: (query blocks, heads_q, batch); query blocks run last-first so that
// the longest causal blocks start first. Semantics: kernel_src/README.md; ABI sm90_tma:
// Q, K, V, O arrive as 4-D tensor maps (tuner/gpu/tma.py), LSE as a pointer.
#include "block_info.cuh"
#include "config.cuh"
#include "epilogue.cuh"
#include "mainloop.cuh"
#include "ptx/tma.cuh"
#include "ptx/warpgroup.cuh"
#include "smem_layout.cuh"
#include "softmax.cuh"

using namespace ft_sm90;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    flashtune_fwd(const __grid_constant__ ptx::TmaDesc tma_q, const __grid_constant__ ptx::TmaDesc tma_k,
                  const __grid_constant__ ptx::TmaDesc tma_v, const __grid_constant__ ptx::TmaDesc tma_o,
                  float* __restrict__ lse, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                  float softmax_scale) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024 - raw % 1024) % 1024));

  const int warp_in_cta = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 32, 0);  // warp-uniform
  const int wg = warp_in_cta / 4;
  const int lane = threadIdx.x % 32;
  const BlockInfo blk(gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z, seqlen_q, seqlen_k, heads_q, heads_kv);

  if (threadIdx.x == 0) {
    smem.k_ring.init(4 * kConsumerWgs);
    smem.v_ring.init(4 * kConsumerWgs);
    ptx::mbarrier_init(ptx::smem_addr(&smem.q_full), 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // producer warpgroup
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (warp_in_cta == 0 && ptx::elect_one()) {
      ptx::tma_prefetch_desc(&tma_q);
      ptx::tma_prefetch_desc(&tma_k);
      ptx::tma_prefetch_desc(&tma_v);
      producer_loads(smem, blk, &tma_q, &tma_k, &tma_v);
    }
  } else {  // consumer warpgroups
    ptx::setmaxnreg_inc<kConsumerRegs>();
    const int cwg = wg - 1;
    const Consumer consumer{smem, blk, cwg, warp_in_cta % 4, lane, blk.m0() + cwg * kWgRows};
    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
    OnlineSoftmax<kSRegs> softmax(softmax_scale);
    consumer.run(o, softmax);
    float row_lse[2];
    softmax.finalize(o, row_lse);
    store_o_lse(smem, blk, cwg, consumer.warp, lane, o, row_lse, &tma_o, lse, heads_q);
  }
}
