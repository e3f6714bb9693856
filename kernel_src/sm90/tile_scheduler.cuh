// Which work units (a query-block group of one head of one batch) a CTA computes, in order.
//
// A unit is kClusterCtas consecutive query blocks of one (batch, head): CTA rank r of a
// cluster takes block kClusterCtas * group + r, so both CTAs of a cluster need the same K/V
// tiles. Units are numbered with the query-block group fastest, longest (last) group first:
//   unit = (batch * heads + head) * m_groups + (m_groups - 1 - group)
// so that CTAs running at the same time share one head's K/V in L2, and the long causal
// blocks of a head start before its short ones.
//   FT_PERSISTENT=0: one unit per cluster, from blockIdx (grid: m_groups * kClusterCtas, heads, batch).
//   FT_PERSISTENT=1: the G = gridDim.x / kClusterCtas clusters take the units in rounds of G, round r
//   being units [r G, (r + 1) G), in a snake: cluster c takes unit r G + c in even rounds and
//   r G + G - 1 - c in odd ones. Each round still covers consecutive units (CTAs running together
//   share K/V in L2), and a cluster that took a long causal unit in one round takes a short one in
//   the next: with plain round-robin, G a multiple of m_groups (132 SMs, 4 query blocks per head at
//   N = 512) gave every cluster units of one length only, and the longest set the run time (H200,
//   fp16 d128 causal B 32 N 512: persistent 243 TFLOPS against 260 for one CTA per block).
//   FT_SCHEDULER=1 (persistent, one CTA per cluster): CTA c takes unit c first; after that its producer
//   thread takes each next unit from a global counter, G + atomicAdd(&counter[0], 1), when it has issued
//   the loads of the unit before, so the CTA that runs out of work first takes the next (longest
//   remaining) unit: causal units of unequal length balance to within one unit (the snake leaves up
//   to 16% at long causal GQA: 132 CTAs, 28 heads of 128 query blocks). The producer hands each unit
//   to the consumers in shared memory next to its Q stage (mainloop.cuh), -1 when there is none left.
//   The counter is two words, [0] units taken, [1] CTAs done; the last CTA to finish zeroes both, so
//   a zeroed counter serves every later launch on one stream (tuner/gpu/_launch.py keeps one per stream).
//   FT_KV_SPLITS=S > 1 (split-KV): every query-block group (a "tile", numbered as the units above) is S
//   units, one per contiguous range of its key blocks (BlockInfo), the split index fastest:
//   unit = tile * S + split, so the S units of a tile run at the same time (its Q, and its head's K/V,
//   come from L2).
//   Each orders, persists and fetches exactly as above, over S times the units (the grid: space file).
//   FT_L2_SWIZZLE_MB=S > 0 (FA3's L2 swizzle): the (batch, head) pairs, batch-major, form sections of
//   h = max(1, S MB / one KV head's K and V) * (heads_q / heads_kv) pairs (GQA heads share their KV head), the
//   last section fewer; within a section the query-block group is the slower index and the head the faster:
//   tile = section * m_groups * h + (m_groups - 1 - group) * h_here + (pair - section * h), h_here the pairs of
//   this section. CTAs running together then take the same query block of h heads (whose K and V fit S MB of
//   L2) instead of every block of one head, and causal units of one length run together. S = 0, or a section
//   of one pair (a KV head of more than S MB without GQA), is the order above.
//   FT_TAIL_SPLITS=S > 1 (tail split, persistent): of T tiles on G clusters the last r = T mod G form a partly
//   filled last wave; each of them is s = min(S, G / r) units (none when r = 0 or s = 1), over s contiguous key
//   ranges as with split-KV, numbered after the T - r whole tiles, the split index fastest:
//   unit = T - r + (tile - (T - r)) * s + split. The dynamic counter (or the snake's last round, which holds
//   exactly these r * s <= G units) hands them out last and together, so the last wave takes 1/s of a tile's
//   time on r * s clusters instead of a whole tile's on r. s is computed here, at run time, from the grid.
#pragma once

#include "sm90/config.cuh"

namespace ft_sm90 {

// atomicAdd on the device; on the host (tests/kernels/sm90_schedule_check.cu runs one CTA at a time) a plain add.
__host__ __device__ __forceinline__ unsigned counter_add(unsigned* word, unsigned value) {
#ifdef __CUDA_ARCH__
  return atomicAdd(word, value);
#else
  const unsigned old = *word;
  *word = old + value;
  return old;
#endif
}

// Host-callable too: tests/kernels/sm90_schedule_check.cu checks it exhaustively on the CPU.
struct TileScheduler {
  int m_groups, heads, pairs, units;  // pairs: batch * heads
  int section = 1;  // (batch, head) pairs per L2 section (FT_L2_SWIZZLE_MB; 1: one head after another)
  int unit, stride;
  int cluster, round = 0;
  int whole_tiles = 0, tail_splits = 1;  // FT_TAIL_SPLITS > 1: tiles [0, whole_tiles) are one unit, the rest s each

