// The two roles of the main loop: the producer warp issuing every TMA load, and a consumer
// warpgroup computing S = Q K^T, the online softmax and O += P V with wgmma.
#pragma once

#include <cstdint>

#include "sm90/block_info.cuh"
#include "sm90/config.cuh"
#include "sm90/mask.cuh"
#include "sm90/named_barrier.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/ptx/mbarrier.cuh"
#include "sm90/ptx/tma.cuh"
#include "sm90/ptx/wgmma.cuh"
#include "sm90/smem_layout.cuh"
#include "sm90/softmax.cuh"
#include "sm90/tile_scheduler.cuh"

namespace ft_sm90 {

using KvState = PipelineState<kKvStages>;
using QState = PipelineState<kQStages>;          // a work unit's Q stage (and O staging tile) and phase
using HeldQStage = StoreHeldStage<kQStages, kPersistent>;  // a unit's stage while its O store may read it
constexpr int kSRegs = kBlockN / 2;    // S accumulator values per consumer thread
constexpr int kORegs = kHeadDim / 2;   // O accumulator values per consumer thread
constexpr int kPvSteps = kBlockN / 16; // k-steps of O += P V
constexpr int kQkSteps = kHeadDim / 16;
constexpr int kPvFirstSteps = kPvSplit > 0 ? kPvSplit / 16 : kPvSteps;  // k-steps of O += P V issued first

// ---- producer: one elected thread ---------------------------------------------------------
// K or V tile of key block n into ring stage `stage`: alone, the whole tile; in a 2-CTA
// cluster, this CTA's half (rows rank * kKvBoxRows ...) multicast into both CTAs.
__device__ __forceinline__ void load_kv_tile(uint32_t stage, const ptx::TmaDesc* tma, uint32_t bar, int n,
                                             const BlockInfo& blk, int rank, uint64_t policy) {
  const uint32_t share = rank * kKvBoxRows * kRowBytes;
  for (int p = 0; p < kPanels; ++p) {
    const uint32_t dst = stage + p * kBlockN * kRowBytes + share;
    const int row = n * kBlockN + rank * kKvBoxRows;
    if constexpr (kClusterCtas == 1)
      ptx::tma_load_4d(dst, tma, bar, p * kPanelCols, row, blk.kv_head, blk.batch, policy);
    else
      ptx::tma_load_4d_multicast(dst, tma, bar, p * kPanelCols, row, blk.kv_head, blk.batch,
                                 (1u << kClusterCtas) - 1, policy);
  }
}

// Every work unit of this CTA: its Q into the unit's stage, as soon as the O store of the unit
// that used the stage before has read it, and K and V of each key block, last first, into the
// rings (which run on across units). Two Q stages (persistent): that unit is two back, and its
// store is waited for early in the unit in between, so the next unit's Q and then its first K/V
// tiles load while this one computes. One Q stage (persistent): that unit is the previous one,
// whose epilogue releases the stage, so the first K/V tiles go first, at most the ring's depth of
// them (their stages were freed by consumers of earlier units, which never wait for this Q; one
// more would wait for a stage that only this unit's consumers free, after this Q: deadlock), and
// land while the previous unit finishes. FT_SCHEDULER=1: each unit's id goes into shared memory
// next to its Q stage (q_unit) before the stage's full barrier is armed, the next unit is fetched
// from the counter once this one's loads are issued, and after the last one the next stage, once
// free, gets -1 and a completed phase without bytes: the consumers' signal to stop.
__device__ __forceinline__ void producer_loads(SharedStorage& smem, TileScheduler sched, int rank, int seqlen_q,
                                               int seqlen_k, int heads_q, int heads_kv, const ptx::TmaDesc* tma_q,
                                               const ptx::TmaDesc* tma_k, const ptx::TmaDesc* tma_v,
                                               unsigned* tile_counter) {
  const uint64_t evict_first = ptx::l2_policy_evict_first();
  const uint64_t evict_last = ptx::l2_policy_evict_last();
  KvState st;
  QState qs;
  const auto publish = [&] {
    if constexpr (kDynamicScheduler) smem.q_unit[qs.index] = sched.valid() ? sched.unit : -1;
  };
  const auto next_unit = [&] {
    if constexpr (kDynamicScheduler)
      sched.fetch(tile_counter);
    else
      sched.next();
  };
  for (; sched.valid(); next_unit(), qs.advance()) {
    const BlockInfo blk(sched.m_block(rank), sched.head(), sched.batch(), seqlen_q, seqlen_k, heads_q, heads_kv,
                        sched.split(), sched.splits());
    if (blk.empty()) {  // nothing to load: the consumers write O = 0 into the stage once it is free
      smem.q_ring.producer_skip(qs, publish);
      continue;
    }
    // K and V of key block n into the rings' next stage; each CTA's full barrier expects the whole
    // tile: its own half and the peer's
    const auto load_kv = [&](int n) {
      if constexpr (kSplitKvBarriers) {
        load_kv_tile(ptx::smem_addr(smem.k[st.index]), tma_k, smem.k_ring.producer_acquire(st, kKvTileBytes), n,
                     blk, rank, evict_last);
        load_kv_tile(ptx::smem_addr(smem.v[st.index]), tma_v, smem.v_ring.producer_acquire(st, kKvTileBytes), n,
                     blk, rank, evict_last);
      } else {  // K and V of the stage on one barrier
        const uint32_t bar = smem.k_ring.producer_acquire(st, 2 * kKvTileBytes);
        load_kv_tile(ptx::smem_addr(smem.k[st.index]), tma_k, bar, n, blk, rank, evict_last);
        load_kv_tile(ptx::smem_addr(smem.v[st.index]), tma_v, bar, n, blk, rank, evict_last);
      }
      st.advance();
    };
    int n = blk.n_block_max - 1;
    const int n_min = blk.n_block_min();
    if constexpr (kPersistent && kQStages == 1)
      for (const int n_end = n - kKvStages; n > n_end && n >= n_min; --n) load_kv(n);  // ahead of Q
    const uint32_t q_bar = smem.q_ring.producer_acquire(qs, kQTileBytes, publish);
    const uint32_t q_tile = ptx::smem_addr(smem.q[qs.index]);
    for (int p = 0; p < kPanels; ++p)
      ptx::tma_load_4d(q_tile + p * kBlockM * kRowBytes, tma_q, q_bar, p * kPanelCols, blk.m0(), blk.head, blk.batch,
                       evict_first);
    for (; n >= n_min; --n) load_kv(n);
  }
  if constexpr (kDynamicScheduler) {
    sched.retire(tile_counter);
    smem.q_ring.producer_skip(qs, publish);  // -1: no more units
  }
}

// ---- consumers: the next work unit ------------------------------------------------------------
// Whether the unit of Q stage `qs` exists. Static: the scheduler's own order. FT_SCHEDULER=1: the
// unit the producer wrote next to the stage before completing its full barrier's phase (-1: none).
__device__ __forceinline__ bool consumer_unit(SharedStorage& smem, TileScheduler& sched, const QState& qs) {
  if constexpr (kDynamicScheduler) {
    smem.q_ring.consumer_wait(qs);
    sched.unit = smem.q_unit[qs.index];
  }
  return sched.valid();
}
__device__ __forceinline__ void consumer_next(TileScheduler& sched, QState& qs) {
  if constexpr (!kDynamicScheduler) sched.next();
  qs.advance();
}

// ---- ping-pong turn chain, once per CTA -------------------------------------------------------
// Warpgroup w syncs on kWgTurn0 + w before issuing GEMMs and then arrives on the next one's
// barrier. Every warpgroup takes the same number of turns in every work unit (no block skip
// with ping-pong), so the chain runs on across the units of a persistent CTA; opening and
// closing it per unit would let the last warpgroup arrive twice on turn 0 before warpgroup 0
// synced once.
// Before the first unit: the last warpgroup opens the first turn for warpgroup 0.
__device__ __forceinline__ void open_gemm_turns(int wg) {
  if constexpr (kPingPong)
    if (wg == kConsumerWgs - 1) named_barrier_arrive(barrier_id(BarrierId::kWgTurn0, 0), 256);
}
// After the last unit: warpgroup 0 takes the turn left open by the last one.
__device__ __forceinline__ void close_gemm_turns(int wg) {
  if constexpr (kPingPong)
    if (wg == 0) named_barrier_sync(barrier_id(BarrierId::kWgTurn0, 0), 256);
}

// ---- consumer warpgroup ------------------------------------------------------------------
struct Consumer {
  SharedStorage& smem;
  const BlockInfo& blk;
  int wg;         // consumer warpgroup index, 0 .. kConsumerWgs-1
  int warp;       // warp within the warpgroup
  int lane;
  int first_row;  // first query row of this warpgroup
  QState q;       // the unit's Q stage (where this warpgroup also stages its O) and its phase

