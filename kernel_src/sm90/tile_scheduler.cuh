// Which work units (a query-block group of one head of one batch) a CTA computes, in order.
//
// A unit is kClusterCtas consecutive query blocks of one (batch, head): CTA rank r of a
// cluster takes block kClusterCtas * group + r, so both CTAs of a cluster need the same K/V
// tiles. Units are numbered with the query-block group fastest, longest (last) group first:
//   unit = (batch * heads + head) * m_groups + (m_groups - 1 - group)
// so that CTAs running at the same time share one head's K/V in L2, and the long causal
// blocks of a head start before its short ones.
//   FT_UNIT_ORDER > 0 (causal): (batch, head)s in sections of whole K/V heads, each at least kSectionWaves (2) waves of
//   units of the CTAs that run at once; within a section the query-block group is slowest, longest first, and the
//   head fastest: unit = section start + group * section heads + head in section. 1: every head in sections, as
//   even as possible (the first ones one K/V head more); 2: one after another as above, but the last heads, as few
//   as make one section, in a section. Why: with one head after another, the longest units of the last heads start
//   in the last wave, and a greedy order (the tile counter, or the hardware's dispatch of CTAs per block) ends
//   1.1-1.3x past the mean load at 4-8 waves; a section ends with its shortest units.
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
//   FT_TAIL_SPLITS=S > 1 (tail split, persistent): of T tiles on G clusters the last r = T mod G form a partly
//   filled last wave; each of them is s = min(S, G / r) units (none when r = 0 or s = 1), over s contiguous key
//   ranges as with split-KV, numbered after the T - r whole tiles, the split index fastest:
//   unit = T - r + (tile - (T - r)) * s + split. The dynamic counter (or the snake's last round, which holds
//   exactly these r * s <= G units) hands them out last and together, so the last wave takes 1/s of a tile's
//   time on r * s clusters instead of a whole tile's on r. s is computed here, at run time, from the grid.
#pragma once

#include "sm90/config.cuh"
#include "sm90/ptx/cluster.cuh"

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
  int m_groups, heads, units;
  int unit, stride;
  int cluster, round = 0;
  int whole_tiles = 0, tail_splits = 1;  // FT_TAIL_SPLITS > 1: tiles [0, whole_tiles) are one unit, the rest s each
  // FT_UNIT_ORDER > 0: query heads per K/V head, K/V heads one after another before the sections, K/V heads per
  // section, sections holding one more (the first ones)
  int group_heads = 1, prefix_groups = 0, section_groups = 0, wide_sections = 0;

  // block = (blockIdx.x, blockIdx.y, blockIdx.z), grid_x = gridDim.x
  __host__ __device__ __forceinline__ TileScheduler(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                                                    int block_x, int block_y, int block_z, int grid_x)
      : m_groups((seqlen_q + kBlockM * kClusterCtas - 1) / (kBlockM * kClusterCtas)), heads(heads_q) {
    units = m_groups * heads * batch * kKvSplits;
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
    if constexpr (kUnitOrder > 0) {
      const int concurrent = kPersistent ? stride : sm_count() * kCtasPerSm / kClusterCtas;  // units run at once
      group_heads = heads_q / heads_kv;
      const int groups = batch * heads_kv;
      const int per_group = m_groups * group_heads;  // tiles of one K/V head
      const int least = max(1, (kSectionWaves * concurrent + per_group - 1) / per_group);  // K/V heads per section
      if constexpr (kUnitOrder == 1) {
        const int sections = max(1, groups / least);
        section_groups = groups / sections;
        wide_sections = groups % sections;
      } else {
        section_groups = min(groups, least);
        prefix_groups = groups - section_groups;
      }
    }
  }

  // The SMs (host: the check of tests/kernels/sm90_schedule_check.cu sizes sections as for an H100/H200's 132).
  __host__ __device__ __forceinline__ static int sm_count() {
#ifdef __CUDA_ARCH__
    return static_cast<int>(ptx::sm_ids());
#else
    return 132;
#endif
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

  // The tile's query-block group in the order taken (0: the last, longest causal one) and its batch * heads + head.
  __host__ __device__ __forceinline__ void locate(int& group, int& batch_head) const {
    const int t = tile();
    if constexpr (kUnitOrder > 0) {
      const int prefix_heads = prefix_groups * group_heads;
      if (t >= prefix_heads * m_groups) {
        const int wide = (section_groups + 1) * group_heads, narrow = section_groups * group_heads;  // heads
        const int wide_tiles = wide_sections * wide * m_groups;
        const int u = t - prefix_heads * m_groups;
        const bool in_wide = u < wide_tiles;
        const int size = in_wide ? wide : narrow, local = in_wide ? u : u - wide_tiles;
        const int section = local / (size * m_groups), within = local % (size * m_groups);
        group = within / size;
        batch_head = prefix_heads + (in_wide ? 0 : wide_sections * wide) + section * size + within % size;
        return;
      }
    }
    group = t % m_groups;
    batch_head = t / m_groups;
  }
  __host__ __device__ __forceinline__ int m_block(int rank) const {
    int group, batch_head;
    locate(group, batch_head);
    return (m_groups - 1 - group) * kClusterCtas + rank;
  }
  __host__ __device__ __forceinline__ int head() const {
    int group, batch_head;
    locate(group, batch_head);
    return batch_head % heads;
  }
  __host__ __device__ __forceinline__ int batch() const {
    int group, batch_head;
    locate(group, batch_head);
    return batch_head / heads;
  }
};

}  // namespace ft_sm90