  // block = (blockIdx.x, blockIdx.y, blockIdx.z), grid_x = gridDim.x
  __host__ __device__ __forceinline__ TileScheduler(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                                                    int block_x, int block_y, int block_z, int grid_x)
      : m_groups((seqlen_q + kBlockM * kClusterCtas - 1) / (kBlockM * kClusterCtas)), heads(heads_q),
        pairs(heads_q * batch) {
    units = m_groups * pairs * kKvSplits;
    if constexpr (kL2SwizzleMb > 0) {
      const long long kv_head_bytes = 2LL * seqlen_k * kHeadDim * 2;  // K and V of one KV head, 2-byte elements
      const long long fit = (static_cast<long long>(kL2SwizzleMb) << 20) / (kv_head_bytes > 0 ? kv_head_bytes : 1);
      section = static_cast<int>(fit < 1 ? 1 : fit > pairs ? pairs : fit) * (heads_q / heads_kv);
    }
    cluster = block_x / kClusterCtas;
    if constexpr (kPersistent) {
      unit = cluster;
      stride = grid_x / kClusterCtas;
      if constexpr (kTailSplits > 1) {
        const int tail = units % stride;  // tiles of the last wave (units: the tiles here, kv_splits = 1)
        tail_splits = tail == 0 ? 1 : min(kTailSplits, stride / tail);
        whole_tiles = units - tail;
        units = whole_tiles + tail * tail_splits;
      }
    } else {
      unit = (block_z * heads + block_y) * m_groups * kKvSplits + cluster;
      stride = units;  // one unit
    }
  }

  __host__ __device__ __forceinline__ bool valid() const {
    if constexpr (kDynamicScheduler) return unit >= 0 && unit < units;  // -1: the producer's "no more units"
    return unit < units;
  }
  __host__ __device__ __forceinline__ void next() {
    ++round;
    unit = round * stride + ((round & 1) ? stride - 1 - cluster : cluster);  // one unit per cluster: past the end
  }

  // FT_SCHEDULER=1, the producer thread: the next unit from the counter (units past the last: invalid).
  __host__ __device__ __forceinline__ void fetch(unsigned* counter) {
    unit = stride + static_cast<int>(counter_add(&counter[0], 1));
  }
  // FT_SCHEDULER=1, the producer thread, after its last fetch: this CTA is done; the last one zeroes the
  // counter (every CTA's last fetch precedes its arrival on counter[1], so no fetch follows the reset).
  __host__ __device__ __forceinline__ void retire(unsigned* counter) const {
#ifdef __CUDA_ARCH__
    __threadfence();
#endif
    if (counter_add(&counter[1], 1) == static_cast<unsigned>(stride - 1)) {
      counter[0] = 0;
      counter[1] = 0;
    }
  }

  // The unit's query-block group ("tile": a unit when neither split is on), its key range among the tile's
  // splits(), and the tile's index among the split ones (its partials' place in the workspace: epilogue.cuh).
  __host__ __device__ __forceinline__ int tile() const {
    if constexpr (kTailSplits > 1) return unit < whole_tiles ? unit : whole_tiles + (unit - whole_tiles) / tail_splits;
    return unit / kKvSplits;
  }
  __host__ __device__ __forceinline__ int split() const {
    if constexpr (kTailSplits > 1) return unit < whole_tiles ? 0 : (unit - whole_tiles) % tail_splits;
    return unit % kKvSplits;
  }
  __host__ __device__ __forceinline__ int splits() const {
    if constexpr (kTailSplits > 1) return unit < whole_tiles ? 1 : tail_splits;
    return kKvSplits;
  }
  __host__ __device__ __forceinline__ int split_tile() const {
    if constexpr (kTailSplits > 1) return tile() - whole_tiles;
    return tile();
  }
  __host__ __device__ __forceinline__ int tiles() const {
    if constexpr (kTailSplits > 1) return whole_tiles + (units - whole_tiles) / tail_splits;
    return units / kKvSplits;
  }

  // The tile's (batch * heads + head) pair and its query-block group's place in the order (0: the last
  // group, the longest causal one), by the sections above (one pair per section: pair-major).
  __host__ __device__ __forceinline__ void place(int& pair, int& rank_in_order) const {
    if constexpr (kL2SwizzleMb == 0) {  // one pair per section, without the section arithmetic (registers)
      pair = tile() / m_groups;
      rank_in_order = tile() % m_groups;
      return;
    }
    const int t = tile(), span = m_groups * section, first = t / span * section;
    const int here = pairs - first < section ? pairs - first : section, r = t % span;  // this section's pairs
    pair = first + r % here;
    rank_in_order = r / here;
  }
  __host__ __device__ __forceinline__ int m_block(int rank) const {
    int pair, order;
    place(pair, order);
    return (m_groups - 1 - order) * kClusterCtas + rank;
  }
  __host__ __device__ __forceinline__ int head() const {
    int pair, order;
    place(pair, order);
    return pair % heads;
  }
  __host__ __device__ __forceinline__ int batch() const {
    int pair, order;
    place(pair, order);
    return pair / heads;
  }
};

}  // namespace ft_sm90
