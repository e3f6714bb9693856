// Host-side exhaustive check of the sm90 work distribution: kernel_src/sm90/tile_scheduler.cuh
// and block_info.cuh compiled for the CPU with the config's FT_* macros, run over every CTA of
// the grid that the space file computes (passed in by tests/test_kernel_schedule.py).
//
// The rows of query block m, derived here: [m kBlockM - shift, (m + 1) kBlockM - shift), where shift is 0
// without the causal mask and, with it, the padding of seqlen_q to whole block groups rounded down to a multiple
// of both 64 (a warpgroup) and kBlockN; every row of [0, seqlen_q) lies in exactly one block, and no warpgroup
// has both a negative row and a row >= 0 (its O store would start at a negative row).
//
// FT_KV_SPLITS > 1: every query block is visited once per split, and the splits' key ranges cover each key
// block of the block's range exactly once (every key a row sees lies in one split's range, before the
// visible end of the row's warpgroup).
//
// FT_TAIL_SPLITS = S > 1 (persistent): the same, where the splits a tile takes are computed here from the grid,
// independently of the scheduler: of T tiles on G = GRID_X / cta_mode clusters the last r = T mod G take
// min(S, G / r) units each (1 when r = 0), the others one; the split units are numbered after every whole tile
// (so the counter hands them out last), and the partials they index (split tile x splits + split) stay below G.
//
// FT_SCHEDULER=1 (dynamic): the CTAs' fetches from the tile counter are simulated in the order the
// kernel makes them when every unit takes as long as its key blocks: the CTA that finishes first
// fetches next (ties: the lower CTA). The counter must be back to zero after the last CTA retires.
//
// usage: sm90_schedule_check GRID_X GRID_Y GRID_Z BATCH SEQLEN_Q SEQLEN_K HEADS_Q HEADS_KV [units-only]
// Prints "ok <units visited> <max load> <total load>" (load: key blocks a cluster visits) and exits 0,
// or prints the first violation and exits 1. "units-only" skips the per-row and per-key checks.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <queue>
#include <vector>

#include "sm90/block_info.cuh"
#include "sm90/tile_scheduler.cuh"

using namespace ft_sm90;

static int fail(const char* what, int a, int b, int c, int d) {
  std::printf("FAIL %s (%d %d %d %d)\n", what, a, b, c, d);
  return 1;
}

static bool sees(int row, int key, const BlockInfo& blk) {
  return key < blk.seqlen_k && (!kIsCausal || key <= row + blk.causal_offset);
}

// The key blocks of a unit: what it costs a cluster (its CTAs visit the same ones).
static long unit_cost(const TileScheduler& s, int sq, int sk, int hq, int hkv) {
  const BlockInfo blk(s.m_block(0), s.head(), s.batch(), sq, sk, hq, hkv, s.split(), s.splits());
  return blk.n_block_max - blk.n_block_min();
}

