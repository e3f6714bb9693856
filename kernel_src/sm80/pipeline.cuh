// cp.async loads of Q and of the K/V ring.
//
// K tile t and V tile t live in slot t % kKvStages of their ring. Commit groups are issued
// in the fixed order Q, K0, V0, K1, V1, ... so that one wait count serves every wait:
//
//   prologue             K0 V0 ... K(S-2) V(S-2) K(S-1)
//   iteration t, start   wait K(t); barrier (all warps done with P.V of t-1)  -> issue V(t+S-1)
//   after S = Q K(t)^T   wait V(t); barrier (all warps done with K(t))        -> issue K(t+S)
//
// Each wait leaves the 2S-2 most recent groups in flight. Tiles past the last key block
// commit an empty group, which keeps the count uniform. S = 1 is FlashAttention-2's
// schedule: V(t) loads during Q K(t)^T and K(t+1) during softmax and P.V.
#pragma once

#include "sm80/config.cuh"
#include "sm80/ptx.cuh"
#include "sm80/smem_layout.cuh"

namespace ft_sm80 {

// Per-thread part of a tile copy: thread `tid` copies chunk tid % kChunksPerRow of rows
// tid / kChunksPerRow + i * kRowStep. kRowStep is a multiple of 8, so every chunk of the
// thread has the same swizzle and its smem destinations differ by immediates.
struct TileCopyLane {
  static constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kRowStep % 8 == 0, "tile copy rows per step must keep the swizzle (multiple of 8)");
  int row;             // first tile row of this thread
  int col;             // element column of this thread's chunk
  unsigned smem_off;   // byte offset of (row, chunk) in a swizzled tile

  __device__ __forceinline__ explicit TileCopyLane(int tid)
      : row(tid / kChunksPerRow),
        col((tid % kChunksPerRow) * 8),
        smem_off(swizzle(tid / kChunksPerRow, tid % kChunksPerRow) * 2) {}
};

// Copy rows [row0, row0 + kRows) of a row-major [rows][head_dim] matrix into a swizzled
// smem tile; rows at or past row_limit are zero-filled: their cp.async reads 0 bytes, so
// their (out-of-range) source address is never dereferenced.
template <int kRows>
__device__ __forceinline__ void load_tile_async(unsigned tile_addr, const elem_t* gmem, long long row_stride,
                                                int row0, int row_limit, const TileCopyLane& lane) {
  constexpr int kSteps = kRows / TileCopyLane::kRowStep;
  static_assert(kRows % TileCopyLane::kRowStep == 0, "tile rows must be a multiple of the copy row step");
  const int grow0 = row0 + lane.row;
  const elem_t* src = gmem + grow0 * row_stride + lane.col;
  const long long step_stride = TileCopyLane::kRowStep * row_stride;
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const bool valid = grow0 + i * TileCopyLane::kRowStep < row_limit;
    ptx::cp_async_16(tile_addr + lane.smem_off + i * TileCopyLane::kRowStep * kRowBytes, src, valid);
    src += step_stride;
  }
}

struct KvRing {
  static constexpr int kPendingGroups = 2 * kKvStages - 2;

  unsigned k_ring;  // smem address of K slot 0
  unsigned v_ring;
  const elem_t* k_gmem;  // this (batch, kv head), key row 0
  const elem_t* v_gmem;
  long long k_row_stride;
  long long v_row_stride;
  int seqlen_k;
  int n_blocks;  // key blocks this CTA visits; tile t is key block n_blocks - 1 - t

  __device__ __forceinline__ int key0(int t) const { return (n_blocks - 1 - t) * kBlockN; }
  static constexpr unsigned kTileBytes = kBlockN * kRowBytes;
  __device__ __forceinline__ unsigned k_tile(int t) const { return k_ring + (t % kKvStages) * kTileBytes; }
  __device__ __forceinline__ unsigned v_tile(int t) const { return v_ring + (t % kKvStages) * kTileBytes; }

  __device__ __forceinline__ void issue_k(int t, const TileCopyLane& lane) {
    if (t < n_blocks) load_tile_async<kBlockN>(k_tile(t), k_gmem, k_row_stride, key0(t), seqlen_k, lane);
    ptx::cp_async_commit();
  }
  __device__ __forceinline__ void issue_v(int t, const TileCopyLane& lane) {
    if (t < n_blocks) load_tile_async<kBlockN>(v_tile(t), v_gmem, v_row_stride, key0(t), seqlen_k, lane);
    ptx::cp_async_commit();
  }
  __device__ __forceinline__ void prologue(const TileCopyLane& lane) {
#pragma unroll
    for (int s = 0; s < kKvStages; ++s) {
      issue_k(s, lane);
      if (s + 1 < kKvStages) issue_v(s, lane);
    }
  }
  // Wait for the oldest tile still needed, then make it visible to (and free the slot
  // read before this point by) every warp.
  __device__ __forceinline__ static void wait() {
    ptx::cp_async_wait<kPendingGroups>();
    __syncthreads();
  }
};

}  // namespace ft_sm80
