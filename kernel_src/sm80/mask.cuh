// Key-tail and causal masks on an S tile, and the split of the key range into masked
// and unmasked blocks.
//
// Causal masking is bottom-right aligned: query row i sees key j iff
// j <= i + (seqlen_k - seqlen_q).
#pragma once

#include "sm80/config.cuh"

namespace ft_sm80 {

// Key blocks a CTA visits, walked from the last (tile 0) to block 0.
struct KeyRange {
  int n_blocks;    // key blocks [0, n_blocks) hold at least one key some row here sees
  int n_unmasked;  // key blocks [0, n_unmasked) are fully visible to every row here

  __device__ __forceinline__ int masked_tiles() const { return n_blocks - n_unmasked; }
};

__device__ __forceinline__ KeyRange key_range(int m0, int seqlen_q, int seqlen_k) {
  KeyRange r;
  const int causal_offset = seqlen_k - seqlen_q;
  const int m_end = min(seqlen_q, m0 + kBlockM);
  const int key_end = kIsCausal ? min(seqlen_k, m_end + causal_offset) : seqlen_k;
  r.n_blocks = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  int n_unmasked = seqlen_k / kBlockN;  // blocks without a key tail
  if constexpr (kIsCausal) {
    const int first_row_keys = m0 + causal_offset + 1;  // keys seen by the CTA's first row
    n_unmasked = min(n_unmasked, first_row_keys > 0 ? first_row_keys / kBlockN : 0);
  }
  r.n_unmasked = min(n_unmasked, r.n_blocks);
  return r;
}

// Set S to -inf where the key is past seqlen_k or (causal) after the row's diagonal.
// row0: absolute query row of this warp's first row; key0: absolute key of column 0.
// Limits are taken relative to this thread's first column, so each element is one
// compare of a row limit against an immediate.
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], int row0, int key0, int seqlen_q,
                                           int seqlen_k, int lane) {
  const int col0 = key0 + 2 * (lane & 3);
  const int tail_limit = seqlen_k - col0;                                    // columns < this exist
  const int diag_limit = row0 + (lane >> 2) + seqlen_k - seqlen_q + 1 - col0;  // row's visible columns, row 0
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int limit = kIsCausal ? min(tail_limit, diag_limit + mt * 16 + 8 * h) : tail_limit;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (nt * 8 + e >= limit) s[mt][nt][2 * h + e] = -INFINITY;
    }
}

}  // namespace ft_sm80
