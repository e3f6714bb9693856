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
#pragma once

#include "sm90/config.cuh"

namespace ft_sm90 {

// Host-callable too: tests/kernels/sm90_schedule_check.cu checks it exhaustively on the CPU.
struct TileScheduler {
  int m_groups, heads, units;
  int unit, stride;
  int cluster, round = 0;

  // block = (blockIdx.x, blockIdx.y, blockIdx.z), grid_x = gridDim.x
  __host__ __device__ __forceinline__ TileScheduler(int batch, int seqlen_q, int heads_q, int block_x, int block_y,
                                                    int block_z, int grid_x)
      : m_groups((seqlen_q + kBlockM * kClusterCtas - 1) / (kBlockM * kClusterCtas)), heads(heads_q) {
    units = m_groups * heads * batch;
    cluster = block_x / kClusterCtas;
    if constexpr (kPersistent) {
      unit = cluster;
      stride = grid_x / kClusterCtas;
    } else {
      unit = (block_z * heads + block_y) * m_groups + cluster;
      stride = units;  // one unit
    }
  }

  __host__ __device__ __forceinline__ bool valid() const { return unit < units; }
  __host__ __device__ __forceinline__ void next() {
    ++round;
    unit = round * stride + ((round & 1) ? stride - 1 - cluster : cluster);  // one unit per cluster: past the end
  }

  __host__ __device__ __forceinline__ int m_block(int rank) const {
    return (m_groups - 1 - unit % m_groups) * kClusterCtas + rank;
  }
  __host__ __device__ __forceinline__ int head() const { return (unit / m_groups) % heads; }
  __host__ __device__ __forceinline__ int batch() const { return unit / m_groups / heads; }
};

}  // namespace ft_sm90
