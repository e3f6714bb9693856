// Named (hardware) barriers among subsets of the CTA's warps. Ids are an enum class so
// that no two roles share one by accident; id 0 is __syncthreads.
#pragma once

#include <cstdint>

namespace ft_sm90 {

enum class BarrierId : uint32_t {
  kSyncThreads = 0,
  // Ping-pong: consumer warpgroup w waits on kWgTurn0 + w before issuing its GEMMs.
  kWgTurn0 = 1,
  kWgTurn1 = 2,
  kWgTurn2 = 3,
  // Epilogue of consumer warpgroup w (its 128 threads): kEpilogue0 + w.
  kEpilogue0 = 4,
  kEpilogue1 = 5,
  kEpilogue2 = 6,
  // p_smem: consumer warpgroup w's P tile is written (its 128 threads): kPTile0 + w.
  kPTile0 = 7,
  kPTile1 = 8,
  kPTile2 = 9,
};

__device__ __forceinline__ uint32_t barrier_id(BarrierId base, int offset) {
  return static_cast<uint32_t>(base) + static_cast<uint32_t>(offset);
}

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.sync that also returns, to every thread, whether `pred` was true in any of them.
__device__ __forceinline__ bool named_barrier_or(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace ft_sm90
