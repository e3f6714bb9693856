// Shared-memory storage of one CTA and the XOR swizzle of its [rows][head_dim] tiles.
//
// A tile row is head_dim 16-bit elements = head_dim / 8 chunks of 16 bytes. Chunk c of
// row r is stored at chunk position c ^ (r % 8): the 8 row addresses of one ldmatrix
// (8 consecutive rows, same logical chunk) then fall in 8 different 16-byte bank groups,
// and so do the 16-byte cp.async writes and the epilogue's 4-byte stores.
#pragma once

#include "sm80/config.cuh"

namespace ft_sm80 {

struct SharedStorage {
  elem_t q[kBlockM * kHeadDim];                // Q tile; reused by each warp for its O rows
  elem_t k[kKvStages][kBlockN * kHeadDim];     // K ring
  elem_t v[kKvStages][kBlockN * kHeadDim];     // V ring
};
static_assert(sizeof(SharedStorage) == kSmemBytes,
              "FT_SMEM_BYTES (space file `smem_bytes`) must equal the kernel's shared storage exactly");

constexpr int kRowBytes = kHeadDim * 2;

// Element offset of (row, 16-byte chunk) in a swizzled tile.
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return (row * kChunksPerRow + (chunk ^ (row & 7))) * 8;
}

// Byte offset of one lane's ldmatrix row address in a swizzled tile: row `row`, chunk
// 2 * j + hi. (2j + hi) ^ (row % 8) = 2j ^ (hi ^ row % 8), so the offset for chunk pair j
// is `base ^ (j << 5)` for j < 4; pairs j >= 4 (chunk bit 3, untouched by the swizzle) and
// moves by multiples of 8 rows (same row % 8) are plain immediates. One register per
// operand instead of one per chunk pair.
struct FragOffsets {
  unsigned base;  // offset of chunk hi (pair 0) of row `row`

  __device__ __forceinline__ FragOffsets(int row, int hi) : base(row * kRowBytes + ((hi ^ (row & 7)) << 4)) {}

  // Address of chunk pair `pair` (compile-time), `rows` rows further (multiple of 8).
  __device__ __forceinline__ unsigned at(unsigned tile_addr, int pair, int rows) const {
    return tile_addr + (base ^ ((pair & 3) << 5)) + (pair >> 2) * 128 + rows * kRowBytes;
  }
};

}  // namespace ft_sm80