  // Ping-pong: wait for this warpgroup's turn to issue GEMMs / hand the turn to the next.
  __device__ __forceinline__ void begin_gemm_turn() const {
    if constexpr (kPingPong) named_barrier_sync(barrier_id(BarrierId::kWgTurn0, wg), 256);
  }
  __device__ __forceinline__ void end_gemm_turn() const {
    if constexpr (kPingPong) named_barrier_arrive(barrier_id(BarrierId::kWgTurn0, (wg + 1) % kConsumerWgs), 256);
  }

  __device__ __forceinline__ void issue_qk(float (&s)[kSRegs], const KvState& st) const {
    const uint32_t q_base = ptx::smem_addr(smem.q[q.index]);
    const uint32_t k_base = ptx::smem_addr(smem.k[st.index]);
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk)
      ptx::Wgmma<kBlockN>::template ss<kIsBf16, 0, 0>(s, q_desc(q_base, wg, kk), k_desc(k_base, kk), kk > 0);
  }

  // k-steps [kBegin, kEnd) of O += P V (keys 16 kBegin .. 16 kEnd - 1 of the tile)
  template <int kBegin = 0, int kEnd = kPvSteps>
  __device__ __forceinline__ void issue_pv(float (&o)[kORegs], const uint32_t (&p)[kPvSteps][4],
                                           const KvState& st) const {
    const uint32_t v_base = ptx::smem_addr(smem.v[st.index]);
#pragma unroll
    for (int kk = kBegin; kk < kEnd; ++kk) {
      if constexpr (kPSmem) {  // P from this warpgroup's tile, written by store_p
#if FT_P_SMEM
        const uint32_t p_base = ptx::smem_addr(smem.p[wg]);
        ptx::Wgmma<kHeadDim>::template ss<kIsBf16, 0, 1>(o, p_desc(p_base, kk), v_desc(v_base, kk), 1);
#endif
      } else {
        ptx::Wgmma<kHeadDim>::template rs<kIsBf16, 1>(o, p[kk], v_desc(v_base, kk), 1);
      }
    }
  }

