// Compile-time configuration of the sm90 family: the ONLY header that reads FT_* macros.
//
// Every knob of search_spaces/sm90.toml gets a default here, becomes a constexpr value,
// and the space file's constraints are restated as static_asserts, so a config that the
// space file refuses also fails to compile.
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
#ifndef FT_KV_STAGES
#define FT_KV_STAGES (FT_HEAD_DIM == 64 ? 3 : 2)  // depth of the K ring and of the V ring
#endif
#ifndef FT_KV_BARRIERS
#define FT_KV_BARRIERS 2  // 2: separate full/empty barriers for K and V of a stage; 1: one pair for both
#endif
#ifndef FT_BLOCK_N
#define FT_BLOCK_N (FT_HEAD_DIM == 256 ? 80 : 128)  // keys per K/V tile (= N of the S = Q.K^T wgmma)
#endif
#ifndef FT_CONSUMER_WGS
#define FT_CONSUMER_WGS (FT_HEAD_DIM == 64 ? 3 : 2)  // consumer warpgroups, 64 query rows each
#endif
#ifndef FT_RESCALE_SLACK
#define FT_RESCALE_SLACK 8  // lazy rescale: keep a stale row max up to this many log2 units
#endif
#ifndef FT_PRODUCER_REGS
#define FT_PRODUCER_REGS (FT_HEAD_DIM == 64 ? 32 : 24)  // setmaxnreg budget of the producer warpgroup
#endif
#ifndef FT_CONSUMER_REGS
#define FT_CONSUMER_REGS (FT_HEAD_DIM == 64 ? 160 : 240)  // setmaxnreg budget of each consumer warpgroup
#endif
#ifndef FT_INTRA_WG_OVERLAP
#define FT_INTRA_WG_OVERLAP (FT_HEAD_DIM == 128 ? 1 : 2)  // 1: tile j's row max beside O += P_{j-1} V_{j-1}; 2: its exponentials too
#endif
#ifndef FT_PINGPONG
#define FT_PINGPONG 0  // consumer warpgroups take turns issuing their GEMMs (named barriers)
#endif
#ifndef FT_PV_SPLIT
#define FT_PV_SPLIT 0  // keys of P sent to O += P V before the rest of P is exponentiated (0 = off)
#endif
#ifndef FT_P_SMEM
#define FT_P_SMEM 0  // 1: P goes through shared memory and O += P V reads it there (wgmma ss, FA3's d64 tile)
#endif
#ifndef FT_CTA_MODE
#define FT_CTA_MODE 1  // 1: CTAs alone; 2: clusters of 2 CTAs along M sharing K/V by TMA multicast
#endif
#ifndef FT_POLY_EXP
#define FT_POLY_EXP 0  // of every 8 exponentials of the softmax, this many on the FMA pipe (0 = all MUFU)
#endif
#ifndef FT_PERSISTENT
#define FT_PERSISTENT (FT_HEAD_DIM == 256 ? 0 : 1)  // 1: one CTA (cluster) per SM loops over the query blocks
#endif
#ifndef FT_Q_STAGES
#define FT_Q_STAGES 2  // Q stages of a persistent CTA (a CTA per block has one); 2 also stands for "default" there
#endif
#ifndef FT_CTAS_PER_SM
#define FT_CTAS_PER_SM 1  // CTAs resident per SM: the __launch_bounds__ minimum
#endif
#ifndef FT_SCHEDULER
// persistent units: 0 static snake, 1 dynamic (atomic counter). The default is the order that reads no counter:
// a space without this knob passes none (its [launch.abi] tile_counter is 0); search_spaces/sm90.toml picks 1.
#define FT_SCHEDULER 0
#endif
#ifndef FT_KV_SPLITS
#define FT_KV_SPLITS 1  // CTAs (units) sharing one query block's key blocks, merged by LSE weights (1 = no split)
#endif
#ifndef FT_UNIT_ORDER
// causal units: 0 one (batch, head) after another, longest query block first within each; 1 sections of (batch,
// head)s, longest query block first across a section; 2 the same for the last section only (tile_scheduler.cuh)
#define FT_UNIT_ORDER 0
#endif
#ifndef FT_TAIL_SPLITS
#define FT_TAIL_SPLITS 1  // persistent: key ranges per tile of the last, partly filled wave (at most; 1 = no split)
#endif

// ---- device limits -----------------------------------------------------------------------
// The tuner passes the limits of the device it builds for (tuner/devices.py, DeviceLimits.macros):
// the values the space file's constraints were checked against. The defaults, H100/H200's (the
// only sm_90 parts), serve a build by hand.
#ifndef FT_SMEM_PER_BLOCK_OPTIN
#define FT_SMEM_PER_BLOCK_OPTIN 232448  // opt-in shared memory per block
#endif
#ifndef FT_SMEM_PER_SM
#define FT_SMEM_PER_SM 233472  // shared memory per SM, shared by its resident CTAs
#endif
#ifndef FT_SMEM_RESERVED_PER_BLOCK
#define FT_SMEM_RESERVED_PER_BLOCK 1024  // reserved by the system for every resident CTA
#endif
#ifndef FT_REGS_PER_SM
#define FT_REGS_PER_SM 65536  // 32-bit registers per SM
#endif

