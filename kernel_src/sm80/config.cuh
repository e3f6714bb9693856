// Compile-time configuration of the sm80 family: the ONLY header that reads FT_* macros.
//
// Every knob gets a default here (`#ifndef FT_X / #define FT_X default`), becomes a
// constexpr value, and every constraint of search_spaces/sm80.toml is restated as a
// static_assert, so a config that the space file would refuse also fails to compile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- problem macros (always passed by the host) ------------------------------------
#ifndef FT_HEAD_DIM
#define FT_HEAD_DIM 128
#endif
#ifndef FT_IS_BF16
#define FT_IS_BF16 0
#endif
#ifndef FT_IS_CAUSAL
#define FT_IS_CAUSAL 0
#endif

// ---- knobs ---------------------------------------------------------------------------
#ifndef FT_BLOCK_M
#define FT_BLOCK_M 128  // query rows per CTA
#endif
#ifndef FT_BLOCK_N
#define FT_BLOCK_N 64  // keys per K/V tile
#endif
#ifndef FT_NUM_WARPS
#define FT_NUM_WARPS 4  // warps per CTA, all stacked along M
#endif
#ifndef FT_KV_STAGES
#define FT_KV_STAGES 2  // depth of the K ring and of the V ring (1 = no prefetch)
#endif
#ifndef FT_RESCALE_SLACK
#define FT_RESCALE_SLACK 8  // lazy-rescale threshold, log2 units (0 = rescale every tile)
#endif
#ifndef FT_PV_SPLIT
#define FT_PV_SPLIT 0  // keys in the first P.V chunk (0 = one chunk)
#endif
#ifndef FT_Q_IN_REGS
#define FT_Q_IN_REGS 0  // 1: Q fragments loaded once into registers; 0: re-read from smem
#endif
#ifndef FT_MIN_BLOCKS_PER_SM
#define FT_MIN_BLOCKS_PER_SM 1  // second __launch_bounds__ argument (register budget)
#endif

// ---- device limits -----------------------------------------------------------------------
// The tuner passes the limits of the device it builds for (tuner/devices.py, DeviceLimits.macros):
// the values the space file's constraints were checked against. The defaults serve a build by
// hand: the opt-in shared memory of the arch being compiled (tuner/devices.py's table; a test
// keeps the two equal), and in the host pass, which has no arch, the largest of them.
#ifndef FT_SMEM_PER_BLOCK_OPTIN
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000 || __CUDA_ARCH__ == 1030
#define FT_SMEM_PER_BLOCK_OPTIN 232448
#elif __CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870
#define FT_SMEM_PER_BLOCK_OPTIN 166912
#else
#define FT_SMEM_PER_BLOCK_OPTIN 101376
#endif
#endif
#ifndef FT_REGS_PER_SM
#define FT_REGS_PER_SM 65536  // 32-bit registers per SM
#endif
#ifndef FT_MAX_REGS_PER_THREAD
#define FT_MAX_REGS_PER_THREAD 255  // registers one thread may use
#endif

// ---- derived -------------------------------------------------------------------------
#ifndef FT_SMEM_BYTES
#define FT_SMEM_BYTES ((FT_BLOCK_M + 2 * FT_KV_STAGES * FT_BLOCK_N) * FT_HEAD_DIM * 2)
#endif

