// One K/V tile of the main loop: S = Q K^T, mask, online softmax, O += P V.
#pragma once

#include "sm80/config.cuh"
#include "sm80/mask.cuh"
#include "sm80/pipeline.cuh"
#include "sm80/softmax.cuh"
#include "sm80/warp_mma.cuh"

namespace ft_sm80 {

struct WarpCtx {
  unsigned q_tile;        // smem address of the swizzled Q tile
  FragAddressing frags;   // this lane's ldmatrix offsets
  TileCopyLane copy;      // this thread's share of a tile copy
  int row0;               // absolute query row of this warp's first row
  int seqlen_q;
  int seqlen_k;
  int lane;
  float scale_log2;       // softmax_scale * log2(e)
};

// With kPvSplit > 0, P.V runs in two chunks of keys [0, kPvSplit) and [kPvSplit, kBlockN):
// the exponentials of the second chunk can overlap the first chunk's MMAs.
template <bool kMasked>
__device__ __forceinline__ void attend_tile(int t, KvRing& ring, const WarpCtx& ctx, const QFrags& qf,
                                            float (&o)[kMTiles][kDTiles][4], OnlineSoftmax& softmax) {
  KvRing::wait();  // K(t) landed; every warp is done with V(t-1)
  ring.issue_v(t + kKvStages - 1, ctx.copy);

  float s[kMTiles][kNTiles][4];
  warp_qk(s, qf, ctx.q_tile, ring.k_tile(t), ctx.frags);

  KvRing::wait();  // V(t) landed; every warp is done with K(t)
  ring.issue_k(t + kKvStages, ctx.copy);

  if constexpr (kMasked) apply_mask(s, ctx.row0, ring.key0(t), ctx.seqlen_q, ctx.seqlen_k, ctx.lane);
  softmax.update_max(s, o, ctx.scale_log2);

  const unsigned v_tile = ring.v_tile(t);
  if constexpr (kPvSplit > 0) {
    softmax.exponentiate<0, kPvSplit / 8>(s, ctx.scale_log2);
    warp_pv<0, kPvSplit / 16>(o, s, v_tile, ctx.frags);
    softmax.exponentiate<kPvSplit / 8, kNTiles>(s, ctx.scale_log2);
    warp_pv<kPvSplit / 16, kPvSteps>(o, s, v_tile, ctx.frags);
  } else {
    softmax.exponentiate<0, kNTiles>(s, ctx.scale_log2);
    warp_pv<0, kPvSteps>(o, s, v_tile, ctx.frags);
  }
}

}  // namespace ft_sm80
