// Epilogue of one consumer warpgroup: O (fp32 accumulators, already normalised) -> 16-bit,
// staged in this warpgroup's rows of the unit's Q stage (its last S GEMM has read them) in the
// TMA's swizzled layout, then one TMA store per 64-column panel (rows past seqlen_q are clipped
// by the tensor map). LSE is written directly by the thread owning each row. In a persistent CTA
// with two Q stages the store runs on into the next work unit: the stage is held (StoreHeldStage)
// until the next unit's first S GEMM, then handed back to the producer for the Q two units on.
// With one Q stage the next unit's Q goes into this very stage, and the consumers wait for it
// before that unit's first S GEMM: the stage is handed back at the end of this epilogue.
#pragma once

#include <cstdint>

#include "sm90/block_info.cuh"
#include "sm90/config.cuh"
#include "sm90/named_barrier.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/ptx/tma.cuh"
#include "sm90/ptx/warpgroup.cuh"
#include "sm90/ptx/wgmma.cuh"
#include "sm90/smem_layout.cuh"

namespace ft_sm90 {

template <int kO>
__device__ __forceinline__ void store_o_lse(SharedStorage& smem, const BlockInfo& blk, int q_stage, int wg, int warp,
                                            int lane, const float (&o)[kO], const float (&lse)[2],
                                            const ptx::TmaDesc* tma_o, float* __restrict__ lse_out, int heads_q,
                                            StoreHeldStage<kQStages, kPersistent>& held) {
  const bool storing_thread = warp == 0 && lane == 0;
  // A unit without a first S GEMM for these rows has not handed the previous stage back yet.
  // Afterwards only this warpgroup's last store may still be in flight.
  held.release(smem.q_ring, storing_thread);
  // This warpgroup's rows of the stage: Q landed before the main loop (the consumer waited for
  // it) and its S GEMMs have completed; no store reads them (that unit's was waited for before
  // the producer reloaded the stage).
  const uint32_t tile = ptx::smem_addr(smem.q[q_stage]) + wg * kWgRows * kRowBytes;
  const int row0 = 16 * warp + lane / 4;  // row of h = 0 within the warpgroup's 64
#pragma unroll
  for (int i = 0; i < kO; i += 2) {
    const int row = row0 + 8 * ptx::acc_row_half(i);
    const int col = (i >> 2) * 8 + 2 * (lane % 4);
    const uint32_t packed = ptx::pack2<kIsBf16>(o[i], o[i + 1]);
    // Panels are kBlockM rows apart; rows of this warpgroup start at `tile`.
    const int panel = col / kPanelCols, c = col % kPanelCols;
    const uint32_t addr = tile + panel * kBlockM * kRowBytes + row * kRowBytes + ((((c / 8) ^ (row % 8))) << 4) +
                          (c % 8) * 2;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed) : "memory");
  }
  ptx::fence_proxy_async_smem();
  named_barrier_sync(barrier_id(BarrierId::kEpilogue0, wg), 128);

  const int first_row = blk.m0() + wg * kWgRows;
  if (storing_thread && first_row < blk.seqlen_q) {
    for (int p = 0; p < kPanels; ++p)
      ptx::tma_store_4d(tma_o, tile + p * kBlockM * kRowBytes, p * kPanelCols, first_row, blk.head, blk.batch);
    ptx::tma_store_commit();
  }
  held.hold(q_stage);  // every warpgroup, stored or not: one arrival each on the stage's empty barrier

  if (lane % 4 == 0) {
    float* lse_row = lse_out + (static_cast<int64_t>(blk.batch) * heads_q + blk.head) * blk.seqlen_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + row0 + 8 * h;
      if (row < blk.seqlen_q) lse_row[row] = lse[h];
    }
  }
  // One Q stage: waiting for the next unit's Q (which waits for this release) before handing the
  // stage back would deadlock; the LSE stores above overlap the store's read.
  if constexpr (kQStages == 1) held.release(smem.q_ring, storing_thread);
}

// Before a consumer warpgroup exits: its last store must have read shared memory.
__device__ __forceinline__ void drain_o_stores(int warp, int lane) {
  if (warp == 0 && lane == 0) ptx::tma_store_wait_read();
}

}  // namespace ft_sm90