namespace ft_sm80 {

#if FT_IS_BF16
using elem_t = __nv_bfloat16;
#else
using elem_t = __half;
#endif

constexpr bool kIsBf16 = FT_IS_BF16 != 0;
constexpr bool kIsCausal = FT_IS_CAUSAL != 0;
constexpr int kHeadDim = FT_HEAD_DIM;

constexpr int kBlockM = FT_BLOCK_M;
constexpr int kBlockN = FT_BLOCK_N;
constexpr int kNumWarps = FT_NUM_WARPS;
constexpr int kKvStages = FT_KV_STAGES;
constexpr float kRescaleSlack = static_cast<float>(FT_RESCALE_SLACK);
constexpr int kPvSplit = FT_PV_SPLIT;
constexpr bool kQInRegs = FT_Q_IN_REGS != 0;
constexpr int kMinBlocksPerSm = FT_MIN_BLOCKS_PER_SM;
constexpr int kSmemBytes = FT_SMEM_BYTES;
constexpr int kSmemPerBlockOptin = FT_SMEM_PER_BLOCK_OPTIN;
constexpr int kRegsPerSm = FT_REGS_PER_SM;
constexpr int kMaxRegsPerThread = FT_MAX_REGS_PER_THREAD;

constexpr int kThreads = kNumWarps * 32;
constexpr int kWarpRows = kBlockM / kNumWarps;  // query rows owned by one warp
constexpr int kMTiles = kWarpRows / 16;          // m16 tiles per warp
constexpr int kNTiles = kBlockN / 8;             // n8 tiles of S per warp
constexpr int kDTiles = kHeadDim / 8;            // n8 tiles of O per warp
constexpr int kChunksPerRow = kHeadDim / 8;      // 16-byte chunks in one smem row

// Register estimate of the space file (`reg_estimate`), per thread: per m-tile the S
// accumulator (block_n / 2 floats), packed P (block_n / 4) and the O accumulator
// (head_dim / 2); Q fragments when kept in registers (head_dim / 4 per m-tile, + 8); a fixed
// overhead of 24, + 24 with a one-stage ring (its constant smem addresses get hoisted),
// + 16 with three stages, + 8 beyond two m-tiles, + 32 when compiled for sm_100 or newer (ptxas
// there needs up to 24 more than the sm_90 fit). Fitted to ptxas for sm_80, sm_90 and sm_100.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kArchRegs = 32;
#else
constexpr int kArchRegs = 0;  // sm_80 to sm_90, and the host pass (which builds no kernel)
#endif
constexpr int kRegEstimate = kMTiles * (kBlockN * 3 / 4 + kHeadDim / 2) + (kQInRegs ? kMTiles * kHeadDim / 4 + 8 : 0) +
                             24 + (kKvStages == 1 ? 24 : kKvStages == 3 ? 16 : 0) + (kMTiles > 2 ? 8 : 0) + kArchRegs;
constexpr int kRegBudgetRaw = kRegsPerSm / (kThreads * kMinBlocksPerSm) / 8 * 8;
constexpr int kRegBudget = kRegBudgetRaw < kMaxRegsPerThread ? kRegBudgetRaw : kMaxRegsPerThread;
// A cap below the per-thread maximum needs 8 registers of headroom (ptxas spilled at estimate == cap).
constexpr int kRegLimit = kRegBudget >= kMaxRegsPerThread ? kRegBudget : kRegBudget - 8;

// ---- constraints (mirror [constraints.*] in search_spaces/sm80.toml) ------------------
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim must be 64 or 128");
static_assert(kNumWarps == 4 || kNumWarps == 8, "num_warps must be 4 or 8");
static_assert(kBlockM % (16 * kNumWarps) == 0, "block_m must be a multiple of 16 * num_warps (whole m16 tiles per warp)");
static_assert(kBlockN % 16 == 0 && kBlockN >= 32, "block_n must be a multiple of 16, at least 32");
static_assert(kKvStages >= 1 && kKvStages <= 4, "kv_stages must be in 1..4");
static_assert(FT_RESCALE_SLACK >= 0 && FT_RESCALE_SLACK <= 8,
              "rescale_slack must be in 0..8 so that P = exp2(<= slack) stays far below the 16-bit maximum");
static_assert(kPvSplit % 16 == 0 && kPvSplit >= 0 && kPvSplit < kBlockN,
              "pv_split must be a multiple of 16 below block_n (0 = no split)");
static_assert(kMinBlocksPerSm >= 1 && kMinBlocksPerSm <= 4, "min_blocks_per_sm must be in 1..4");
static_assert((kBlockM * kChunksPerRow) % kThreads == 0 && (kBlockN * kChunksPerRow) % kThreads == 0,
              "every thread must copy the same number of 16-byte chunks of a Q or K/V tile");
static_assert((kWarpRows * kChunksPerRow) % 32 == 0, "epilogue copies whole warps of 16-byte chunks");
static_assert(kSmemBytes == (kBlockM + 2 * kKvStages * kBlockN) * kHeadDim * 2,
              "FT_SMEM_BYTES must equal (block_m + 2 * kv_stages * block_n) * head_dim * 2");
static_assert(kRegEstimate <= kRegLimit,
              "register estimate exceeds the budget regs_per_sm / (threads * min_blocks_per_sm) (capped at "
              "max_regs_per_thread, less 8 headroom below the cap): it would spill (regs_fit)");
static_assert(kSmemBytes <= kSmemPerBlockOptin,
              "shared memory per CTA exceeds the device's opt-in limit FT_SMEM_PER_BLOCK_OPTIN (smem_fits)");

}  // namespace ft_sm80
