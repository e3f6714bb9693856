// Online softmax in fp32 with lazy rescaling.
//
// Each thread holds kRows = 2 * kMTiles query rows (lane/4 and lane/4 + 8 of each m-tile).
// Scores stay raw; scale * log2(e) is folded into one FFMA before exp2:
//   p = exp2(s * scale_log2 - m), m = running max of s * scale_log2.
// Lazy rescale: the running max m of a row only moves when a tile's max exceeds it by more
// than kRescaleSlack (log2 units), so p <= 2^slack <= 256 stays far inside fp16/bf16 range
// while O and the row sum accumulate in fp32. The decision is warp-uniform (__any_sync):
// when any row of the warp must move, every row of the warp takes its exact new max.
// A row that has seen no key keeps m = -inf and l = 0; its exponent base is taken as 0 so
// that exp2(-inf - 0) gives 0, never NaN; finalize() then yields O = 0 and LSE = -inf.
#pragma once

#include "sm80/config.cuh"
#include "sm80/ptx.cuh"

namespace ft_sm80 {

struct OnlineSoftmax {
  static constexpr int kRows = 2 * kMTiles;
  float m[kRows];  // running max of scores times scale_log2 (-inf before any visible key)
  float l[kRows];  // this thread's partial row sum of p (quad-reduced in finalize)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
    }
  }

  // Exponent base of a row: its max, or 0 while the row has seen no key.
  __device__ __forceinline__ float base(int r) const { return m[r] == -INFINITY ? 0.f : m[r]; }

  // Take the tile's row maxima; move the running max (and rescale O and l) when needed.
  __device__ __forceinline__ void update_max(const float (&s)[kMTiles][kNTiles][4], float (&o)[kMTiles][kDTiles][4],
                                             float scale_log2) {
    float tile_max[kRows];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float x = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) x = fmaxf(x, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        tile_max[2 * mt + h] = x * scale_log2;
      }
    bool need = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) need |= tile_max[r] - m[r] > kRescaleSlack;  // -inf - -inf = NaN: false
    if (!__any_sync(0xffffffffu, need)) return;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 2 * mt + h;
        const float m_old = m[r];
        m[r] = fmaxf(m_old, tile_max[r]);
        const float factor = ptx::exp2_approx(m_old - base(r));  // 0 when m_old = -inf; 1 when unchanged
        l[r] *= factor;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt][2 * h] *= factor;
          o[mt][dt][2 * h + 1] *= factor;
        }
      }
  }

  // p = exp2(s * scale_log2 - base) in place for n-tiles [kBegin, kEnd); adds to l.
  template <int kBegin, int kEnd>
  __device__ __forceinline__ void exponentiate(float (&s)[kMTiles][kNTiles][4], float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 2 * mt + h;
        const float neg_base = -base(r);
#pragma unroll
        for (int nt = kBegin; nt < kEnd; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = ptx::exp2_approx(fmaf(s[mt][nt][2 * h + e], scale_log2, neg_base));
            s[mt][nt][2 * h + e] = p;
            l[r] += p;
          }
      }
  }

  // Quad-reduce the row sums; return 1/l (0 for a row without keys) and the natural-log LSE.
  __device__ __forceinline__ void finalize(float (&inv_l)[kRows], float (&lse)[kRows]) {
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum = l[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const bool empty = !(sum > 0.f);
      inv_l[r] = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? -INFINITY : (m[r] + __log2f(sum)) * kLn2;
    }
  }
};

}  // namespace ft_sm80