// The schedulers of each cluster, one per unit it takes, in order.
static std::vector<std::vector<TileScheduler>> cluster_units(int gx, int gy, int gz, int batch, int sq, int sk,
                                                             int hq, int hkv, unsigned* counter) {
  std::vector<std::vector<TileScheduler>> out;
  std::vector<TileScheduler> first;
  for (int bz = 0; bz < gz; ++bz)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; bx += kClusterCtas) {
        out.emplace_back();
        TileScheduler s(batch, sq, sk, hq, hkv, bx, by, bz, gx);
        first.push_back(s);
        if constexpr (!kDynamicScheduler)
          for (; s.valid(); s.next()) out.back().push_back(s);
        else if (s.valid())
          out.back().push_back(s);  // the first unit: the CTA's own index
      }
  if constexpr (kDynamicScheduler) {
    using Event = std::pair<long, int>;  // (time the cluster's current unit ends, cluster)
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> ends;
    for (int c = 0; c < static_cast<int>(out.size()); ++c) {
      if (out[c].empty())
        first[c].retire(counter);  // more CTAs than units: done before any fetch
      else
        ends.push({unit_cost(out[c].back(), sq, sk, hq, hkv), c});
    }
    while (!ends.empty()) {
      const auto [t, c] = ends.top();
      ends.pop();
      TileScheduler s = out[c].back();
      s.fetch(counter);
      if (s.valid()) {
        out[c].push_back(s);
        ends.push({t + unit_cost(s, sq, sk, hq, hkv), c});
      } else {
        s.retire(counter);
      }
    }
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc != 9 && argc != 10) return fail("usage", argc, 0, 0, 0);
  const int gx = std::atoi(argv[1]), gy = std::atoi(argv[2]), gz = std::atoi(argv[3]);
  const int batch = std::atoi(argv[4]), sq = std::atoi(argv[5]), sk = std::atoi(argv[6]);
  const int hq = std::atoi(argv[7]), hkv = std::atoi(argv[8]);
  const bool units_only = argc == 10 && std::strcmp(argv[9], "units-only") == 0;
  if (gx % kClusterCtas) return fail("grid x is not a multiple of the cluster size", gx, kClusterCtas, 0, 0);
  if (kDynamicScheduler && (gy != 1 || gz != 1)) return fail("a dynamic grid is one row of CTAs", gy, gz, 0, 0);
  const int m_blocks = (sq + kBlockM - 1) / kBlockM;
  const int m_padded = (m_blocks + kClusterCtas - 1) / kClusterCtas * kClusterCtas;  // a cluster's odd last block
  int step = kWgRows;  // the least multiple of 64 that kBlockN divides
  while (step % kBlockN) step += kWgRows;
  const int shift = kIsCausal ? (m_padded * kBlockM - sq) / step * step : 0;  // block m: m kBlockM - shift
  if (shift < 0 || shift >= kBlockM * kClusterCtas) return fail("padding past one block group", shift, sq, 0, 0);
  std::vector<int> visits(static_cast<size_t>(m_padded) * hq * batch, 0);
  const int n_blocks = (sk + kBlockN - 1) / kBlockN;
  std::vector<int> covered(visits.size() * n_blocks, 0);  // per query block: how many splits visit each key block
  // the splits each tile takes, from the grid (see the top); tile = (b * hq + h) * m_groups + m_groups - 1 - group
  const int m_groups = m_padded / kClusterCtas, tiles = m_groups * hq * batch, ctas = gx / kClusterCtas;
  const int tail = kTailSplits > 1 ? tiles % ctas : 0;
  const int tail_splits = tail == 0 ? 1 : (kTailSplits < ctas / tail ? kTailSplits : ctas / tail);
  const auto splits_of = [&](int b, int h, int m) {
    const int tile = (b * hq + h) * m_groups + m_groups - 1 - m / kClusterCtas;
    return kTailSplits > 1 ? (tile >= tiles - tail ? tail_splits : 1) : kKvSplits;
  };
  unsigned counter[2] = {0, 0};
  const auto clusters = cluster_units(gx, gy, gz, batch, sq, sk, hq, hkv, counter);
  if (counter[0] != 0 || counter[1] != 0)
    return fail("the tile counter is not zero after the last CTA", counter[0], counter[1], gx, 0);
  long units = 0, max_load = 0, total_load = 0;
  for (const auto& taken : clusters) {
    long load = 0;
    for (const TileScheduler& s0 : taken) {  // the CTAs of one cluster walk their units in lockstep
      int n_max = -1, n_min = -1;
      for (int rank = 0; rank < kClusterCtas; ++rank) {
        const TileScheduler& s = s0;
        const int m = s.m_block(rank), h = s.head(), b = s.batch();
        if (m < 0 || m >= m_padded || h < 0 || h >= hq || b < 0 || b >= batch)
          return fail("unit out of range", m, h, b, rank);
        const size_t block = (static_cast<size_t>(b) * hq + h) * m_padded + m;
        ++visits[block];
        ++units;
        if (s.splits() != splits_of(b, h, m)) return fail("split count of a tile", b, h, m, s.splits());
        if (s.split() < 0 || s.split() >= s.splits()) return fail("split index out of range", m, s.split(), s.splits(), 0);
        if (kTailSplits > 1 && s.splits() > 1) {
          if (s.unit < tiles - tail) return fail("a split unit is numbered before a whole tile", s.unit, tiles, tail, 0);
          if (s.split_tile() < 0 || s.split_tile() * s.splits() + s.split() >= ctas)
            return fail("a partial past the workspace of G splits", s.split_tile(), s.splits(), s.split(), ctas);
        }
        const BlockInfo blk(m, h, b, sq, sk, hq, hkv, s.split(), s.splits());
        if (blk.kv_head != h / (hq / hkv)) return fail("kv head", h, blk.kv_head, hq, hkv);
        if (blk.m0() != m * kBlockM - shift) return fail("first row of a block", m, blk.m0(), shift, sq);
        if (n_max >= 0 && (blk.n_block_max != n_max || blk.n_block_min() != n_min))
          return fail("cluster CTAs visit different key blocks", m, n_max, blk.n_block_max, rank);
        n_max = blk.n_block_max;
        n_min = blk.n_block_min();
        if (n_min < 0 || n_min > n_max) return fail("split range out of order", m, s.split(), n_min, n_max);
        if (n_max > n_blocks) return fail("split range past the key blocks", m, s.split(), n_max, n_blocks);
        for (int n = n_min; n < n_max; ++n) ++covered[block * n_blocks + n];
        if (blk.n_block_max * kBlockN >= sk + kBlockN) return fail("key block past seqlen_k", m, blk.n_block_max, sk, 0);
        if (units_only) continue;
        for (int wg = 0; wg < kConsumerWgs; ++wg) {
          const int first = blk.m0() + wg * kWgRows;
          const int visible = blk.n_block_visible(first, kWgRows);
          if (visible < 0 || visible > blk.n_block_max) return fail("visible blocks out of range", m, wg, visible, blk.n_block_max);
          bool rows = false;  // does a row of the warpgroup exist: the kernel computes and stores only then
          for (int row = first; row < first + kWgRows; ++row) rows |= row >= 0 && row < sq;
          if (first < 0 && first + kWgRows > 0) return fail("a warpgroup's rows straddle row 0", m, wg, first, shift);
          if (blk.has_rows(first, kWgRows) != rows) return fail("which warpgroups have rows", m, wg, first, rows);
          for (int row = std::max(first, 0); row < first + kWgRows && row < sq; ++row)
            for (int key = 0; key < sk; ++key) {
              if (!sees(row, key, blk)) continue;
              const int n = key / kBlockN;
              if (n >= blk.n_block_min() && n < blk.n_block_max && n >= visible)
                return fail("a visible key's block is skipped", row, key, n, visible);
            }
          for (int n = blk.n_block_min(); n < blk.n_block_max; ++n) {
            if (blk.needs_mask(n, first)) continue;
            for (int row = first; row < first + kWgRows; ++row)  // padding rows too: they must stay finite
              for (int key = n * kBlockN; key < (n + 1) * kBlockN; ++key)
                if (!sees(row, key, blk)) return fail("an unmasked block holds a masked key", row, key, n, first);
          }
        }
      }
      load += n_max - n_min;
    }
    max_load = load > max_load ? load : max_load;
    total_load += load;
  }
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < hq; ++h)
      for (int m = 0; m < m_padded; ++m) {
        const size_t block = (static_cast<size_t>(b) * hq + h) * m_padded + m;
        const int v = visits[block];
        if (v != splits_of(b, h, m)) return fail("query block not visited exactly once per split", b, h, m, v);
        for (int n = 0; n < n_blocks; ++n)
          if (covered[block * n_blocks + n] > 1) return fail("a key block is in two splits", b, h, m, n);
        if (units_only) continue;
        const BlockInfo blk(m, h, b, sq, sk, hq, hkv);
        for (int row = std::max(m * kBlockM - shift, 0); row < (m + 1) * kBlockM - shift && row < sq; ++row)
          for (int key = 0; key < sk; ++key)
            if (sees(row, key, blk) && covered[block * n_blocks + key / kBlockN] != 1)
              return fail("a key a row sees is in no split", row, key, key / kBlockN, h);
      }
  std::printf("ok %ld %ld %ld\n", units, max_load, total_load);
  return 0;
}
