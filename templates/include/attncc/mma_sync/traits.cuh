// attncc/mma_sync/traits.cuh: the mma.sync family's view of its plan.
//
// Every number here was chosen by the lowering (attncc/families/mma_sync.py) and arrives as a
// named constexpr of the generated Config; this header only names the types they define and
// static_asserts that the choices are legal for the kernel as written.
#pragma once

#include "attncc/core/common.cuh"
#include "attncc/core/copy.cuh"
#include "attncc/core/smem.cuh"

namespace attncc {


template <class Cfg>
__host__ __device__ constexpr bool check_sources() {
  for (int i = 0; i < Cfg::kNumSources; ++i) {
    const Source s = Cfg::kSources[i];
    if (s.smem_col % 8 != 0 || !s.copies_fit()) return false;
    if (s.data_bytes() % 16 != 0 || Cfg::kTokenStride[s.tensor] % 16 != 0) return false;
    if (s.smem_col + s.width > Cfg::kStagedWidth) return false;
    if (is_fp8(s.dtype) != s.has_scale()) return false;
    if (!is_fp8(s.dtype) && s.dtype != Cfg::kElem) return false;  // 16-bit runs have the elem dtype
    if (s.raw_offset % 16 != 0 || s.raw_scale_offset < s.raw_offset + s.data_bytes() || s.raw_scale_offset > Cfg::kRawPitchBytes)
      return false;
    if (s.has_scale() && (s.seg_lo % 16 != 0 || s.scale_group % 16 != 0 || s.scale_offset_bytes % 4 != 0 ||
                          s.scale_head_stride_bytes % 4 != 0 || Cfg::kTokenStride[s.scale_tensor] % 4 != 0 ||
                          s.scale_first_group != s.seg_lo / s.scale_group ||
                          s.raw_scale_offset + 4 * s.scale_count > Cfg::kRawPitchBytes))
      return false;
  }
  return true;
}

__host__ __device__ constexpr bool runs_on(const Run* runs, int n, int cols) {
  for (int i = 0; i < n; ++i)
    if (runs[i].col % cols != 0 || runs[i].width % cols != 0) return false;
  return true;
}

template <class Cfg>
struct DecodeTraits {
  static constexpr Dtype kElem = Cfg::kElem;
  using E = Elem16<kElem>;
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kTileM = Cfg::kTileM;
  static constexpr int kTileN = Cfg::kTileN;
  static constexpr int kStages = Cfg::kStages;

  // warps = WM x WN; warp (wm, wn) owns warp_rows rows, tokens_per_warp tokens of S and
  // value_cols_per_warp columns of O
  static constexpr int kWarpRows = Cfg::kWarpRows;
  static constexpr int kWarpsM = Cfg::kWarpsM;
  static constexpr int kWarpsN = Cfg::kWarpsN;
  static constexpr int kMT = Cfg::kMTiles;               // m16 tiles per warp
  static constexpr int kTokPerWarp = Cfg::kTokensPerWarp;  // S = Q K^T: tokens per warp
  static constexpr int kNTS = Cfg::kScoreNTiles;         // ... in n8 tiles
  static constexpr int kColsPerWarp = Cfg::kValueColsPerWarp;  // O += P V: value columns per warp
  static constexpr int kNTO = Cfg::kValueNTiles;         // ... in n8 tiles
  static constexpr int kAccRegs = Cfg::kAccRegisters;    // O accumulator registers per thread

  static constexpr bool kRaw = Cfg::kRawStaging;
  static constexpr bool kQKSplit = Cfg::kQKSplit;
  static constexpr int kNTQK = Cfg::kQKNTiles;   // n8 tiles of S = Q K^T per warp
  static constexpr int kQKSteps = Cfg::kQKSteps;  // k-steps per warp
  static constexpr int kQKChains = Cfg::kQKChains;
  static constexpr int kPairSlotBytes = Cfg::kPairSlotBytes;
  static constexpr bool kPingPong = Cfg::kPingPong;
  static constexpr int kCopyThreads = Cfg::kCopyThreads;
  static constexpr bool kInterleaveCopies = Cfg::kCopyInterleave;
  static constexpr int kCopySteps = Cfg::kCopySteps;

