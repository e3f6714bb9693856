// Shared-memory layout of one CTA and the wgmma descriptors that read it.
//
// Every tile is stored as kPanels column panels of 64 16-bit values (128 bytes) per row,
// exactly as a TMA box with 128-byte swizzle writes it: panel p of a tile of R rows starts
// at p * R * 128 bytes, row r of the panel at r * 128, and 16-byte chunk c of that row sits
// at chunk c ^ (r % 8). Every panel starts on a 1024-byte boundary (the swizzle atom).
#pragma once

#include <cstdint>

#include "sm90/config.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/ptx/mbarrier.cuh"
#include "sm90/ptx/wgmma.cuh"

namespace ft_sm90 {

constexpr int kRowBytes = kPanelCols * 2;           // 128
constexpr int kSwizzleAtomBytes = 8 * kRowBytes;    // 1024: 8 rows of 128 bytes
constexpr int kQTileBytes = kBlockM * kHeadDim * 2;
constexpr int kKvTileBytes = kBlockN * kHeadDim * 2;
constexpr int kPCols = (kBlockN + kPanelCols - 1) / kPanelCols * kPanelCols;  // block_n padded to whole panels

// The base is aligned to 1024 bytes by the kernel; every tile size is a multiple of 1024.
struct SharedStorage {
  // Q of the CTA's i-th work unit in stage i % kQStages; after a consumer warpgroup's last S GEMM
  // of the unit, its rows of the stage take its O for the TMA store (epilogue.cuh).
  elem_t q[kQStages][kBlockM * kHeadDim];
  elem_t k[kKvStages][kBlockN * kHeadDim];
  elem_t v[kKvStages][kBlockN * kHeadDim];
#if FT_P_SMEM
  // P of consumer warpgroup w (64 rows x kPCols keys, K-major A operand of O += P V), swizzled
  // like Q; absent with p_smem 0, so that layout is unchanged
  elem_t p[kConsumerWgs][kWgRows * kPCols];
#endif
  RingBarriers<kKvStages> k_ring;  // with kv_barriers = 1: the barriers of K and V together
  RingBarriers<kKvStages> v_ring;  // unused with kv_barriers = 1
  // full: the stage's Q landed (a unit without key blocks: the stage is free); empty: every
  // consumer warpgroup's O store has read the stage (StoreHeldStage), so the producer may reload it
  RingBarriers<kQStages> q_ring;
  // FT_SCHEDULER=1: the work unit of each Q stage (-1: none left), written by the producer before it
  // completes its part of the stage's full barrier, read by the consumers after waiting for it
  int q_unit[kQStages];
};

static_assert(kQTileBytes % kSwizzleAtomBytes == 0 && kKvTileBytes % kSwizzleAtomBytes == 0,
              "tiles must keep every panel on a swizzle-atom boundary");
static_assert(sizeof(SharedStorage) + 1024 <= kSmemBytes, "FT_SMEM_BYTES is smaller than the shared storage");

// Byte offset of k-step `kk` (16 columns of the reduction dim) in a K-major tile of `rows`
// rows: 32 bytes per step inside a 128-byte row, then the next panel.
__device__ __forceinline__ uint32_t kmajor_k_offset(int kk, int rows) {
  return (kk / 4) * rows * kRowBytes + (kk % 4) * 32;
}

// A = Q rows of consumer warpgroup `wg` (64 x kHeadDim, K-major) of the stage at q_base, k-step kk.
__device__ __forceinline__ uint64_t q_desc(uint32_t q_base, int wg, int kk) {
  return ptx::smem_desc(q_base + wg * kWgRows * kRowBytes + kmajor_k_offset(kk, kBlockM), 16, kSwizzleAtomBytes);
}

// A = P tile of a consumer warpgroup (64 x kPCols, K-major) at p_base, k-step kk (16 keys).
__device__ __forceinline__ uint64_t p_desc(uint32_t p_base, int kk) {
  return ptx::smem_desc(p_base + kmajor_k_offset(kk, kWgRows), 16, kSwizzleAtomBytes);
}

// B = K tile (kBlockN keys x kHeadDim, K-major: N = keys), k-step kk.
__device__ __forceinline__ uint64_t k_desc(uint32_t k_base, int kk) {
  return ptx::smem_desc(k_base + kmajor_k_offset(kk, kBlockN), 16, kSwizzleAtomBytes);
}

// B = V tile (kBlockN keys x kHeadDim) read MN-major (N = head dim runs along the row):
// k-step kk covers keys 16kk..16kk+15 (two 8-row atoms, 2048 bytes); the leading-dimension
// offset steps from one 64-column panel to the next, the stride offset from one 8-key atom
// to the next.
__device__ __forceinline__ uint64_t v_desc(uint32_t v_base, int kk) {
  return ptx::smem_desc(v_base + kk * 2 * kSwizzleAtomBytes, kBlockN * kRowBytes, kSwizzleAtomBytes);
}

// Byte offset of element (row, col) in a swizzled tile of `rows` rows (col even: 4-byte pair).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col, int rows) {
  const int panel = col / kPanelCols, c = col % kPanelCols;
  return panel * rows * kRowBytes + row * kRowBytes + ((((c / 8) ^ (row % 8))) << 4) + (c % 8) * 2;
}

}  // namespace ft_sm90
