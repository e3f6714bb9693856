// Which query rows a CTA (and each of its consumer warpgroups) owns in one work unit, and
// which key blocks it must visit under the tail and (bottom-right aligned) causal masks.
// Host-callable too: tests/kernels/sm90_schedule_check.cu checks it against brute force.
#pragma once

#include "sm90/config.cuh"

namespace ft_sm90 {

struct BlockInfo {
  int m_block, head, batch, kv_head;
  int seqlen_q, seqlen_k;
  int causal_offset;  // seqlen_k - seqlen_q: row i sees key j iff j <= i + causal_offset
  int n_block_max;    // key blocks [n_block_min(), n_block_max) are visited, from the last one down
  int n_block_begin = 0;  // kv_splits > 1 or tail_splits > 1: the first key block of this unit's split

  // split: the unit's key range among `splits` (TileScheduler::split and splits: kKvSplits, or with the tail
  // split 1 or the last wave's count, at run time); split s of a tile whose rows see key blocks [0, n) takes
  // [n s / S, n (s + 1) / S): contiguous, disjoint, covering, and empty when n < S leaves it none (its partial
  // is O = 0, LSE = -inf).
  __host__ __device__ __forceinline__ BlockInfo(int m_block_, int head_, int batch_, int seqlen_q_, int seqlen_k_,
                                                int heads_q, int heads_kv, int split = 0, int splits = kKvSplits)
      : m_block(m_block_), head(head_), batch(batch_), kv_head(head_ / (heads_q / heads_kv)), seqlen_q(seqlen_q_),
        seqlen_k(seqlen_k_), causal_offset(seqlen_k_ - seqlen_q_) {
    n_block_max = (seqlen_k + kBlockN - 1) / kBlockN;
    if constexpr (kIsCausal) {
      // one past the last valid row of the cluster's blocks: the CTAs of a cluster share K/V
      // tiles, so they visit the same key blocks (the lower block masks the extra ones)
      const int group_end = (m_block / kClusterCtas + 1) * kClusterCtas * kBlockM;
      const int row_end = min(group_end, seqlen_q);
      const int keys = row_end + causal_offset;                    // keys the last valid row sees
      n_block_max = keys <= 0 ? 0 : min(n_block_max, (keys + kBlockN - 1) / kBlockN);
    }
    if constexpr (kSplitKeys) {
      const int n = n_block_max, s = kKvSplits > 1 ? kKvSplits : splits;  // split-KV: a constant
      n_block_begin = n * split / s;
      n_block_max = n * (split + 1) / s;
    }
  }

  __host__ __device__ __forceinline__ int n_block_min() const { return kSplitKeys ? n_block_begin : 0; }
  // Does this unit visit no key block (the producer loads only Q's stage handover, the consumers write O = 0)?
  __host__ __device__ __forceinline__ bool empty() const { return n_block_max <= n_block_min(); }

  __host__ __device__ __forceinline__ int m0() const { return m_block * kBlockM; }

  // Key blocks [0, result) hold a key that some of the rows first_row .. first_row + rows - 1
  // see; the blocks from there to n_block_max are fully masked for those rows (result <= n_block_max;
  // below n_block_min() when this split's keys are all masked for them).
  __host__ __device__ __forceinline__ int n_block_visible(int first_row, int rows) const {
    if constexpr (!kIsCausal) return n_block_max;
    const int keys = first_row + rows + causal_offset;  // keys the last of the rows sees
    return keys <= 0 ? 0 : min(n_block_max, (keys + kBlockN - 1) / kBlockN);
  }

  // Does key block n need masking for rows starting at first_row (tail or diagonal)?
  __host__ __device__ __forceinline__ bool needs_mask(int n, int first_row) const {
    const int key_end = (n + 1) * kBlockN;
    bool mask = key_end > seqlen_k;
    if constexpr (kIsCausal) mask |= key_end - 1 > first_row + causal_offset;
    return mask;
  }
};

}  // namespace ft_sm90
