// FT_UNIT_OVERLAP=1: a consumer warpgroup's work units with no gap between them. Within a unit the
// overlapped loop issues S_n = Q K_n^T with O += P_{n+1} V_{n+1}; without this knob a unit's last P.V is
// waited for alone, then its epilogue runs, then the next unit's first S GEMM and softmax run with no GEMM
// in flight, and every consumer warpgroup of the CTA reaches those points together, so the tensor cores
// idle for about one and a half key blocks per unit (BENCHMARKS.md, session 22). Here the next unit's first
// S GEMM is issued with this unit's last P.V, its softmax runs while that P.V does, and this unit's epilogue
// follows (Consumer::step_into). It needs the next unit's Q in the other Q stage (q_stages=2; this unit's O
// is staged in its own), and this warpgroup must compute the next unit's first key block (can_step_into);
// otherwise the unit ends as without the knob. The Q stage of the unit before is handed back after this
// unit's second S GEMM (its first ran before that unit's O store was issued), or, where there is none,
// before waiting for the next unit's Q, which the producer loads into that very stage.
#pragma once

#include <cstdint>

#include "sm90/block_info.cuh"
#include "sm90/config.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/softmax.cuh"
#include "sm90/tile_scheduler.cuh"

namespace ft_sm90 {

// A consumer warpgroup's share of the problem: what it needs to compute and store any unit.
struct UnitContext {
  SharedStorage& smem;
  int rank, seqlen_q, seqlen_k, heads_q, heads_kv;
  float softmax_scale;
  int wg, warp, lane;  // consumer warpgroup index, warp within it, lane
  const ptx::TmaDesc* tma_o;
  float* lse;
  unsigned* split_counters;
  float* split_partials;