// ---- derived -------------------------------------------------------------------------
#ifndef FT_SMEM_BYTES
#define FT_SMEM_BYTES \
  ((64 * FT_CONSUMER_WGS * (FT_PERSISTENT ? FT_Q_STAGES : 1) + 2 * FT_KV_STAGES * FT_BLOCK_N) * FT_HEAD_DIM * 2 + 1024 + 256)
#endif

namespace ft_sm90 {

#if FT_IS_BF16
using elem_t = __nv_bfloat16;
#else
using elem_t = __half;
#endif

constexpr bool kIsBf16 = FT_IS_BF16 != 0;
constexpr bool kIsCausal = FT_IS_CAUSAL != 0;
constexpr int kHeadDim = FT_HEAD_DIM;

constexpr int kKvStages = FT_KV_STAGES;
constexpr bool kSplitKvBarriers = FT_KV_BARRIERS == 2;
constexpr int kBlockN = FT_BLOCK_N;
constexpr int kConsumerWgs = FT_CONSUMER_WGS;
constexpr float kRescaleSlack = static_cast<float>(FT_RESCALE_SLACK);
constexpr int kProducerRegs = FT_PRODUCER_REGS;
constexpr int kConsumerRegs = FT_CONSUMER_REGS;
constexpr bool kIntraWgOverlap = FT_INTRA_WG_OVERLAP != 0;
constexpr bool kExpOverlap = FT_INTRA_WG_OVERLAP == 2;  // exponentials beside the P.V
constexpr bool kPingPong = FT_PINGPONG != 0;
constexpr int kPvSplit = FT_PV_SPLIT;
constexpr bool kPSmem = FT_P_SMEM != 0;
constexpr int kClusterCtas = FT_CTA_MODE;
constexpr bool kPersistent = FT_PERSISTENT != 0;
constexpr int kCtasPerSm = FT_CTAS_PER_SM;
constexpr bool kDynamicScheduler = FT_SCHEDULER == 1;
constexpr int kPolyExp = FT_POLY_EXP;
constexpr int kKvSplits = FT_KV_SPLITS;
constexpr int kTailSplits = FT_TAIL_SPLITS;
constexpr int kUnitOrder = FT_UNIT_ORDER;
constexpr int kSectionWaves = 2;  // FT_UNIT_ORDER > 0: waves of units (of the CTAs that run at once) per section, at least
// Do units compute part of a tile's key blocks (then partials are merged: epilogue.cuh)? Split-KV always, the
// tail split for the tiles of the last partial wave (the split count is the scheduler's, at run time).
constexpr bool kSplitKeys = kKvSplits > 1 || kTailSplits > 1;
constexpr int kSmemBytes = FT_SMEM_BYTES;

constexpr int kWgRows = 64;                          // query rows per consumer warpgroup (wgmma M)
constexpr int kBlockM = kWgRows * kConsumerWgs;      // query rows per CTA
constexpr int kThreads = 128 * (kConsumerWgs + 1);   // one producer warpgroup + the consumers
constexpr int kPanelCols = 64;                       // 16-bit columns per 128-byte swizzle row
constexpr int kPanels = kHeadDim / kPanelCols;       // TMA boxes (and smem panels) per tile
constexpr int kKvBoxRows = kBlockN / kClusterCtas;  // K/V rows each CTA of a cluster loads (and multicasts)
// Q stages: with two, a persistent CTA loads the next work unit's Q into the other one while a unit
// computes; with one, once the unit's O store has read the stage. The O of a unit is staged in its Q
// stage (each consumer warpgroup in its own rows).
constexpr int kQStages = kPersistent ? FT_Q_STAGES : 1;
constexpr int kSmemOptin = FT_SMEM_PER_BLOCK_OPTIN;
constexpr int kSmemPerSm = FT_SMEM_PER_SM;
constexpr int kSmemReservedPerBlock = FT_SMEM_RESERVED_PER_BLOCK;
constexpr int kRegsPerSm = FT_REGS_PER_SM;
// Registers per thread at kernel entry: the __launch_bounds__(kThreads, kCtasPerSm) cap, in units of 8.
constexpr int kEntryRegs =
    (kRegsPerSm / (kThreads * kCtasPerSm) < 256 ? kRegsPerSm / (kThreads * kCtasPerSm) : 256) / 8 * 8;

// ---- constraints (the space file's, restated) ------------------------------------------
static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim must be 64, 128 or 256");
static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256,
              "block_n: wgmma N and the P.V k-steps need a multiple of 16 in [16, 256]");
