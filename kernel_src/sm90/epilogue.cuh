// Epilogue of one consumer warpgroup: O (fp32 accumulators, already normalised) -> 16-bit,
// staged in this warpgroup's rows of the unit's Q stage (its last S GEMM has read them) in the
// TMA's swizzled layout, then one TMA store per 64-column panel (rows past seqlen_q are clipped
// by the tensor map). LSE is written directly by the thread owning each row. In a persistent CTA
// with two Q stages the store runs on into the next work unit: the stage is held (StoreHeldStage)
// until the next unit's first S GEMM, then handed back to the producer for the Q two units on.
// With one Q stage the next unit's Q goes into this very stage, and the consumers wait for it
// before that unit's first S GEMM: the stage is handed back at the end of this epilogue.
//
// Split-KV (kKvSplits > 1), and the tail split's units of the last wave (kTailSplits > 1, a run-time count):
// each unit computes one key range of its tile; every consumer warpgroup first writes its partial
// (normalised O and LSE, fp32, in its threads' accumulator order) to the workspace and counts itself on its
// rows' counter; the warpgroup whose split arrives last merges the tile's partials (its own from registers)
// and stores O and LSE as above; the others store nothing (merge_splits).
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
#include "sm90/split_merge.cuh"

namespace ft_sm90 {

// Split-KV: where one consumer warpgroup's partial of one unit goes (ABI sm90_tma_sched's split_counters and
// split_partials, sized by the space file's split_counter_bytes and split_partial_bytes). `slot` numbers the
// warpgroup's 64 rows of a tile: (tile * kClusterCtas + rank) * kConsumerWgs + wg, the tile counted among the
// split ones (TileScheduler::split_tile: every tile with split-KV, the last wave's with the tail split, whose
// r tiles of s splits take at most G = gridDim.x / kClusterCtas partials per row); counters[slot] counts the
// splits done with them (zero at launch, and zeroed again by the merging warpgroup, so the counters serve the
// next launch on the stream); partial (slot, split) is kO + 2 rows of 128 floats (O values, then the two LSEs),
// one column per thread of the warpgroup.
struct SplitSlot {
  unsigned* counters;
  float* partials;
  int slot, split;
  int splits;  // the tile's units: kKvSplits, or with the tail split 1 (a whole tile: no partial) or s
};

// Writes this warpgroup's partial and returns whether it merged: then o and lse hold the tile's O
// (normalised) and LSE over all its where.splits key ranges, merged row by row as split_merge.cuh says.
template <int kO>
__device__ __forceinline__ bool merge_splits(const SplitSlot& where, int wg, int tid, float (&o)[kO],
                                             float (&lse)[2]) {
  constexpr int kRows = kO + 2;
  const int splits = kKvSplits > 1 ? kKvSplits : where.splits;
  float* const own = where.partials + (static_cast<int64_t>(where.slot) * splits + where.split) * kRows * 128 + tid;
#pragma unroll
  for (int i = 0; i < kO; ++i) __stcg(own + i * 128, o[i]);
  __stcg(own + kO * 128, lse[0]);
  __stcg(own + (kO + 1) * 128, lse[1]);
  __threadfence();  // this thread's partial is visible on the GPU before the warpgroup counts it
  const uint32_t bar = barrier_id(BarrierId::kEpilogue0, wg);
  named_barrier_sync(bar, 128);
  bool last = false;
  if (tid == 0) {
    last = atomicAdd(&where.counters[where.slot], 1u) == static_cast<unsigned>(splits - 1);
    if (last) where.counters[where.slot] = 0;  // every split has counted: no other access in this launch
  }
  if (!named_barrier_or(bar, 128, last)) return false;
  __threadfence();  // the other splits' partials, counted before our count, are read after it

  const float* const tile = where.partials + static_cast<int64_t>(where.slot) * splits * kRows * 128 + tid;
  const auto split_lse = [&](int s, int h) {
    return s == where.split ? lse[h] : __ldcg(tile + (s * kRows + kO + h) * 128);
  };
  const SplitMerge merge[2] = {SplitMerge([&](int s) { return split_lse(s, 0); }, splits),
                               SplitMerge([&](int s) { return split_lse(s, 1); }, splits)};
  {
    const float own[2] = {merge[0].weight(lse[0]), merge[1].weight(lse[1])};
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] *= own[ptx::acc_row_half(i)];
  }
  // a runtime loop: unrolled, ptxas hoists every split's loads and spills at head dim 64
#pragma unroll 1
  for (int s = 0; s < splits; ++s) {
    if (s == where.split) continue;
    const float w[2] = {merge[0].weight(split_lse(s, 0)), merge[1].weight(split_lse(s, 1))};
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] += w[ptx::acc_row_half(i)] * __ldcg(tile + (s * kRows + i) * 128);
  }
  lse[0] = merge[0].lse;
  lse[1] = merge[1].lse;
  return true;
}

template <int kO>
__device__ __forceinline__ void store_o_lse(SharedStorage& smem, const BlockInfo& blk, int q_stage, int wg, int warp,
                                            int lane, float (&o)[kO], float (&lse)[2], const ptx::TmaDesc* tma_o,
                                            float* __restrict__ lse_out, int heads_q,
                                            StoreHeldStage<kQStages, kPersistent>& held, const SplitSlot& split) {
  const bool storing_thread = warp == 0 && lane == 0;
  // A unit without a first S GEMM for these rows has not handed the previous stage back yet.
  // Afterwards only this warpgroup's last store may still be in flight.
  held.release(smem.q_ring, storing_thread);
  // Split-KV: only the warpgroup that merged the splits stores (warpgroup-uniform); the others take the
  // same path without writing, so the stage is handed back as after a store. The tail split: so do the units of
  // the last wave's split tiles (split.splits > 1, uniform over the CTA); the others store as without it.
  bool write = true;
  if constexpr (kSplitKeys)
    if (kKvSplits > 1 || split.splits > 1) write = merge_splits(split, wg, 32 * warp + lane, o, lse);
  // This warpgroup's rows of the stage: Q landed before the main loop (the consumer waited for
  // it) and its S GEMMs have completed; no store reads them (that unit's was waited for before
  // the producer reloaded the stage).
  const uint32_t tile = ptx::smem_addr(smem.q[q_stage]) + wg * kWgRows * kRowBytes;
  const int row0 = 16 * warp + lane / 4;  // row of h = 0 within the warpgroup's 64
  if (write) {
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
  }
  ptx::fence_proxy_async_smem();
  named_barrier_sync(barrier_id(BarrierId::kEpilogue0, wg), 128);

  const int first_row = blk.m0() + wg * kWgRows;
  // has_rows: first_row >= 0 (block_info.cuh); the tensor map clips rows past seqlen_q
  if (write && storing_thread && blk.has_rows(first_row, kWgRows)) {
    for (int p = 0; p < kPanels; ++p)
      ptx::tma_store_4d(tma_o, tile + p * kBlockM * kRowBytes, p * kPanelCols, first_row, blk.head, blk.batch);
    ptx::tma_store_commit();
  }
  held.hold(q_stage);  // every warpgroup, stored or not: one arrival each on the stage's empty barrier

  if (write && lane % 4 == 0) {
    float* lse_row = lse_out + (static_cast<int64_t>(blk.batch) * heads_q + blk.head) * blk.seqlen_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + row0 + 8 * h;
      if (blk.has_row(row)) lse_row[row] = lse[h];
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
