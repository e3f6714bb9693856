// Which work units (a query-block group of one head of one batch) a CTA computes, in order.
//
// A unit is kClusterCtas consecutive query blocks of one (batch, head): CTA rank r of a
// cluster takes block kClusterCtas * group + r, so both CTAs of a cluster need the same K/V
// tiles. Units are numbered with the query-block group fastest, longest (last) group first:
//   unit = (batch * heads + head) * m_groups + (m_groups - 1 - group)
// so that CTAs running at the same time share one head's K/V in L2, and the long causal
// blocks of a head start before its short ones.
//   FT_PERSISTENT=0: one unit per cluster, from blockIdx (grid: m_groups * kClusterCtas, heads, batch).
//   FT_PERSISTENT=1: gridDim.x / kClusterCtas clusters (one CTA per SM) take units round-robin.
#pragma once

#include "config.cuh"

namespace ft_sm90 {

// Host-callable too: tests/kernels/sm90_schedule_check.cu checks it exhaustively on the CPU.
struct TileScheduler {
  int m_groups, heads, units;
  int unit, stride;

  // block = (blockIdx.x, blockIdx.y, blockIdx.z), grid_x = gridDim.x
  __host__ __device__ __forceinline__ TileScheduler(int batch, int seqlen_q, int heads_q, int block_x, int block_y,
                                                    int block_z, int grid_x)
      : m_groups((seqlen_q + kBlockM * kClusterCtas - 1) / (kBlockM * kClusterCtas)), heads(heads_q) {
    units = m_groups * heads * batch;
    const int cluster = block_x / kClusterCtas;
    if constexpr (kPersistent) {
      unit = cluster;
      stride = grid_x / kClusterCtas;
    } else {
      unit = (block_z * heads + block_y) * m_groups + cluster;
      stride = units;  // one unit
    }
  }

  __host__ __device__ __forceinline__ bool valid() const { return unit < units; }
  __host__ __device__ __forceinline__ void next() { unit += stride; }

  __host__ __device__ __forceinline__ int m_block(int rank) const {
    return (m_groups - 1 - unit % m_groups) * kClusterCtas + rank;
  }
  __host__ __device__ __forceinline__ int head() const { return (unit / m_groups) % heads; }
  __host__ __device__ __forceinline__ int batch() const { return unit / m_groups / heads; }
};

}  // namespace ft_sm90
