// Key-tail and causal masks on an S tile in the wgmma accumulator layout.
//
// Causal masking is bottom-right aligned: query row i sees key j iff
// j <= i + (seqlen_k - seqlen_q). Which key blocks need the mask at all is block_info.cuh's
// BlockInfo::needs_mask.
#pragma once

#include <cmath>

#include "sm90/config.cuh"
#include "sm90/ptx/wgmma.cuh"

namespace ft_sm90 {

// Scores outside the key range or above the (bottom-right aligned) causal diagonal -> -inf.
// col0: first key of the tile plus 2 * (lane % 4); row0: query row of this thread's h = 0.
template <int kN>
__device__ __forceinline__ void apply_mask(float (&s)[kN], int col0, int row0, int seqlen_k, int causal_offset) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int col = col0 + (i >> 2) * 8 + (i & 1);
    int limit = seqlen_k;
    if constexpr (kIsCausal) limit = min(limit, row0 + 8 * ptx::acc_row_half(i) + causal_offset + 1);
    if (col >= limit) s[i] = -INFINITY;
  }
}

}  // namespace ft_sm90
