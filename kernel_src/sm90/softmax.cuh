// Online softmax over the rows a consumer thread owns in the wgmma accumulator layout
// (ptx::acc_row_half, sm90/ptx/wgmma.cuh: each thread owns two rows h = 0, 1, each spread over
// the 4 threads of a quad).
//
// The row max is kept in scaled log2 units (max * softmax_scale * log2 e) so that one FFMA
// feeds exp2 (MUFU.EX2, or for kPolyExp of every 8 values a polynomial on the FMA pipe; with
// kExp2Packed the FFMA's results are packed to fp16 pairs and exponentiated packed, which gives
// the P fragment itself).
// Lazy rescale: a new max is adopted only when it exceeds the kept one by more than
// kRescaleSlack (P <= 2^slack meanwhile), and the O rescale is skipped when no row of the
// warp needs it (warp-uniform branch). Masking: mask.cuh.
#pragma once

#include <cmath>

#include "sm90/config.cuh"
#include "sm90/ptx/warpgroup.cuh"
#include "sm90/ptx/wgmma.cuh"

namespace ft_sm90 {

// The P fragment (A operand of O += P V) of k-step kk equals the accumulator values
// 8kk .. 8kk+7 packed in pairs: identical layouts for 16-bit types. k-steps [kBegin, kEnd), from
// what OnlineSoftmax::exponentiate left in s: fp32 values to pack, or (kExp2Packed) the packed
// pairs' bits in every even value, copied by a real move: else the compiler lets the ex2 write the P
// registers themselves, before the overlapped loop's wait, and ptxas serializes the wgmmas (C7513).
template <int kN, int kBegin = 0, int kEnd = kN / 8>
__device__ __forceinline__ void convert_p(const float (&s)[kN], uint32_t (&p)[kN / 8][4]) {
#pragma unroll
  for (int kk = kBegin; kk < kEnd; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      p[kk][r] = kExp2Packed ? ptx::mov_b32(__float_as_uint(s[8 * kk + 2 * r]))
                             : ptx::pack2<kIsBf16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

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
  // multiplied by o_scale; then row_sum has been rescaled already.
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

  // P is made in two steps, so that the overlapped loop can run the first while O += P V still
  // reads the P registers: exponentiate (all the arithmetic, and the row sum), then convert_p
  // (the write into P). produce_p does both where nothing reads P.
  //
  // exponentiate: k-steps [kBegin, kEnd) of s (raw scores, masked = -inf; 8 accumulator values =
  // 16 keys per k-step) -> 2^(s * scale_log2 - row_max), added to row_sum. fp32: in place. Packed
  // (kExp2Packed): x rounded to an fp16 pair per P register, exponentiated packed; the pair's bits
  // wait in the first of its two values of s for convert_p. The row sum: per row half, the pairs
  // added as a balanced tree in fp16 (partial sums of block_n / 8 values <= 2^slack each) and
  // converted to fp32 once per call.
  template <int kBegin = 0, int kEnd = kN / 8>
  __device__ __forceinline__ void exponentiate(float (&s)[kN]) {
    float neg_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) neg_max[h] = row_max[h] == -INFINITY ? 0.f : -row_max[h];
    if constexpr (kBegin == kEnd) {
      return;  // the second part of an unsplit tile
    } else if constexpr (kExp2Packed) {
      constexpr int kPairs = 2 * (kEnd - kBegin);  // per row half
      uint32_t part[2][kPairs];
#pragma unroll
      for (int kk = kBegin; kk < kEnd; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = 8 * kk + 2 * r, h = ptx::acc_row_half(i);
          const float lo = fmaf(s[i], scale_log2, neg_max[h]), hi = fmaf(s[i + 1], scale_log2, neg_max[h]);
          const uint32_t e = ptx::exp2_f16x2(ptx::pack2<false>(lo, hi));
          s[i] = __uint_as_float(e);
          part[h][2 * (kk - kBegin) + r / 2] = e;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int w = 1; w < kPairs; w *= 2)  // neighbours first, as tests/kernels/softmax_rounding_model.py
#pragma unroll
          for (int j = 0; j + w < kPairs; j += 2 * w) part[h][j] = ptx::hadd2(part[h][j], part[h][j + w]);
        float lo, hi;
        ptx::unpack_f16x2(part[h][0], lo, hi);
        row_sum[h] += lo;
        row_sum[h] += hi;
      }
    } else {
#pragma unroll
      for (int i = 8 * kBegin; i < 8 * kEnd; ++i) {
        const float x = fmaf(s[i], scale_log2, neg_max[ptx::acc_row_half(i)]);
        s[i] = i % 8 < kPolyExp ? ptx::exp2_poly(x) : ptx::exp2_approx(x);  // resolved at compile time
        row_sum[ptx::acc_row_half(i)] += s[i];
      }
    }
  }

  // P of k-steps [kBegin, kEnd), where no GEMM reads p.
  template <int kBegin = 0, int kEnd = kN / 8>
  __device__ __forceinline__ void produce_p(float (&s)[kN], uint32_t (&p)[kN / 8][4]) {
    exponentiate<kBegin, kEnd>(s);
    convert_p<kN, kBegin, kEnd>(s, p);
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

}  // namespace ft_sm90
