// FlashAttention-2 style forward for any NVIDIA GPU from sm_80: mma.sync m16n8k16 with
// ldmatrix from swizzled shared memory, K/V streamed through a cp.async ring, online
// softmax with lazy rescaling. ABI `flat` (kernel_src/README.md); launch geometry from
// search_spaces/sm80.toml: grid (ceil_div(seqlen_q, block_m), heads_q, batch).
#include "sm80/config.cuh"
#include "sm80/epilogue.cuh"
#include "sm80/mainloop.cuh"
#include "sm80/mask.cuh"
#include "sm80/pipeline.cuh"
#include "sm80/ptx.cuh"
#include "sm80/smem_layout.cuh"
#include "sm80/softmax.cuh"
#include "sm80/warp_mma.cuh"

using ft_sm80::elem_t;

extern "C" __global__ void __launch_bounds__(ft_sm80::kThreads, ft_sm80::kMinBlocksPerSm)
flashtune_fwd(const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
              elem_t* __restrict__ o, float* __restrict__ lse, int batch, int seqlen_q, int seqlen_k, int heads_q,
              int heads_kv, long long q_batch_stride, long long q_row_stride, long long q_head_stride,
              long long k_batch_stride, long long k_row_stride, long long k_head_stride, long long v_batch_stride,
              long long v_row_stride, long long v_head_stride, long long o_batch_stride, long long o_row_stride,
              long long o_head_stride, float softmax_scale) {
  using namespace ft_sm80;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp_row0 = (tid >> 5) * kWarpRows;
  // Causal: the last query blocks see the most keys; launch them first.
  const int m_block = kIsCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int m0 = m_block * kBlockM;
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int head_kv = head / (heads_q / heads_kv);

  const elem_t* q_gmem = q + b * q_batch_stride + head * q_head_stride;
  elem_t* o_gmem = o + b * o_batch_stride + head * o_head_stride;
  float* lse_gmem = lse + (static_cast<long long>(b) * heads_q + head) * seqlen_q;
  const KeyRange keys = key_range(m0, seqlen_q, seqlen_k);

  const unsigned q_tile = ptx::smem_addr(smem.q);
  KvRing ring{ptx::smem_addr(smem.k[0]),
              ptx::smem_addr(smem.v[0]),
              k + b * k_batch_stride + head_kv * k_head_stride,
              v + b * v_batch_stride + head_kv * v_head_stride,
              k_row_stride,
              v_row_stride,
              seqlen_k,
              keys.n_blocks};

  const WarpCtx ctx{q_tile,   FragAddressing(warp_row0, lane), TileCopyLane(tid), m0 + warp_row0, seqlen_q,
                    seqlen_k, lane,     softmax_scale * 1.4426950408889634f};

  load_tile_async<kBlockM>(q_tile, q_gmem, q_row_stride, m0, seqlen_q, ctx.copy);
  ptx::cp_async_commit();
  ring.prologue(ctx.copy);

  QFrags qf;
  if constexpr (kQInRegs) {
    ptx::cp_async_wait<2 * kKvStages - 1>();  // the Q group, not the ring prologue
    __syncthreads();
    load_q_frags(qf, q_tile, ctx.frags);
  }

  float acc_o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
  OnlineSoftmax softmax;
  softmax.init();

  // Tiles walk key blocks from the last one down: masked blocks (key tail, causal
  // diagonal) come first, then the unmasked steady state.
  int t = 0;
  for (; t < keys.masked_tiles(); ++t) attend_tile<true>(t, ring, ctx, qf, acc_o, softmax);
  for (; t < keys.n_blocks; ++t) attend_tile<false>(t, ring, ctx, qf, acc_o, softmax);

  ptx::cp_async_wait<0>();  // the Q tile is free (also when no key block was visited)
  __syncthreads();
  write_output(acc_o, softmax, smem.q, o_gmem, o_row_stride, lse_gmem, m0, warp_row0, seqlen_q, lane);
}
