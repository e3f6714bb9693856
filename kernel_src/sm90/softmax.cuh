// Online softmax over the rows a consumer thread owns in the wgmma accumulator layout
// (ptx::acc_row_half, sm90/ptx/wgmma.cuh: each thread owns two rows h = 0, 1, each spread over
// the 4 threads of a quad).
//
// The row max is kept in scaled log2 units (max * softmax_scale * log2 e) so that one FFMA
// feeds exp2 (MUFU.EX2, or for kPolyExp of every 8 values a polynomial on the FMA pipe).
// Lazy rescale: a new max is adopted only when it exceeds the kept one by more than
// kRescaleSlack (P <= 2^slack meanwhile), and the O rescale is skipped when no row of the
// warp needs it (warp-uniform branch). Masking: mask.cuh.
#pragma once

#include <cmath>

#include "sm90/config.cuh"
#include "sm90/ptx/warpgroup.cuh"
#include "sm90/ptx/wgmma.cuh"

namespace ft_sm90 {

template <int kN>  // accumulator values per thread = columns / 2
struct OnlineSoftmax {
  float row_max[2];  // scaled log2 units; -inf while the row has seen no key
  float row_sum[2];  // this thread's share of the row sum, relative to row_max
  float scale_log2;

  __device__ __forceinline__ explicit OnlineSoftmax(float softmax_scale) : scale_log2(softmax_scale * float(M_LOG2E)) {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // Fold the tile's row maxima into row_max. Returns true (warp-uniform) when O must be
  // multiplied by o_scale; then row_sum has been rescaled already. One dependent FMNMX chain
  // per row on purpose: 4 chains and a tree (for the max and the sum) ran at 0.86-0.99 of this
  // at d64 on an H100, with the same instruction mix (BENCHMARKS.md, 2026-12-07, session 41).
  __device__ __forceinline__ bool update_max(const float (&s)[kN], float (&o_scale)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kN; ++i) mx[ptx::acc_row_half(i)] = fmaxf(mx[ptx::acc_row_half(i)], s[i]);
    bool need = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
      mx[h] *= scale_log2;
      need |= mx[h] > row_max[h] + kRescaleSlack;  // false while both are -inf
    }
    if (!__any_sync(0xffffffff, need)) return false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m = fmaxf(row_max[h], mx[h]);
      o_scale[h] = row_max[h] == -INFINITY ? 0.f : ptx::exp2_approx(row_max[h] - m);
      row_max[h] = m;
      row_sum[h] *= o_scale[h];
    }
    return true;
  }

  // s (raw scores, masked = -inf) -> p = 2^(s * scale_log2 - row_max), added to row_sum;
  // accumulator values [kBegin, kEnd) only (8 values = 16 keys of the tile).
  template <int kBegin = 0, int kEnd = kN>
  __device__ __forceinline__ void exponentiate(float (&s)[kN]) {
    float neg_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) neg_max[h] = row_max[h] == -INFINITY ? 0.f : -row_max[h];
#pragma unroll
    for (int i = kBegin; i < kEnd; ++i) {
      const float x = fmaf(s[i], scale_log2, neg_max[ptx::acc_row_half(i)]);
      s[i] = i % 8 < kPolyExp ? ptx::exp2_poly(x) : ptx::exp2_approx(x);  // resolved at compile time
      row_sum[ptx::acc_row_half(i)] += s[i];
    }
  }

  // O /= row sum; returns the natural-log LSE of both rows (-inf, and O = 0, for empty rows).
  template <int kO>
  __device__ __forceinline__ void finalize(float (&o)[kO], float (&lse)[2]) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[h];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      const bool empty = !(sum > 0.f);
      inv[h] = empty ? 0.f : 1.f / sum;
      lse[h] = empty ? -INFINITY : (row_max[h] + __log2f(sum)) * float(M_LN2);
    }
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] *= inv[ptx::acc_row_half(i)];
  }
};

template <int kO>
__device__ __forceinline__ void rescale_o(float (&o)[kO], const float (&o_scale)[2]) {
#pragma unroll
  for (int i = 0; i < kO; ++i) o[i] *= o_scale[ptx::acc_row_half(i)];
}

// The P fragment (A operand of O += P V) of k-step kk equals the accumulator values
// 8kk .. 8kk+7 packed in pairs: identical layouts for 16-bit types. k-steps [kBegin, kEnd).
template <int kN, int kBegin = 0, int kEnd = kN / 8>
__device__ __forceinline__ void convert_p(const float (&s)[kN], uint32_t (&p)[kN / 8][4]) {
#pragma unroll
  for (int kk = kBegin; kk < kEnd; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[kk][r] = ptx::pack2<kIsBf16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

}  // namespace ft_sm90