  // p_smem: P (the exponentiated S) as 16-bit pairs into this warpgroup's tile, each thread its
  // accumulator positions (rows 16 warp + lane / 4 (+8), keys 16 kk + 8 h + 2 (lane % 4)), so no
  // P register outlives its pack. Called only once the wgmma that read the previous P completed
  // (wgmma_wait<0>: no write-after-read race). The stores are made visible to the async proxy, then
  // the warpgroup's 128 threads meet on a named barrier before any issues the wgmma: FA3 gets by
  // with __syncwarp, since each warp's rows feed only its own accumulator rows, but the PTX model
  // gives wgmma's operand reads no per-warp ordering, so the barrier is the conservative choice.
  __device__ __forceinline__ void store_p(const float (&s)[kSRegs]) const {
#if FT_P_SMEM
    const uint32_t p_base = ptx::smem_addr(smem.p[wg]);
    const int row = 16 * warp + lane / 4;
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = 16 * kk + 8 * (r >> 1) + 2 * (lane % 4);
        ptx::st_shared_b32(p_base + swizzled_offset(row + 8 * (r & 1), col, kWgRows),
                           ptx::pack2<kIsBf16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]));
      }
    ptx::fence_proxy_async_smem();
    named_barrier_sync(barrier_id(BarrierId::kPTile0, wg), 128);
