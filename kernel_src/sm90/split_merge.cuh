// Split-KV's LSE merge of one row (epilogue.cuh's merge_splits): split s of S (kKvSplits, or the tail split's
// run-time count) saw its key range
// and left a normalised O_s and its natural-log LSE_s (-inf, with O_s = 0, when it saw no key of the
// row). The row's O and LSE over all its keys are
//   m = max_s LSE_s,  w_s = exp(LSE_s - m),  O = sum_s w_s O_s / sum_s w_s,  LSE = m + log(sum_s w_s),
// and a row that no split saw keeps O = 0, LSE = -inf (no weight is NaN: -inf - -inf is never taken).
// Host-callable: tests/kernels/split_merge_check.cu checks it against a softmax over all the keys.
#pragma once

#include <cmath>

#include "sm90/config.cuh"

namespace ft_sm90 {

struct SplitMerge {
  float max_lse = -INFINITY;
  float inv_sum = 0.f;  // 1 / sum_s w_s; 0 when no split saw a key
  float lse = -INFINITY;

  // lse_of(s): LSE_s of split s < splits. Runtime loops (unroll 1): the kernel reads the other splits' LSEs from
  // memory, and unrolled loads hoisted next to the O registers spill at head dim 64.
  template <class LseOf>
  __host__ __device__ __forceinline__ explicit SplitMerge(LseOf&& lse_of, int splits = kKvSplits) {
#pragma unroll 1
    for (int s = 0; s < splits; ++s) max_lse = fmaxf(max_lse, lse_of(s));
    if (max_lse == -INFINITY) return;
    float sum = 0.f;  // >= 1: the largest LSE weighs 1
#pragma unroll 1
    for (int s = 0; s < splits; ++s) sum += exp2f((lse_of(s) - max_lse) * float(M_LOG2E));
    inv_sum = 1.f / sum;
    lse = max_lse + logf(sum);
  }

  // w_s / sum_s w_s: what a split's normalised O is multiplied by (0 for a split without keys).
  __host__ __device__ __forceinline__ float weight(float split_lse) const {
    return inv_sum == 0.f ? 0.f : exp2f((split_lse - max_lse) * float(M_LOG2E)) * inv_sum;
  }
};

}  // namespace ft_sm90
