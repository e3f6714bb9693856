// The one header that reads the FT_* macros of my_fa.toml (defaults for a build by hand).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef FT_HEAD_DIM
#define FT_HEAD_DIM 128
#endif
#ifndef FT_IS_BF16
#define FT_IS_BF16 0
#endif
#ifndef FT_IS_CAUSAL
#define FT_IS_CAUSAL 0
#endif
#ifndef FT_BLOCK_M
#define FT_BLOCK_M 64
#endif
#ifndef FT_BLOCK_N
#define FT_BLOCK_N 32
#endif
#ifndef FT_THREADS_PER_ROW
#define FT_THREADS_PER_ROW 4
#endif
#ifndef FT_SMEM_BYTES
#define FT_SMEM_BYTES (2 * FT_BLOCK_N * FT_HEAD_DIM * 2)
#endif

namespace my_fa {

#if FT_IS_BF16
using elem_t = __nv_bfloat16;
#else
using elem_t = __half;
#endif

constexpr int kHeadDim = FT_HEAD_DIM;
constexpr bool kIsCausal = FT_IS_CAUSAL != 0;
constexpr int kBlockM = FT_BLOCK_M;
constexpr int kBlockN = FT_BLOCK_N;
constexpr int kThreadsPerRow = FT_THREADS_PER_ROW;
constexpr int kThreads = kBlockM * kThreadsPerRow;
constexpr int kRowElems = kHeadDim / kThreadsPerRow;  // q and o elements one thread holds

// the constraints of my_fa.toml, restated
static_assert(32 % kThreadsPerRow == 0, "the threads of a row must sit in one warp");
static_assert(kHeadDim % kThreadsPerRow == 0 && kRowElems <= 32, "registers: row_elems <= 32");
static_assert(kThreads <= 1024, "threads_fit");
static_assert(FT_SMEM_BYTES == 2 * kBlockN * kHeadDim * 2, "FT_SMEM_BYTES is one K and one V tile");

}  // namespace my_fa
