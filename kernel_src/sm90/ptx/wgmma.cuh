// wgmma (sm_90a warpgroup MMA): shared-memory descriptors, fences, commit/wait, and the
// m64nNk16 issue wrappers (generated per N in wgmma_shapes.inc).
//
// Every wgmma.* instruction here is .sync.aligned: all 128 threads of the warpgroup must
// execute it together, under warp-uniform control flow.
#pragma once

#include <cstdint>

namespace ft_sm90::ptx {

// ---- shared-memory matrix descriptor (PTX ISA "matrix-descriptor-format") ---------------
// bits  0-13: start address >> 4      bits 16-29: leading-dimension byte offset >> 4
// bits 32-45: stride-dimension byte offset >> 4      bits 62-63: swizzle (1 = 128 B)
enum class Swizzle : uint64_t { k128B = 1 };

__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (static_cast<uint64_t>(Swizzle::k128B) << 62);
}

// Move a descriptor's start address by `bytes` (a multiple of 16; stays inside the 256 KB window).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// ---- ordering --------------------------------------------------------------------------
// Before the first wgmma that reads registers (accumulators or A) written by other instructions.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// One 4-byte store to shared memory.
__device__ __forceinline__ void st_shared_b32(uint32_t smem_addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_addr), "r"(v) : "memory");
}

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Wait until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pin registers that an in-flight wgmma reads or writes: the compiler may not move their
// uses across this point (register operands are invisible to a "memory" clobber).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

template <typename T, int N>
__device__ __forceinline__ void fence_operands(T (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(r[i]);
}

template <typename T, int M, int N>
__device__ __forceinline__ void fence_operands(T (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) fence_operands(r[i]);
}

// ---- accumulator layout of m64nN (per warp, 16 rows) ------------------------------------
// Value i of a thread sits in row lane/4 + 8 * acc_row_half(i) and column
// (i >> 2) * 8 + 2 * (lane % 4) + (i & 1). So each thread owns two rows (h = 0, 1) and a row
// is spread over the 4 threads of a quad.
__device__ __forceinline__ int acc_row_half(int i) { return (i >> 1) & 1; }

// ---- issue: D(64xN, fp32) (+)= A(64x16) * B(16xN) ---------------------------------------
// Wgmma<N>::ss<kBf16, kTransA, kTransB>(d, desc_a, desc_b, scale_d): A and B in shared memory.
// Wgmma<N>::rs<kBf16, kTransB>(d, a, desc_b, scale_d): A in registers (4 x b32 per thread,
//   the m64k16 fragment layout, which equals the accumulator layout of two n8 columns).
// kTrans* = 0 for K-major operands, 1 for MN-major ones. scale_d = 0 overwrites D.
template <int N>
struct Wgmma;

#include "sm90/ptx/wgmma_shapes.inc"

}  // namespace ft_sm90::ptx
