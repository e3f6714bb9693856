// TMA (cp.async.bulk.tensor) wrappers, sm_90. Tensor maps are encoded on the host
// (tuner/gpu/tma.py) and passed by value as `const __grid_constant__ TmaDesc`.
#pragma once

#include <cstdint>

namespace ft_sm90::ptx {

// Layout-compatible with CUtensorMap (128 bytes, 64-byte aligned); avoids including cuda.h.
struct alignas(64) TmaDesc {
  uint64_t opaque[16];
};

__device__ __forceinline__ uint64_t tma_desc_addr(const TmaDesc* desc) { return reinterpret_cast<uint64_t>(desc); }

__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* desc) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tma_desc_addr(desc)) : "memory");
}

// L2 eviction policies for the cache_hint operand.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// Global -> shared, one 4-D box at coordinates (c0 innermost .. c3); completes `bytes`
// (the full box, out-of-bounds elements zero-filled) on the mbarrier at `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const TmaDesc* desc, uint32_t bar, int c0, int c1, int c2,
                                            int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(tma_desc_addr(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
      : "memory");
}

// As tma_load_4d, but the box lands at the same offset in the shared memory of every CTA
// of the cluster named in `cta_mask`, and completes its bytes on each one's mbarrier at `bar`.
__device__ __forceinline__ void tma_load_4d_multicast(uint32_t dst, const TmaDesc* desc, uint32_t bar, int c0, int c1,
                                                      int c2, int c3, uint16_t cta_mask, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7, %8;\n" ::"r"(dst),
      "l"(tma_desc_addr(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(cta_mask), "l"(policy)
      : "memory");
}

// Shared -> global, one 4-D box; elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const TmaDesc* desc, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   tma_desc_addr(desc)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}

__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Wait until the committed stores have finished reading shared memory.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Order this thread's ordinary shared-memory writes before later async-proxy (TMA, wgmma) reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace ft_sm90::ptx
