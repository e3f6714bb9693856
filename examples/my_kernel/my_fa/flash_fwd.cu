// my_fa: FlashAttention forward with an online softmax, written for reading, not for speed.
//
// ABI flat (kernel_src/README.md of flashtune): Q [batch, seqlen_q, heads_q, head_dim], K and V
// [batch, seqlen_k, heads_kv, head_dim], O like Q, strides in elements with the last dimension
// contiguous; LSE [batch, heads_q, seqlen_q] fp32. grid = (ceil(seqlen_q / block_m), heads_q, batch).
//
// A CTA owns block_m query rows of one (batch, query head). Each row is handled by threads_per_row
// consecutive threads of a warp; each holds row_elems = head_dim / threads_per_row columns of q and
// of the fp32 output accumulator. For every tile of block_n keys, all threads copy K and V into
// shared memory; then each row walks the tile key by key: a partial dot product per thread, summed
// over the row's threads with warp shuffles, and the online-softmax update of (max, sum, o).
#include "my_fa/config.cuh"

namespace my_fa {

__device__ __forceinline__ float to_float(elem_t x) {
#if FT_IS_BF16
  return __bfloat162float(x);
#else
  return __half2float(x);
#endif
}

__device__ __forceinline__ elem_t from_float(float x) {
#if FT_IS_BF16
  return __float2bfloat16(x);
#else
  return __float2half(x);
#endif
}

// The sum of x over the kThreadsPerRow consecutive lanes that share a row (every lane gets it).
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace my_fa

using namespace my_fa;

extern "C" __global__ void __launch_bounds__(kThreads) flashtune_fwd(
    const elem_t* q, const elem_t* k, const elem_t* v, elem_t* o, float* lse,
    int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
    long long q_batch_stride, long long q_row_stride, long long q_head_stride,
    long long k_batch_stride, long long k_row_stride, long long k_head_stride,
    long long v_batch_stride, long long v_row_stride, long long v_head_stride,
    long long o_batch_stride, long long o_row_stride, long long o_head_stride,
    float softmax_scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  elem_t* k_tile = reinterpret_cast<elem_t*>(smem);  // [kBlockN][kHeadDim]
  elem_t* v_tile = k_tile + kBlockN * kHeadDim;       // [kBlockN][kHeadDim]

  const int head = blockIdx.y, b = blockIdx.z;
  const int kv_head = head / (heads_q / heads_kv);  // grouped-query attention
  const int row = blockIdx.x * kBlockM + threadIdx.x / kThreadsPerRow;
  const int col0 = (threadIdx.x % kThreadsPerRow) * kRowElems;  // this thread's first column
  const bool has_row = row < seqlen_q;

  // Causal masking is bottom-right aligned: row i sees key j iff j <= i + seqlen_k - seqlen_q.
  const int shift = seqlen_k - seqlen_q;
  const int last_row = min(seqlen_q, (blockIdx.x + 1) * kBlockM) - 1;
  const int key_end = kIsCausal ? max(0, min(seqlen_k, last_row + shift + 1)) : seqlen_k;  // keys the CTA needs
  const int row_key_end = kIsCausal ? min(seqlen_k, row + shift + 1) : seqlen_k;           // keys this row sees

  float q_part[kRowElems], o_acc[kRowElems];
  const elem_t* q_row = q + b * q_batch_stride + (long long)row * q_row_stride + head * q_head_stride;
#pragma unroll
  for (int e = 0; e < kRowElems; ++e) {
    q_part[e] = has_row ? to_float(q_row[col0 + e]) * softmax_scale : 0.f;
    o_acc[e] = 0.f;
  }
  float row_max = -INFINITY, row_sum_exp = 0.f;

  const elem_t* k_base = k + b * k_batch_stride + kv_head * k_head_stride;
  const elem_t* v_base = v + b * v_batch_stride + kv_head * v_head_stride;
  for (int key0 = 0; key0 < key_end; key0 += kBlockN) {
    // every thread copies some elements of the K and V tiles (keys past seqlen_k are zeros)
    for (int i = threadIdx.x; i < kBlockN * kHeadDim; i += kThreads) {
      const int key = key0 + i / kHeadDim, col = i % kHeadDim;
      const bool in = key < seqlen_k;
      k_tile[i] = in ? k_base[(long long)key * k_row_stride + col] : from_float(0.f);
      v_tile[i] = in ? v_base[(long long)key * v_row_stride + col] : from_float(0.f);
    }
    __syncthreads();
    for (int j = 0; j < kBlockN; ++j) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < kRowElems; ++e) s += q_part[e] * to_float(k_tile[j * kHeadDim + col0 + e]);
      s = row_sum(s);  // every lane of the warp takes part, also those of masked rows
      if (key0 + j >= row_key_end || !has_row) continue;
      const float new_max = fmaxf(row_max, s);
      const float correction = __expf(row_max - new_max);  // 0 on the first visible key (row_max = -inf)
      const float p = __expf(s - new_max);
      row_sum_exp = row_sum_exp * correction + p;
#pragma unroll
      for (int e = 0; e < kRowElems; ++e) o_acc[e] = o_acc[e] * correction + p * to_float(v_tile[j * kHeadDim + col0 + e]);
      row_max = new_max;
    }
    __syncthreads();  // the tiles are overwritten next
  }

  if (!has_row) return;
  // A row that sees no key gets O = 0 and LSE = -inf.
  const float inv = row_sum_exp > 0.f ? 1.f / row_sum_exp : 0.f;
  elem_t* o_row = o + b * o_batch_stride + (long long)row * o_row_stride + head * o_head_stride;
#pragma unroll
  for (int e = 0; e < kRowElems; ++e) o_row[col0 + e] = from_float(o_acc[e] * inv);
  if (col0 == 0)
    lse[((long long)b * heads_q + head) * seqlen_q + row] = row_sum_exp > 0.f ? row_max + logf(row_sum_exp) : -INFINITY;
}
