// Warp-level tile products with ldmatrix + mma.sync m16n8k16.
//
// Each warp owns kWarpRows = kMTiles * 16 query rows. Accumulator fragments follow the
// m16n8 layout: thread `lane` holds rows lane/4 (elements 0, 1) and lane/4 + 8 (2, 3) at
// columns 2 * (lane % 4) + {0, 1} of each n8 tile.
#pragma once

#include "sm80/config.cuh"
#include "sm80/ptx.cuh"
#include "sm80/smem_layout.cuh"

namespace ft_sm80 {

constexpr int kQkSteps = kHeadDim / 16;  // k16 steps of S = Q K^T
constexpr int kPvSteps = kBlockN / 16;   // k16 steps of O += P V

using QFrags = unsigned[kMTiles][kQkSteps][4];

// Per-lane ldmatrix addressing of the three operands, computed once per CTA.
struct FragAddressing {
  // Q (A operand): matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi),
  // (rows 8-15, k hi) -> a0..a3 of one m16k16 fragment.
  FragOffsets q;
  // K (B operand of Q K^T): matrices (keys 0-7, k lo), (keys 0-7, k hi), (keys 8-15, k lo),
  // (keys 8-15, k hi) -> b0, b1 of n-tile 2np, then of 2np + 1.
  FragOffsets k;
  // V (B operand of P V, transposed): matrices (keys 0-7, d lo), (keys 8-15, d lo),
  // (keys 0-7, d hi), (keys 8-15, d hi) -> b0, b1 of d-tile 2dp, then of 2dp + 1.
  FragOffsets v;

  __device__ __forceinline__ FragAddressing(int warp_row0, int lane)
      : q(warp_row0 + (lane & 15), lane >> 4),
        k((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1),
        v((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4) {}
};

// Q fragments of this warp's rows, all k-steps (for FT_Q_IN_REGS).
__device__ __forceinline__ void load_q_frags(QFrags& qf, unsigned q_tile, const FragAddressing& fa) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) ptx::ldmatrix_x4(qf[mt][kk], fa.q.at(q_tile, kk, mt * 16));
}

// S = Q K^T for this warp's rows and all kBlockN keys of the K tile. With kQInRegs the
// Q fragments come from `qf`, otherwise they are re-read from the Q tile.
__device__ __forceinline__ void warp_qk(float (&s)[kMTiles][kNTiles][4], const QFrags& qf, unsigned q_tile,
                                        unsigned k_tile, const FragAddressing& fa) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;

#pragma unroll
  for (int kk = 0; kk < kQkSteps; ++kk) {
    unsigned a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kQInRegs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[mt][i] = qf[mt][kk][i];
      } else {
        ptx::ldmatrix_x4(a[mt], fa.q.at(q_tile, kk, mt * 16));
      }
    }
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      unsigned b[4];
      ptx::ldmatrix_x4(b, fa.k.at(k_tile, kk, np * 16));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<kIsBf16>(s[mt][2 * np], a[mt], b[0], b[1]);
        ptx::mma_m16n8k16<kIsBf16>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// O += P V for the keys of k-steps [kBegin, kEnd) (16 keys each). P is the fp32 S
// fragment after exponentiation; it is packed to 16 bits here as the A operand.
template <int kBegin, int kEnd>
__device__ __forceinline__ void warp_pv(float (&o)[kMTiles][kDTiles][4], const float (&p)[kMTiles][kNTiles][4],
                                        unsigned v_tile, const FragAddressing& fa) {
#pragma unroll
  for (int kk = kBegin; kk < kEnd; ++kk) {
    unsigned a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      a[mt][0] = ptx::pack2<kIsBf16>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = ptx::pack2<kIsBf16>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = ptx::pack2<kIsBf16>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = ptx::pack2<kIsBf16>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      unsigned b[4];
      ptx::ldmatrix_x4_trans(b, fa.v.at(v_tile, dp, kk * 16));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<kIsBf16>(o[mt][2 * dp], a[mt], b[0], b[1]);
        ptx::mma_m16n8k16<kIsBf16>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

}  // namespace ft_sm80
