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

}  // namespace ft_sm90