  __device__ __forceinline__ BlockInfo block(const TileScheduler& sched) const {
    return BlockInfo(sched.m_block(rank), sched.head(), sched.batch(), seqlen_q, seqlen_k, heads_q, heads_kv,
                     sched.split(), sched.splits());
  }
  __device__ __forceinline__ SplitSlot split_slot(const TileScheduler& sched) const {
    return SplitSlot{split_counters, split_partials, (sched.split_tile() * kClusterCtas + rank) * kConsumerWgs + wg,
                     sched.split(), sched.splits()};
  }
  // O normalised, then staged in the unit's Q stage and stored (epilogue.cuh)
  __device__ __forceinline__ void finish(const BlockInfo& blk, int q_stage, float (&o)[kORegs],
                                         OnlineSoftmax<kSRegs>& softmax, HeldQStage& held,
                                         const SplitSlot& split) const {
    float row_lse[2];
    softmax.finalize(o, row_lse);
    store_o_lse(smem, blk, q_stage, wg, warp, lane, o, row_lse, tma_o, lse, heads_q, held, split);
  }
};

// FT_UNIT_OVERLAP=2: the producer of unit_overlap issues each next unit's Q early. producer_loads issues it
// after the unit's last K/V load (the dynamic scheduler fetching the unit just before), about kv_stages key
// blocks before the consumers need it; with the step the consumers need it before this unit's last P.V, not
// after the epilogue, and it lands late. Here the next unit is taken (fetched) once this unit's Q is issued, and
// its Q is issued as soon as its stage is free: after each K/V load the producer tests the stage's empty
// barrier without waiting (waiting there could deadlock: a warpgroup that skips this unit's blocks hands the
// stage back only at the unit's end), so Q's load runs beside this unit's blocks. A next unit without key
// blocks, and the -1 of the dynamic scheduler, go as in producer_loads, after this unit's loads.
__device__ __forceinline__ void producer_loads_early_q(SharedStorage& smem, TileScheduler sched, int rank,
                                                       int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                                                       const ptx::TmaDesc* tma_q, const ptx::TmaDesc* tma_k,
                                                       const ptx::TmaDesc* tma_v, unsigned* tile_counter) {
  const uint64_t evict_first = ptx::l2_policy_evict_first();
  const uint64_t evict_last = ptx::l2_policy_evict_last();
  KvState st;
  QState qs;
  const auto block = [&](const TileScheduler& at) {
    return BlockInfo(at.m_block(rank), at.head(), at.batch(), seqlen_q, seqlen_k, heads_q, heads_kv, at.split(),
                     at.splits());
  };
  const auto publish_at = [&](const QState& at, int unit) {
    return [&smem, at, unit] {
      if constexpr (kDynamicScheduler) smem.q_unit[at.index] = unit;
    };
  };
  const auto load_q = [&](const QState& at, const BlockInfo& b, int unit) {  // waits for the stage
    const uint32_t q_bar = smem.q_ring.producer_acquire(at, kQTileBytes, publish_at(at, unit));
    const uint32_t q_tile = ptx::smem_addr(smem.q[at.index]);
    for (int p = 0; p < kPanels; ++p)
      ptx::tma_load_4d(q_tile + p * kBlockM * kRowBytes, tma_q, q_bar, p * kPanelCols, b.m0(), b.head, b.batch,
                       evict_first);
  };
  const auto next_unit = [&](TileScheduler& at) {
    if constexpr (kDynamicScheduler)
      at.fetch(tile_counter);
    else
      at.next();
  };
  bool q_issued = false;  // the unit's Q was issued during the unit before's loads
  while (sched.valid()) {
    const BlockInfo blk = block(sched);
    if (blk.empty()) {  // nothing to load: the consumers write O = 0 into the stage once it is free
      smem.q_ring.producer_skip(qs, publish_at(qs, sched.unit));
      next_unit(sched);
      qs.advance();
      q_issued = false;
      continue;
    }
    if (!q_issued) load_q(qs, blk, sched.unit);
    TileScheduler next = sched;
    next_unit(next);
    QState qn = qs;
    qn.advance();
    const BlockInfo nblk = block(next);
    bool early = next.valid() && !nblk.empty();  // the next unit's Q still to issue early
    for (int n = blk.n_block_max - 1; n >= blk.n_block_min(); --n) {
      load_kv_tile_pair(smem, st, n, blk, rank, tma_k, tma_v, evict_last);
      if (early && ptx::mbarrier_test_wait(ptx::smem_addr(&smem.q_ring.empty[qn.index]), qn.phase ^ 1)) {
        load_q(qn, nblk, next.unit);  // the stage is free: no wait
        early = false;
      }
    }
    if (early) load_q(qn, nblk, next.unit);  // not free before this unit's last load: waited for, as producer_loads does
    q_issued = next.valid() && !nblk.empty();
    sched = next;
    qs = qn;
  }
  if constexpr (kDynamicScheduler) {
    sched.retire(tile_counter);
    smem.q_ring.producer_skip(qs, publish_at(qs, -1));  // -1: no more units
  }
}

__device__ __forceinline__ void run_units_overlapped(const UnitContext& cx, TileScheduler sched) {
  KvState st;
  HeldQStage held;
  QState qs;
  uint32_t p[kPvSteps][4];
  OnlineSoftmax<kSRegs> softmax(cx.softmax_scale);
  bool carried = false;  // this unit's first key block ran in the step from the unit before (P in p)
  int n_first = 0;
  for (bool have = consumer_unit(cx.smem, sched, qs); have;) {
    const BlockInfo blk = cx.block(sched);
    const Consumer c{cx.smem, blk, cx.wg, cx.warp, cx.lane, blk.m0() + cx.wg * kWgRows, qs};
    const SplitSlot split = cx.split_slot(sched);
    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
    const bool pending = carried || c.start(p, softmax, st, held, n_first);  // a P whose P.V is not issued
    if (pending) c.overlapped_blocks(o, p, softmax, st, carried ? blk.n_block_max - 1 : n_first, held);

    TileScheduler next = sched;
    QState qn = qs;
    consumer_next(next, qn);
    c.release_held(held);  // the producer loads the next unit's Q into the held stage
    have = consumer_unit(cx.smem, next, qn);
    OnlineSoftmax<kSRegs> next_softmax(cx.softmax_scale);
    carried = false;
    if (pending && have) {
      const BlockInfo nblk = cx.block(next);
      const Consumer cn{cx.smem, nblk, cx.wg, cx.warp, cx.lane, nblk.m0() + cx.wg * kWgRows, qn};
      if constexpr (!kDynamicScheduler) cx.smem.q_ring.consumer_wait(qn);  // (dynamic: consumer_unit waited)
      carried = cn.can_step_into();
      if (carried) cn.step_into(o, p, next_softmax, st);
    }
    if (pending && !carried) {
      c.pv_gemm(o, p, st);
      st.advance();
    }
    cx.finish(blk, qs.index, o, softmax, held, split);
    softmax = next_softmax;
    sched = next;
    qs = qn;
  }
}

}  // namespace ft_sm90
