// Epilogue: normalise O, stage it through this warp's own rows of the Q tile (no other
// warp reads them), and write O with 16-byte coalesced stores and the fp32 LSE.
#pragma once

#include "sm80/config.cuh"
#include "sm80/ptx.cuh"
#include "sm80/smem_layout.cuh"
#include "sm80/softmax.cuh"

namespace ft_sm80 {

// Caller guarantees that every cp.async into the Q tile has completed and that no warp
// reads this warp's Q rows any more.
__device__ __forceinline__ void write_output(const float (&o)[kMTiles][kDTiles][4], OnlineSoftmax& softmax,
                                             elem_t* q_tile, elem_t* o_gmem, long long o_row_stride,
                                             float* lse_gmem, int m0, int warp_row0, int seqlen_q, int lane) {
  float inv_l[OnlineSoftmax::kRows];
  float lse[OnlineSoftmax::kRows];
  softmax.finalize(inv_l, lse);

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + mt * 16 + (lane >> 2) + 8 * h;
      const float scale = inv_l[2 * mt + h];
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const unsigned packed = ptx::pack2<kIsBf16>(o[mt][dt][2 * h] * scale, o[mt][dt][2 * h + 1] * scale);
        *reinterpret_cast<unsigned*>(q_tile + swizzle(row, dt) + 2 * (lane & 3)) = packed;
      }
      if ((lane & 3) == 0 && m0 + row < seqlen_q) lse_gmem[m0 + row] = lse[2 * mt + h];
    }
  __syncwarp();

  constexpr int kChunks = kWarpRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < kChunks / 32; ++i) {
    const int id = lane + 32 * i;
    const int row = warp_row0 + id / kChunksPerRow;
    const int c = id % kChunksPerRow;
    if (m0 + row < seqlen_q) {
      const uint4 val = *reinterpret_cast<const uint4*>(q_tile + swizzle(row, c));
      *reinterpret_cast<uint4*>(o_gmem + (m0 + row) * o_row_stride + c * 8) = val;
    }
  }
}

}  // namespace ft_sm80