  using QRows = SmemRows<Cfg::kDK, Cfg::kQRowsPitchBytes, Cfg::kQRowsSwizzle>;
  using KVRows = SmemRows<Cfg::kStagedWidth, Cfg::kKVRowsPitchBytes, Cfg::kKVRowsSwizzle>;
  using PRows = SmemRows<kTileN, Cfg::kPRowsPitchBytes, Cfg::kPRowsSwizzle>;
  using Copy = TileCopy<Cfg, KVRows, kRaw, kCopyThreads, Cfg::kCopyTokenMajor>;
  static constexpr int kKVBuffers = Cfg::kKVBuffers;
  static constexpr int kKVTileBytes = Cfg::kKVTileBytes;
  static constexpr int kRawTileBytes = Cfg::kRawTileBytes;

  static constexpr int kQOff = Cfg::kQOff;
  static constexpr int kKVOff = Cfg::kKVOff;
  static constexpr int kRawOff = Cfg::kRawOff;
  static constexpr int kPOff = Cfg::kPOff;
  static constexpr int kSlotOff = Cfg::kSlotOff;
  static constexpr int kSlotPitch = Cfg::kSlotPitch;  // a ring entry: kTileN slots, then kHoleWords
  static constexpr int kHoleWords = Cfg::kHoleWords;
  static constexpr int kRedOff = Cfg::kRedOff;
  static constexpr int kWorkOff = Cfg::kWorkOff;  // CtaWork, then PartWalk
  static constexpr int kWalkOffset = Cfg::kWalkOff;
  static constexpr int kWholeOffset = Cfg::kWholeOff;  // ... then whether the parts hold whole sequences
  static constexpr int kWorkBytes = Cfg::kWorkBytes;
  static constexpr int kSmemBytes = Cfg::kSmemBytes;

  static constexpr int kPairBarrier0 = Cfg::kPairBarrier0;
  static constexpr int kFullBarrier0 = Cfg::kFullBarrier0;
  static constexpr int kEmptyBarrier0 = Cfg::kEmptyBarrier0;