static_assert(kConsumerWgs >= 1 && kConsumerWgs <= 3, "1 to 3 consumer warpgroups");
static_assert(kKvStages >= 2 && kKvStages <= 4, "kv_stages in [2, 4]");
static_assert(FT_KV_BARRIERS == 1 || FT_KV_BARRIERS == 2, "kv_barriers: 1 (K and V together) or 2 (apart)");
static_assert(FT_RESCALE_SLACK >= 0 && FT_RESCALE_SLACK <= 8,
              "rescale_slack in [0, 8]: P <= 2^slack must stay far below the 16-bit maximum");
static_assert(kProducerRegs % 8 == 0 && kProducerRegs >= 24 && kProducerRegs <= 256, "producer_regs");
static_assert(kConsumerRegs % 8 == 0 && kConsumerRegs >= 24 && kConsumerRegs <= 256, "consumer_regs");
static_assert(kProducerRegs <= kEntryRegs && kConsumerRegs >= kEntryRegs,
              "setmaxnreg: the producer gives registers away, the consumers take them");
static_assert(kProducerRegs + kConsumerWgs * kConsumerRegs <= (kConsumerWgs + 1) * kEntryRegs,
              "setmaxnreg budgets exceed the registers the CTA is launched with");
static_assert(!kPingPong || kConsumerWgs >= 2, "ping-pong needs at least two consumer warpgroups");
static_assert(kPvSplit % 16 == 0 && kPvSplit >= 0 && kPvSplit < kBlockN,
              "pv_split: 0 or a multiple of 16 below block_n (whole k-steps of O += P V in each part)");
static_assert(kPvSplit == 0 || !kIntraWgOverlap,
              "pv_split splits the serial loop's P.V; the overlapped loop already hides the softmax behind it");
static_assert(FT_INTRA_WG_OVERLAP >= 0 && FT_INTRA_WG_OVERLAP <= 2, "intra_wg_overlap: 0 (serial), 1 or 2");
static_assert(FT_P_SMEM == 0 || FT_P_SMEM == 1, "p_smem: 0 or 1");
static_assert(!kPSmem || kPvSplit == 0, "p_smem writes all of P before O += P V reads it, so pv_split cannot split that GEMM: set pv_split=0 or p_smem=0");
static_assert(kClusterCtas == 1 || kClusterCtas == 2, "cta_mode: 1 or 2 CTAs per cluster");
static_assert(kPolyExp >= 0 && kPolyExp <= 8, "poly_exp: 0 to 8 of every 8 exponentials");
static_assert(kKvBoxRows % 8 == 0, "each CTA's share of a K/V tile must be whole 8-row swizzle atoms");
static_assert(kSmemBytes <= kSmemOptin,
              "shared memory per CTA exceeds the device's opt-in limit FT_SMEM_PER_BLOCK_OPTIN (smem_fits)");
static_assert(kCtasPerSm == 1 || kCtasPerSm == 2, "ctas_per_sm: 1 or 2");
static_assert(kCtasPerSm * (kSmemBytes + kSmemReservedPerBlock) <= kSmemPerSm,
              "ctas_per_sm CTAs do not fit the SM's shared memory FT_SMEM_PER_SM (smem_per_sm_fits)");
static_assert(FT_Q_STAGES == 1 || FT_Q_STAGES == 2, "q_stages: 1 or 2");
static_assert(kPersistent || FT_Q_STAGES == 2,
              "q_stages=1 sets the Q stages of a persistent CTA; a CTA per block has one anyway: set q_stages=2 or persistent=1");
static_assert(FT_SCHEDULER == 0 || FT_SCHEDULER == 1, "scheduler: 0 (static snake) or 1 (dynamic)");
static_assert(kUnitOrder >= 0 && kUnitOrder <= 2, "unit_order: 0 (heads one after another), 1 (sections), 2 (last)");
static_assert(kUnitOrder == 0 || kIsCausal, "unit_order > 0 orders causal units by length; set unit_order=0");
static_assert(kUnitOrder == 0 || kTailSplits == 1, "unit_order > 0 does not number the tail split's tiles");
static_assert(!kDynamicScheduler || kPersistent, "scheduler=1 (dynamic) orders the units of persistent CTAs");
static_assert(!kDynamicScheduler || kClusterCtas == 1,
              "scheduler=1 (dynamic) needs cta_mode=1: a cluster would have to share each fetched unit over DSMEM");
static_assert(kKvSplits >= 1 && kKvSplits <= 8, "kv_splits: 1 (no split) to 8 key ranges per query block");
static_assert(kTailSplits >= 1 && kTailSplits <= 4, "tail_splits: 1 (no split) to 4 key ranges per tile of the last wave");
static_assert(kTailSplits == 1 || kPersistent,
              "tail_splits > 1 splits the last wave of persistent CTAs: set persistent=1 or tail_splits=1");
static_assert(kTailSplits == 1 || kKvSplits == 1,
              "kv_splits and tail_splits are alternatives (split every tile, or the last wave's): set one of them to 1");

}  // namespace ft_sm90
