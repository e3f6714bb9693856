// Epilogue of one consumer warpgroup: O (fp32 accumulators, already normalised) -> 16-bit,
// staged in this warpgroup's rows of the O tile (the Q tile unless kOwnOTile) in the TMA's
// swizzled layout, then one TMA store per 64-column panel (rows past seqlen_q are clipped by
// the tensor map). LSE is written directly by the thread owning each row. A persistent CTA
// lets the store run on into the next work unit and waits for it before staging again.
#pragma once

#include <cstdint>

#include "block_info.cuh"
#include "config.cuh"
#include "named_barrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/warpgroup.cuh"
#include "smem_layout.cuh"
#include "softmax.cuh"

namespace ft_sm90 {

template <int kO>
__device__ __forceinline__ void store_o_lse(SharedStorage& smem, const BlockInfo& blk, int wg, int warp, int lane,
                                            const float (&o)[kO], const float (&lse)[2], const ptx::TmaDesc* tma_o,
                                            float* __restrict__ lse_out, int heads_q) {
  // The Q tile's rows of this warpgroup are free (its last S GEMM has completed); an own O
  // tile is free once the previous unit's store has read it.
  if constexpr (kOwnOTile) {
    if (warp == 0 && lane == 0) ptx::tma_store_wait_read();
    named_barrier_sync(barrier_id(BarrierId::kEpilogue0, wg), 128);
  }
  const uint32_t tile = smem.o_tile() + wg * kWgRows * kRowBytes;
  const int row0 = 16 * warp + lane / 4;  // row of h = 0 within the warpgroup's 64
#pragma unroll
  for (int i = 0; i < kO; i += 2) {
    const int row = row0 + 8 * acc_row_half(i);
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
  if (warp == 0 && lane == 0 && first_row < blk.seqlen_q) {
    for (int p = 0; p < kPanels; ++p)
      ptx::tma_store_4d(tma_o, tile + p * kBlockM * kRowBytes, p * kPanelCols, first_row, blk.head, blk.batch);
    ptx::tma_store_commit();
  }

  if (lane % 4 == 0) {
    float* lse_row = lse_out + (static_cast<int64_t>(blk.batch) * heads_q + blk.head) * blk.seqlen_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + row0 + 8 * h;
      if (row < blk.seqlen_q) lse_row[row] = lse[h];
    }
  }

  if constexpr (!kOwnOTile)  // the Q tile is reloaded (or the CTA exits) only after this
    if (warp == 0 && lane == 0 && first_row < blk.seqlen_q) ptx::tma_store_wait_read();
}

// Before a persistent consumer warpgroup exits: its last store must have read shared memory.
__device__ __forceinline__ void drain_o_stores(int warp, int lane) {
  if constexpr (kOwnOTile)
    if (warp == 0 && lane == 0) ptx::tma_store_wait_read();
}

}  // namespace ft_sm90
