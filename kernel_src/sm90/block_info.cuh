// Which query rows a CTA (and each of its consumer warpgroups) owns in one work unit, and
// which key blocks it must visit under the tail and (bottom-right aligned) causal masks.
// Host-callable too: tests/kernels/sm90_schedule_check.cu checks it against brute force.
//
// Query block m holds rows [m kBlockM - row_shift, (m + 1) kBlockM - row_shift). Where seqlen_q is not a
// multiple of a block group (kBlockM kClusterCtas rows), the padding rows go where they cost least:
// non-causal (row_shift = 0), past seqlen_q in the last block, as every block sees every key; causal, as
// much of it as whole multiples of kShiftRows (row_shift) before row 0 in the first block, the block that
// sees the fewest keys, and the rest past seqlen_q in the last block. kShiftRows, a multiple of both a
// warpgroup's rows and kBlockN, keeps each row's place within its key block, so each CTA's warpgroups see
// the same counts of key blocks as without the shift, and a warpgroup's rows are either all before row 0
// or none. H200 (BENCHMARKS.md, session 20): d64 causal N 1024 and 4096 (192-row blocks, 128-key blocks,
// 128 padding rows: the longest block ran on one warpgroup of three) 1.03-1.04x and 1.015x; a 64-row shift at
// d128 (N 1200) cost 2%, where it paired warpgroups that see unequal counts of key blocks. Rows outside
// [0, seqlen_q) are loaded as zeros by TMA (a negative row coordinate included), computed by no warpgroup
// that has only such rows (Consumer::skip_masked_blocks) and never stored: no O store starts at a
// negative row (an H200 raises an illegal instruction for a TMA store there).
#pragma once

#include <numeric>

#include "sm90/config.cuh"

namespace ft_sm90 {

// The step of a causal row shift: the least common multiple of a warpgroup's rows and kBlockN.
constexpr int kShiftRows = std::lcm(kWgRows, kBlockN);
static_assert(kShiftRows % kWgRows == 0 && kShiftRows % kBlockN == 0, "the row shift's step");
// Can a block start before row 0? Only causal, and only where a step fits in a block group's padding (at most
// kBlockM kClusterCtas - 1 rows): elsewhere (d128's 128-row blocks of 128 keys, d256) the code is as without it.
constexpr bool kShiftsRows = kIsCausal && kShiftRows < kBlockM * kClusterCtas;

struct BlockInfo {
  int m_block, head, batch, kv_head;
  int seqlen_q, seqlen_k;
  int causal_offset;  // seqlen_k - seqlen_q: row i sees key j iff j <= i + causal_offset
  int n_block_max;    // key blocks [n_block_min(), n_block_max) are visited, from the last one down
  int n_block_begin = 0;  // kv_splits > 1 or tail_splits > 1: the first key block of this unit's split
  int row_shift = 0;      // causal: padding rows before row 0, a multiple of kShiftRows (see the top)

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
      constexpr int kGroupRows = kBlockM * kClusterCtas;
      if constexpr (kShiftsRows)
        row_shift = (kGroupRows - seqlen_q % kGroupRows) % kGroupRows / kShiftRows * kShiftRows;
      // one past the last valid row of the cluster's blocks: the CTAs of a cluster share K/V
      // tiles, so they visit the same key blocks (the lower block masks the extra ones)
      const int group_end = (m_block / kClusterCtas + 1) * kGroupRows - row_shift;
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

  // The first query row of the CTA's block (negative in a causal first block with padding).
  __host__ __device__ __forceinline__ int m0() const { return m_block * kBlockM - row_shift; }
  // Does any of the rows first_row .. first_row + rows - 1 exist (lie in [0, seqlen_q))? Only a block of a
  // kShiftsRows kernel starts before row 0.
  __host__ __device__ __forceinline__ bool has_rows(int first_row, int rows) const {
    return first_row < seqlen_q && (!kShiftsRows || first_row + rows > 0);
  }
  __host__ __device__ __forceinline__ bool has_row(int row) const { return has_rows(row, 1); }

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