  // ---- the checks (the lowering's choices, as the kernel needs them)
  static_assert(kElem == Dtype::kBF16 || kElem == Dtype::kFP16, "elem is bf16 or fp16");
  static_assert(Cfg::kDK % 16 == 0 && Cfg::kDV % 16 == 0, "d_k and d_v are multiples of 16");
  static_assert(runs_width(Cfg::kKeyRuns) == Cfg::kDK, "key runs add up to d_k");
  static_assert(runs_width(Cfg::kValueRuns) == Cfg::kDV, "value runs add up to d_v");
  static_assert(check_sources<Cfg>(), "source layout: 16-byte runs, fp8 scales on 16-value groups");
  static_assert(kStages >= 2, "stages >= 2");
  static_assert(Cfg::kPageSize >= 1, "page size >= 1 (sparse plans address slots directly)");
  static_assert(Cfg::kWarps == 4 || Cfg::kWarps == 8, "warps in {4, 8}");
  static_assert(kThreads == Cfg::kWarps * 32, "32 threads a warp");
  static_assert(kTileM % 16 == 0 && kTileN % 16 == 0, "tile_m and tile_n are multiples of 16");
  static_assert(kTileN <= kThreads, "one thread per token computes the slots");
  static_assert(kHoleWords * 32 >= kTileN && kSlotPitch >= kTileN + kHoleWords && kSlotPitch % 4 == 0,
                "slot ring entry: tile_n slots, then one hole word per 32 tokens, 16-byte aligned");
  static_assert(kWarpRows == 16 || kWarpRows == 32, "warp_rows in {16, 32}");
  static_assert(kWarpsM * kWarpRows == kTileM && kWarpsM * kWarpsN == Cfg::kWarps, "WM x WN warps cover the tile's rows");
  static_assert(kMT * 16 == kWarpRows && kNTS * 8 * kWarpsN == kTileN && kNTO * 8 * kWarpsN == Cfg::kDV &&
                    kTokPerWarp == kNTS * 8 && kColsPerWarp == kNTO * 8,
                "every warp's tokens and value columns in whole n8 tiles");
  static_assert(kAccRegs == kMT * kNTO * 4 && kAccRegs <= 128 && kWarpRows * kTokPerWarp / 32 <= 32,
                "accumulator <= 128 and scores <= 32 registers");
  static_assert(!kQKSplit || (kWarpsN % 2 == 0 && kWarpRows * 2 * kTokPerWarp / 32 <= 32 &&
                              runs_on(Cfg::kKeyRuns, Cfg::kNumKeyRuns, 32)),
                "qk_split: WN even, partial S <= 32 registers, key runs on multiples of 32 columns");
  static_assert(kNTQK == (kQKSplit ? 2 : 1) * kNTS && kQKSteps * (kQKSplit ? 32 : 16) == Cfg::kDK && kQKChains >= 1,
                "S = Q K^T: n-tiles and k-steps of the warp");
  static_assert(!kPingPong || (kWarpsM == 2 && kStages == 2 && !kRaw && kTileN <= kWarpsN * 32),
                "ping_pong: two row groups, two stages, 16-bit staging, tile_n <= 32 WN");
  static_assert(kCopyThreads == (kPingPong ? kWarpsN * 32 : kThreads), "ping_pong: row group 1 copies");
  static_assert(kCopySteps >= 1 && kCopySteps <= kQKSteps, "copies spread over S = Q K^T's k-steps");
  static_assert(kKVBuffers == (kRaw ? 1 : kStages) && kKVTileBytes == KVRows::bytes(kTileN) &&
                    kRawTileBytes == Cfg::kRawPitchBytes * kTileN,
                "staged tiles: one per stage (16-bit), or one dequantized per step (raw)");
  static constexpr SmemRegion kRegions[] = {
      {kQOff, QRows::bytes(kTileM)},
      {kKVOff, kKVBuffers * kKVTileBytes},
      {kRawOff, kRaw ? kStages * kRawTileBytes : 0},
      {kPOff, PRows::bytes(kTileM)},
      {kSlotOff, (kStages + 1) * kSlotPitch * 4},
      {kRedOff, kWarpsN * kTileM * 4},
      {kWorkOff, kWorkBytes},
  };
  static_assert(smem_plan_ok(kRegions, kSmemBytes), "shared-memory plan: aligned, disjoint regions inside the total");
  static_assert(kSmemBytes <= kSmemLimitBytes, "shared memory exceeds 227 KB: smaller tile_n, tile_m or stages");
  static_assert(9 * 4 <= kWalkOffset && kWalkOffset + 12 * 4 <= kWholeOffset && kWholeOffset + 4 <= kWorkBytes,
                "work stash: 9 and 12 words, then one");
  // Named barriers: 0 (__syncthreads), 1 .. WM (row groups), then one per qk_split pair, then
  // ping_pong's FULL and EMPTY pairs.
  static_assert(Cfg::kRowGroupBarrier0 == 1 && kPairBarrier0 >= 1 + kWarpsM &&
                    kFullBarrier0 >= kPairBarrier0 + (kQKSplit ? Cfg::kWarps / 2 : 0) && kEmptyBarrier0 >= kFullBarrier0 + 2 &&
                    Cfg::kBarriers >= kEmptyBarrier0 + (kPingPong ? 2 : 0) && Cfg::kBarriers <= 16,
                "named barriers: distinct ids, 16 at most");
  static_assert(!kQKSplit || kWarpsN * kPairSlotBytes <= PRows::bytes(kWarpRows), "pair_sum slots fit the row group's P rows");
};

}  // namespace attncc