#endif
  }

  // This warp is done reading the stage: tell the producer(s) that write into it.
  __device__ __forceinline__ void release(RingBarriers<kKvStages>& ring, const KvState& st) const {
    if constexpr (kClusterCtas == 1) {
      if (lane == 0) ring.consumer_release(st);
    } else {
      if (lane < kClusterCtas) ring.consumer_release_to(st, lane);
    }
  }

  // K and V of a stage: waited for and released apart (kv_barriers = 2), or together on the
  // K ring's barriers (1): then waiting for K covers V, and the stage is released after V.
  // Every wait_v(st) follows wait_k(st) of the same stage.
  __device__ __forceinline__ void wait_k(const KvState& st) const { smem.k_ring.consumer_wait(st); }
  __device__ __forceinline__ void wait_v(const KvState& st) const {
    if constexpr (kSplitKvBarriers) smem.v_ring.consumer_wait(st);
  }
  __device__ __forceinline__ void release_k(const KvState& st) const {
    if constexpr (kSplitKvBarriers) release(smem.k_ring, st);
  }
  __device__ __forceinline__ void release_v(const KvState& st) const {
    release(kSplitKvBarriers ? smem.v_ring : smem.k_ring, st);
  }

  __device__ __forceinline__ void mask(float (&s)[kSRegs], int n) const {
    if (blk.needs_mask(n, first_row))
      apply_mask(s, n * kBlockN + 2 * (lane % 4), first_row + 16 * warp + lane / 4, blk.seqlen_k, blk.causal_offset);
  }

  // Runs the whole loop over the key blocks of one work unit; o is zero on entry. It first waits
  // for the unit's Q stage (FT_SCHEDULER=1: consumer_unit has): Q landed (a unit without key blocks:
  // the stage handed over unloaded), after which this warpgroup may also stage its O there. `held`:
  // the previous unit's stage, released to the producer after this unit's first S GEMM (else in the
  // epilogue; with one Q stage, the previous unit's epilogue has).
  __device__ __forceinline__ void run(float (&o)[kORegs], OnlineSoftmax<kSRegs>& softmax, KvState& st,
                                      HeldQStage& held) const {
    if constexpr (!kDynamicScheduler) smem.q_ring.consumer_wait(q);
    if (blk.empty()) return;
    const int n_first = skip_masked_blocks(st) - 1;
    if (n_first < blk.n_block_min()) return;  // this warpgroup's rows see no key (of this split): O = 0, LSE = -inf
    if constexpr (kIntraWgOverlap)
      run_overlapped(o, softmax, st, n_first, held);
    else
      run_serial(o, softmax, st, n_first, held);
  }

  // The key blocks this warpgroup has nothing to compute for, consumed unread (their stages waited for
  // and released, as the other warpgroups need): causal, the CTA visits key blocks up to its last row's
  // diagonal (a cluster: the upper CTA's), but this warpgroup's rows may see fewer; and every block where
  // none of its rows exists (the padding of a query block, BlockInfo: e.g. the third warpgroup of the last
  // 192-row block at N 512 without a causal mask, the first one of the first block with it), so that the
  // other warpgroups get the tensor cores. Returns one past the last
  // key block left to compute (n_block_min() when none is). Ping-pong needs every warpgroup to take the
  // same turns: no skip.
  __device__ __forceinline__ int skip_masked_blocks(KvState& st) const {
    int n = blk.n_block_max;
    if constexpr (!kPingPong) {
      const int visible = blk.has_rows(first_row, kWgRows) ? blk.n_block_visible(first_row, kWgRows) : 0;
      const int stop = max(visible, blk.n_block_min());
      for (; n > stop; --n) {
        wait_k(st);
        release_k(st);
        wait_v(st);
        release_v(st);
        st.advance();
      }
    }
    return n;
  }

  // The previous unit's Q stage, once this warpgroup's O store has read it: the producer may
  // load the unit two on's Q there (a no-op once released, with one Q stage, and without a
  // persistent CTA).
  __device__ __forceinline__ void release_held(HeldQStage& held) const {
    held.release(smem.q_ring, warp == 0 && lane == 0);  // the thread that issued the store
  }

  // S = Q K^T for the key block in stage `st`, waited for; the K stage is released. The previous
  // unit's Q stage is released while the GEMM runs.
  __device__ __forceinline__ void qk_gemm(float (&s)[kSRegs], const KvState& st, HeldQStage& held) const {
    wait_k(st);
    begin_gemm_turn();
    ptx::wgmma_fence();
    issue_qk(s, st);
    ptx::wgmma_commit();
    end_gemm_turn();
    release_held(held);
    ptx::wgmma_wait<0>();
    ptx::fence_operands(s);
    release_k(st);
  }

  // O += P V for the key block in stage `st`, waited for; the V stage is released. P's first
  // kPvFirstSteps k-steps are issued, then `finish_p` exponentiates and converts the rest of the
  // tile (kPvSplit) while they run, then the rest is issued.
  template <class FinishP>
  __device__ __forceinline__ void pv_gemm(float (&o)[kORegs], uint32_t (&p)[kPvSteps][4], const KvState& st,
                                          FinishP&& finish_p) const {
    wait_v(st);
    begin_gemm_turn();
    ptx::wgmma_fence();
    issue_pv<0, kPvFirstSteps>(o, p, st);
    if constexpr (kPvFirstSteps < kPvSteps) {
      ptx::wgmma_commit();
      ptx::fence_operands(o);  // O is being accumulated: no code of finish_p may touch its registers
      finish_p();
      ptx::wgmma_fence();  // the second part's P registers were written after the first fence
      issue_pv<kPvFirstSteps, kPvSteps>(o, p, st);
    }
    ptx::wgmma_commit();
    end_gemm_turn();
    ptx::wgmma_wait<0>();
    ptx::fence_operands(o);
    if constexpr (!kPSmem) ptx::fence_operands(p);
    release_v(st);
  }
  __device__ __forceinline__ void pv_gemm(float (&o)[kORegs], uint32_t (&p)[kPvSteps][4], const KvState& st) const {
    pv_gemm(o, p, st, [] {});
  }

  // Per key block: S = Q K^T, wait, softmax, O += P V, wait. With kPvSplit, the first
  // kPvSplit keys of P go to the tensor cores while the rest are exponentiated.
  __device__ __forceinline__ void run_serial(float (&o)[kORegs], OnlineSoftmax<kSRegs>& softmax, KvState& st,
                                             int n_first, HeldQStage& held) const {
    for (int n = n_first; n >= blk.n_block_min(); --n) {
      float s[kSRegs];
      qk_gemm(s, st, held);

      mask(s, n);
      float o_scale[2];
      if (softmax.update_max(s, o_scale)) rescale_o(o, o_scale);
      uint32_t p[kPvSteps][4];
      if constexpr (kPSmem) {  // all of P to shared memory, then O += P V from there (pv_split is 0)
        softmax.exponentiate(s);
        store_p(s);
        pv_gemm(o, p, st);
        st.advance();
        continue;
      }
      softmax.template exponentiate<0, 8 * kPvFirstSteps>(s);  // 8 accumulator values per k-step
      convert_p<kSRegs, 0, kPvFirstSteps>(s, p);
      pv_gemm(o, p, st, [&] {
        softmax.template exponentiate<8 * kPvFirstSteps, kSRegs>(s);
        convert_p<kSRegs, kPvFirstSteps, kPvSteps>(s, p);
      });
      st.advance();
    }
  }

  // Software-pipelined: issue S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, wait only for
  // S_j, run the softmax of tile j while the P.V GEMM is in flight, then rescale O.
  __device__ __forceinline__ void run_overlapped(float (&o)[kORegs], OnlineSoftmax<kSRegs>& softmax, KvState& st,
                                                 int n_first, HeldQStage& held) const {
    uint32_t p[kPvSteps][4];
    int n = n_first;
    {  // first key block: no P.V in flight yet, O is zero (no rescale needed)
      float s[kSRegs];
      qk_gemm(s, st, held);
      mask(s, n);
      float o_scale[2];
      softmax.update_max(s, o_scale);
      softmax.exponentiate(s);
      if constexpr (kPSmem)
        store_p(s);
      else
        convert_p(s, p);
    }
    for (--n; n >= blk.n_block_min(); --n) {
      const KvState prev = st;
      st.advance();
      float s[kSRegs];
      wait_k(st);
      begin_gemm_turn();
      ptx::wgmma_fence();
      issue_qk(s, st);
      ptx::wgmma_commit();
      wait_v(prev);
      ptx::wgmma_fence();  // P and O registers were last written before the barrier wait
      issue_pv(o, p, prev);
      ptx::wgmma_commit();
      end_gemm_turn();
      ptx::wgmma_wait<1>();  // S_j has landed; P_{j-1} V_{j-1} may still run
      ptx::fence_operands(s);
      release_k(st);

      mask(s, n);
      float o_scale[2];
      const bool rescale = softmax.update_max(s, o_scale);
      // intra_wg_overlap 2: the block is exponentiated beside P_{j-1} V_{j-1}; 1: after its wait and V's release.
      // The wait sits in both arms of the rescale branch, not before it: in the block of the exponentials
      // ptxas schedules the wait (and release_v behind it) above them, and none ran beside the GEMM (SASS of
      // the d64 and d128 defaults; tests/kernels/test_sass_loops.py).
      constexpr int kEarlyExp = kExpOverlap ? kSRegs : 0;
      softmax.template exponentiate<0, kEarlyExp>(s);
      if (rescale) {
        ptx::wgmma_wait<0>();
        ptx::fence_operands(o);
        rescale_o(o, o_scale);
      } else {
        ptx::wgmma_wait<0>();
        ptx::fence_operands(o);
      }
      if constexpr (!kPSmem) ptx::fence_operands(p);
      release_v(prev);
      softmax.template exponentiate<kEarlyExp, kSRegs>(s);
      if constexpr (kPSmem)
        store_p(s);  // P_{j-1} V_{j-1} completed above: its tile may be overwritten
      else
        convert_p(s, p);
    }
    // last P.V
    pv_gemm(o, p, st);
    st.advance();
  }
};

}  // namespace ft_sm90
