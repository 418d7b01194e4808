// attncc/hopper/produce.cuh: the producer warp group of the Hopper family: KV tiles from the
// paged cache into 128B-swizzled boxes of a stage, by TMA where the plan's page size allows it
// (kTmaRows > 0: TmaTile, below) and by cp.async for any page size and any tile TMA cannot take.
//
// TMA: a tile whose tokens are all inside the CTA's view, in pages with valid numbers, is
// copied by lane 0 of the producer's warps, a copy a box and page (TmaTile::copy_boxes says
// which warp issues which); each issuer's arrival on a box's FULL expects its copy's bytes and
// counts for its share of the 128 producer threads (FULL counts 128, a cp.async tile's
// arrivals), and thread 0 alone writes the tile's flags. Its page numbers are read a step ahead
// (kernel.cuh: produce).
// cp.async:
// Producer thread p (0..127) copies 16-byte chunk p % 8 of every box for the tokens
// p / 8 + 16 k, k < tile_n / 16. Its tokens are fixed for the whole tile, so it turns each into
// a slot (page table, paging.cuh) and a byte offset in every cache tensor once per tile, and a
// chunk of a box then costs one add and its cp.async (the cooperative page-address computation
// of the GLA paper, with no exchange: each thread computes only what it copies). A token without
// a slot (past the CTA's view, a bad page number, a sparse -1 or out-of-range index) is
// zero-filled and flagged for the consumers. A sparse plan's slots are its query token's indices
// (paging.cuh), read the same way.
// fp8 runs (no TMA): the same threads and tokens; every box pair (128 values a token) of a group
// of boxes, raw bytes and scales, by cp.async into the stage itself, one wait a group, then each
// pair dequantized (core/dequant.cuh) in place: see TileTokens::copy_boxes, load_pair and
// convert_pair. The conversion is the producer's own work, pipelined against the consumers'
// products by the stages.
//
// crossover (kCrossover: a 2-CTA cluster, cluster.cuh): the CTAs of a cluster take row blocks
// 2i and 2i + 1 of one kv head, so they read the same tokens. Each producer still finds every
// token's validity (the flags), but fills every box only for its half of the tile's tokens (each
// thread's tokens taken in a rotated order, TileTokens::row, so that its first kTok / 2 are its
// CTA's half: rank 0 rows [0, 32), rank 1 rows [32, 64), 4 KB contiguous in each box): fp8 runs
// converted, 16-bit runs by cp.async, as without crossover. Every 16-byte chunk a thread stores
// (a converted one) or has landed (a 16-bit one) it also stores into the same place of the
// peer's box by st.async (DSMEM), counted as transaction bytes on the peer's FULL of the box
// (convert_pair, share_group). So every fp8 value is converted once per cluster. A producer
// writes a stage's group only when both CTAs' consumers have released it: each consumer warp
// arrives on its own EMPTY and on the peer's (tile.cuh: release_stage), so one EMPTY wait covers
// both, as FlashMLA's consumers release both CTAs' buffers. A FULL completes with the own
// producer's 128 arrivals (thread 0's expecting the half box the peer stores) and those bytes. The
// producer fences what it stored or landed before its arrivals; the consumers do not fence a
// crossover box (the peer's st.async bytes complete the FULL's transactions). Every remote
// arrival and wait is at CTA scope (release / acquire, the defaults): the cluster-scope forms
// cost a GPU-wide memory barrier an arrival and an L1 invalidation a wait, 0.87 of the time
// without them (bench/RESULTS.md, session 33).
// (A bulk copy a box by thread 0 once the producer had stored the group, at a named barrier,
// measured 1.12 of the time without crossover: bench/RESULTS.md, session 22.)
//
// Per stage the producer, for tile i:
//   writes the tile's flags (a byte per token: no slot; a word per producer warp: any), then
//   arrives FLAGS[stage] (release: the consumers' wait acquires them);
//   per box, in the stage's order (traits.cuh): its cp.async, then cp.async.mbarrier.arrive on
//   FULL[stage][box], which completes when the copies of every producer thread have landed (where
//   the consumers fence the box, only on the last fenced box of its group: traits.cuh, fenced_full).
// Where a box's writer cannot fence its stores to the async proxy (wgmma) before FULL counts them
// (a cp.async plan's 16-bit boxes), the consumers do after their FULL wait (traits.cuh:
// consumer_fences); the producer fences the fp8 boxes it converts, a crossover plan's boxes it
// shares, a TMA plan's rare cp.async tiles once they have landed, and, where the plan chose
// producer_fences, a cp.async plan's 16-bit boxes: issued ahead like fp8 groups, waited for a
// group at a time, fenced once, then FULL (TileTokens::lands_16bit).
#pragma once

#include <type_traits>

#include "attncc/abi.h"
#include "attncc/core/copy.cuh"
#include "attncc/core/dequant.cuh"
#include "attncc/core/paging.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/trace.cuh"
#include "attncc/hopper/barrier.cuh"
#include "attncc/hopper/cluster.cuh"
#include "attncc/hopper/tma.cuh"
#include "attncc/hopper/traits.cuh"
#include "attncc/hopper/wgmma.cuh"

namespace attncc {
namespace hopper {

// The 128-byte line at base + off into L2 (the sum formed in the instruction's own register, as
// cp_async_16_at's).
__device__ __forceinline__ void prefetch_l2_at(const char* base, long long off) {
  asm volatile("{\n.reg .u64 a;\nadd.s64 a, %0, %1;\nprefetch.global.L2 [a];\n}\n" ::"l"(base), "l"(off));
}

// cp.async of 16 bytes from base + off + kImm (zero-filled when !valid), the sum formed in the
// instruction's own register and its immediate: the compiler cannot hoist a tile's 64-bit
// addresses (a box's worth of them) out of the copy sequence into the producer's few registers,
// and a run's boxes share one base (each box's place in the run an immediate).
template <int kImm = 0>
__device__ __forceinline__ void cp_async_16_at(uint32_t dst, const char* base, long long off, bool valid) {
  asm volatile(
      "{\n.reg .u64 a;\nadd.s64 a, %1, %2;\ncp.async.cg.shared.global [%0], [a+%4], 16, %3;\n}\n" ::"r"(dst), "l"(base), "l"(off),
      "r"(valid ? 16 : 0), "n"(kImm)
      : "memory");
}

// cp.async of 8 bytes from base + off (zero-filled when !valid), as cp_async_16_at.
__device__ __forceinline__ void cp_async_8_at(uint32_t dst, const char* base, long long off, bool valid) {
  asm volatile(
      "{\n.reg .u64 a;\nadd.s64 a, %1, %2;\ncp.async.ca.shared.global [%0], [a], 8, %3;\n}\n" ::"r"(dst), "l"(base), "l"(off),
      "r"(valid ? 8 : 0)
      : "memory");
}

// A 16-byte chunk at base + off by copies of kBytes (Source::copy_bytes): one, or two 8-byte
// halves where the run is only 8-byte aligned (an fp8 run's kv head copies 8 mod 16 apart).
template <int kBytes>
__device__ __forceinline__ void cp_async_chunk_at(uint32_t dst, const char* base, long long off, bool valid) {
  static_assert(kBytes == 16 || kBytes == 8, "a chunk is copied whole or in halves");
  if constexpr (kBytes == 16) {
    cp_async_16_at(dst, base, off, valid);
  } else {
    cp_async_8_at(dst, base, off, valid);
    cp_async_8_at(dst + 8, base + 8, off, valid);
  }
}

// cp.async of the 4 bytes (an fp32 scale) at base + off, zero when !valid.
__device__ __forceinline__ void cp_async_4_at(uint32_t dst, const char* base, long long off, bool valid) {
  asm volatile(
      "{\n.reg .u64 a;\nadd.s64 a, %1, %2;\ncp.async.ca.shared.global [%0], [a], 4, %3;\n}\n" ::"r"(dst), "l"(base), "l"(off),
      "r"(valid ? 4 : 0)
      : "memory");
}

// pick ? a : b, by one selp: a chain of selects among an array's elements by a lane's index the
// compiler may fold into an indexed load, which puts the array on the stack.
__device__ __forceinline__ long long select_s64(bool pick, long long a, long long b) {
  long long r;
  asm("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\nselp.b64 %0, %2, %3, p;\n}\n" : "=l"(r) : "r"(static_cast<int>(pick)), "l"(a), "l"(b));
  return r;
}
__device__ __forceinline__ int select_s32(bool pick, int a, int b) {
  int r;
  asm("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\nselp.b32 %0, %2, %3, p;\n}\n" : "=r"(r) : "r"(static_cast<int>(pick)), "r"(a), "r"(b));
  return r;
}

template <class Cfg>
struct TileTokens {
  static constexpr int kTok = Cfg::kTileN / 16;  // tokens per producer thread
  // of them the ones whose fp8 runs it converts: all, or (crossover) its CTA's half
  static constexpr int kMine = Cfg::kCrossover ? kTok / 2 : kTok;
  long long off[kMine][Cfg::kNumTensors];        // byte offset of the token in each cache tensor
  bool valid[kTok];
  int shift;      // crossover: the rows of this CTA's half (0 or kMine * 16), where each thread starts
  uint32_t peer;  // ... and the peer CTA's shared::cluster address of this CTA's shared-memory base

  // The tile row of this thread's token k: rows p / 8 + 16 k, rotated by `shift` (crossover), so
  // that tokens [0, kMine) are the ones this CTA converts.
  __device__ __forceinline__ int row(int p, int k) const { return row_from(p, k, shift); }
  __device__ __forceinline__ static int row_from(int p, int k, int shift) {
    if constexpr (Cfg::kCrossover) {
      return (p / 8 + 16 * k + shift) % Cfg::kTileN;
    } else {
      return p / 8 + 16 * k;
    }
  }

  // The slots of tile `tile` (relative to position 0 of the sequence) for producer thread p (the
  // offsets of its first kMine tokens, the validity of all), and, for fp8 runs, each of its first
  // kMine tokens' lines prefetched into L2 (prefetch_fp8).
  __device__ __forceinline__ void load(const AttnccArgs& a, const SlotSource& ss, int tile, int p, int head, uint32_t sbase) {
    int raw[kTok];
    fetch_raw(ss, tile, p, raw);
    resolve(a, raw, tile, p, head, sbase);
  }

  // crossover: the rotation of this CTA's rows (row's `shift`): rank r starts at row r * kMine * 16.
  __device__ __forceinline__ static int rotation() { return Cfg::kCrossover ? cluster_rank() * kMine * 16 : 0; }

  // The raw slots (page numbers or indices) of tile `tile`'s tokens of producer thread p, in
  // row's order: with the plan's kSlotsAhead their loads are issued a tile ahead of resolve
  // (kernel.cuh: produce), in flight while the producer fills the tile before.
  __device__ __forceinline__ static void fetch_raw(const SlotSource& ss, int tile, int p, int (&raw)[kTok]) {
    const int shift = rotation();
#pragma unroll
    for (int k = 0; k < kTok; ++k) raw[k] = load_slot_raw<Cfg>(ss, tile * Cfg::kTileN + row_from(p, k, shift));
  }

  // ... and from them the slots (load's second half).
  __device__ __forceinline__ void resolve(const AttnccArgs& a, const int (&raw)[kTok], int tile, int p, int head, uint32_t sbase) {
    shift = rotation();
    peer = Cfg::kCrossover ? peer_base(sbase) : 0;
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      const int slot = slot_from_raw<Cfg>(a, raw[k], tile * Cfg::kTileN + row(p, k));
      valid[k] = slot >= 0;
      if (k < kMine) {
        static_for<Cfg::kNumTensors>([&](auto ti) { off[k][decltype(ti)::value] = token_offset<Cfg, decltype(ti)::value>(a, max(slot, 0)); });
      }
    }
    // (the kernels of a contiguous cache only: at any strides the offsets' arithmetic leaves the
    // producer too few registers, 2-40 bytes spilled)
    if constexpr (has_fp8<Cfg>() && contiguous_cache<Cfg>::value) {
#pragma unroll
      for (int j = 0; j < kMine; ++j) prefetch_fp8(a, head, p, j);
    }
  }

  // fp8 runs: the 128-byte lines of each run of token j (< kMine) into L2 (thread p takes line
  // p % 8 of every 8), as soon as its slot is known and before the producer waits for the stage,
  // so that the copies of the box pairs (load_pair, after the wait) find them in L2 rather than
  // HBM: the whole tile is in flight at once. (Measured with the pairs loaded into registers one
  // after another; H200, same-process A/B, outputs bitwise equal: fp8 MLA h_q 128 b=128 s_k 8192
  // 0.953 of the time without at s_q 2, 0.952 at s_q 1; the sparse example 0.963 / 0.966; one
  // bulk prefetch a token, cp.async.bulk.prefetch.L2, 0.997; bench/RESULTS.md, session 18.)
  __device__ __forceinline__ void prefetch_fp8(const AttnccArgs& a, int head, int p, int j) const {
    static_for<Cfg::kNumSources>([&](auto si) {
      constexpr int I = decltype(si)::value;
      constexpr Source src = Cfg::kSources[I];
      if constexpr (is_fp8(src.dtype)) {
        constexpr int kLines = src.width / 128;  // whole box pairs: 128 bytes each
        static_for<(kLines + 7) / 8>([&](auto li) {
          const int line = p % 8 + 8 * decltype(li)::value;
          if ((kLines % 8 == 0 || line < kLines) && valid[j]) prefetch_l2_at(run_base<Cfg, I>(a, head) + line * 128, off[j][src.tensor]);
        });
      }
    });
  }

  // The tile's flags in `flags` (tile_n bytes, then a word per producer warp), and each thread's
  // arrival on FLAGS. Whole warps.
  __device__ __forceinline__ void write_flags(unsigned char* flags, uint32_t flags_bar, int p) const {
    bool any = false;
    if (p % 8 == 0) {
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
        flags[row(p, k)] = valid[k] ? 0 : 1;
        any = any || !valid[k];
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, any);
    if (p % 32 == 0) reinterpret_cast<int*>(flags + Cfg::kTileN)[p / 32] = static_cast<int>(ballot);
    mbarrier_arrive(flags_bar);
  }

  // Boxes [kFrom, kTo) of stage `stage`: this thread's copies of each, then its arrival on the
  // box's FULL. 16-bit boxes: their cp.async, the arrival counted when they land. fp8 box pairs
  // (128 values a token): the raw bytes of every pair of the group by cp.async into the pair's
  // second box (token row r's 128 bytes at byte 128 r) and their scales into its first
  // (load_pair), so that the group's loads wait for memory once and hold no registers; then each
  // pair converted in place (convert_pair). (Tiles with fp8 runs, crossover's among them, go by
  // issue_boxes and convert_boxes' parts instead: fill_stage.)
  template <int kFrom, int kTo>
  __device__ __forceinline__ void copy_boxes(const AttnccArgs& a, uint32_t sbase, int stage, int head, int p) const {
    issue_boxes<kFrom, kTo>(a, sbase, stage, head, p);
    convert_boxes<kFrom, kTo, 0>(sbase, stage, p);
  }

  // copy_boxes' copies: the 16-bit boxes' (and their arrivals), the fp8 pairs' raw bytes and
  // scales as one cp.async group.
  template <int kFrom, int kTo>
  __device__ __forceinline__ void issue_boxes(const AttnccArgs& a, uint32_t sbase, int stage, int head, int p) const {
    using T = HopperTraits<Cfg>;
    static_for<kTo - kFrom>([&](auto i) {
      constexpr int box = kFrom + decltype(i)::value;
      constexpr int I = box_source<Cfg>(box);
      constexpr Source src = Cfg::kSources[I];
      if constexpr (!is_fp8(src.dtype)) {
        const char* base = run_base<Cfg, I>(a, head) + (p % 8) * 16;  // the run's, shared by its boxes
        constexpr int kBoxBytes = (box * kBoxCols - src.smem_col) * 2;  // the box's place in the run
        const uint32_t dst = T::stage_box(sbase, stage, box);
#pragma unroll
        for (int k = 0; k < kMine; ++k) cp_async_16_at<kBoxBytes>(dst + sw128(row(p, k), p % 8), base, off[k][src.tensor], valid[k]);
        if constexpr (fenced_full<Cfg>(box)) cp_async_arrive(T::full(sbase, stage, box));
      }
    });
    if constexpr (Cfg::kProducerFences && Cfg::kTmaRows > 0) {  // a TMA plan's cp.async tile: landed, fenced, then FULL
      static_assert(!has_fp8<Cfg>(), "TMA plans have no fp8 runs");
      cp_async_commit();
      cp_async_wait<0>();
      fence_async_shared();
      static_for<kTo - kFrom>([&](auto i) { mbarrier_arrive(T::full(sbase, stage, kFrom + decltype(i)::value)); });
    }
    if constexpr (has_fp8_box(kFrom, kTo)) {
      for_each_fp8_run<kFrom, kTo>([&](auto run, int b) { load_pair<decltype(run)::value>(a, sbase, stage, head, p, b); });
    }
    if constexpr (lands_some(kFrom, kTo)) cp_async_commit();  // the group convert_boxes waits for
  }

  // ... and their conversion, once this thread's group has landed (kNewer: the cp.async groups it
  // committed since, left in flight).
  template <int kFrom, int kTo, int kNewer>
  __device__ __forceinline__ void convert_boxes(uint32_t sbase, int stage, int p) const {
    wait_boxes<kFrom, kTo, kNewer>();
    convert_landed<kFrom, kTo>(sbase, stage, p);
  }
  template <int kFrom, int kTo, int kNewer>
  __device__ __forceinline__ static void wait_boxes() {
    if constexpr (lands_some(kFrom, kTo)) cp_async_wait<kNewer>();  // this thread's raw chunks, scales, 16-bit chunks
    if constexpr (has_fp8_box(kFrom, kTo)) __syncwarp();  // ... and its quarter warp's (one_scale_a_pair: one thread's scale, 8 readers)
  }
  // kGroupFence (hopper.py): the group's pairs are converted first, then fenced once and their
  // FULLs arrived on (a fence is a MEMBAR.ALL.CTA: one a group, not one a pair); else (crossover,
  // whose pairs' peer stores count on their FULLs, and the seesaw's 72-register producer) a pair
  // at a time, in convert_pair.
  // A cp.async plan's 16-bit boxes that the producer lands itself (producer_fences) go the same
  // way, with nothing to convert: fenced with the group, then their FULLs.
  template <int kFrom, int kTo>
  __device__ __forceinline__ void convert_landed(uint32_t sbase, int stage, int p) const {
    using T = HopperTraits<Cfg>;
    if constexpr (has_fp8_box(kFrom, kTo))
      for_each_fp8_run<kFrom, kTo>([&](auto run, int b) { convert_pair<decltype(run)::value>(sbase, stage, p, b); });
    if constexpr ((has_fp8_box(kFrom, kTo) && Cfg::kGroupFence) || has_landed_16bit_box(kFrom, kTo)) {
      fence_async_shared();  // the stores or landed copies (generic proxy) before wgmma (async proxy) reads them
      static_for<kTo - kFrom>([&](auto i) {
        constexpr int box = kFrom + decltype(i)::value;
        if constexpr (is_fp8(Cfg::kSources[box_source<Cfg>(box)].dtype) ? Cfg::kGroupFence : lands_16bit())
          mbarrier_arrive(T::full(sbase, stage, box));
      });
    }
  }

  // Whether fill_stage issues both groups' copies before it converts either, so that a stage's
  // fp8 loads take one round trip to memory, not two (crossover: each group shared with the peer
  // as soon as it is converted, the late group's loads still in flight).
  // (or where the producer lands a cp.async plan's 16-bit boxes: the late group's copies in flight
  // while the early group's land)
  __host__ __device__ static constexpr bool issues_ahead() { return lands_some(0, HopperTraits<Cfg>::kBoxes); }

  // The cp.async groups issue_boxes commits for a stage's early group of boxes and its late group.
  __host__ __device__ static constexpr int early_groups() { return lands_some(0, HopperTraits<Cfg>::kEarly) ? 1 : 0; }
  __host__ __device__ static constexpr int late_groups() {
    return lands_some(HopperTraits<Cfg>::kEarly, HopperTraits<Cfg>::kBoxes) ? 1 : 0;
  }

  // f(run I, first box b) for each fp8 box pair of boxes [kFrom, kTo), run by run, a run's pairs
  // in a loop, not unrolled (ptxas would hoist every pair's addresses or reads to the top, past
  // the producer's registers).
  template <int kFrom, int kTo, class F>
  __device__ __forceinline__ static void for_each_fp8_run(F&& f) {
    static_for<kTo - kFrom>([&](auto i) {
      constexpr int box = kFrom + decltype(i)::value;
      constexpr int I = box_source<Cfg>(box);
      constexpr Source src = Cfg::kSources[I];
      if constexpr (is_fp8(src.dtype) && (box == kFrom || box_source<Cfg>(box - 1) != I)) {
        // the run's boxes in this group: [box, kEnd)
        constexpr int kRunEnd = (src.smem_col + src.width) / kBoxCols;
        constexpr int kEnd = kTo < kRunEnd ? kTo : kRunEnd;
        static_assert((box * kBoxCols - src.smem_col) % (2 * kBoxCols) == 0 && (kEnd - box) % 2 == 0,
                      "an fp8 run's boxes of a group in whole pairs");
#pragma unroll 1
        for (int b = box; b < kEnd; b += 2) f(std::integral_constant<int, I>{}, b);
      }
    });
  }

  // Whether each box pair of fp8 run I lies in one scale group (groups of a multiple of 128
  // values starting on one): a token's pair then has one scale, loaded once (load_pair).
  template <int I>
  __host__ __device__ static constexpr bool one_scale_a_pair() {
    constexpr Source src = Cfg::kSources[I];
    return src.scale_group % (2 * kBoxCols) == 0 && src.seg_lo % (2 * kBoxCols) == 0 && kMine <= 8;
  }
  // Where thread p's chunk c = p % 8 finds its scale in the pair's first box: byte 16 c (a scale
  // a chunk), or byte 0 (one_scale_a_pair), plus 4 (r % 4) in token row r (scales_at), then the
  // row's 128 r, as the raw chunks': a warp's four rows (r % 4 = 0..3) on four banks, not one
  // (rows 128 bytes apart), so its scale reads and copies take one wavefront, not four. Every row a thread
  // touches is p / 8 + 16 k, rotated (crossover) by a multiple of 16 modulo 64: r % 4 = p / 8 % 4,
  // added once. (Written as (r % 4) 4 at each row, the any-stride part kernels of fp8 runs of a
  // scale per 32 or 64 spilled 4-8 bytes at every page size but 1: ptxas, sm_90a.)
  template <int I>
  __device__ __forceinline__ static uint32_t scales_at(uint32_t box, int p) {
    static_assert(Cfg::kTileN % 16 == 0, "a thread's rows p / 8 + 16 k (+ 16 kMine) modulo kTileN keep p / 8 % 4");
    return box + (one_scale_a_pair<I>() ? 0 : p % 8 * 16) + p / 8 % 4 * 4;
  }

  // Scale records (the plan's kScaleRecordBytes > 0; one fp8 run of one scale a box pair, its
  // scales 16-byte aligned in the record, hopper.py): each token's scales of the run by one copy a
  // tile, with the early group's copies, into the stage's records (token row r at 16 r, four rows
  // of a warp on four bank groups), read there by the conversion of every pair of the tile; not
  // a 4-byte copy a token and pair (each of a warp's 16 wavefronts). A stage's records are
  // rewritten only after its EMPTY waits, by threads whose reads of the last tile's are done (a
  // quarter warp's reads precede its stores: convert_pair's __syncwarp).
  template <int I>
  __host__ __device__ static constexpr bool records() { return Cfg::kScaleRecordBytes > 0 && one_scale_a_pair<I>(); }
  __device__ __forceinline__ static uint32_t record_at(uint32_t sbase, int stage, int r) {
    return sbase + Cfg::kScalesOff + (stage * Cfg::kTileN + r) * Cfg::kScaleRecordBytes;
  }

  // Token c % kMine of this thread's (c = p % 8: a quarter warp's threads c < kMine copy one token's
  // scales each, one copy for kMine tokens): its byte offset in cache tensor kTensor and whether it
  // has a slot, chosen by selects.
  template <int kTensor>
  __device__ __forceinline__ void lane_token(int c, long long& at, int& ok) const {
    at = off[0][kTensor];
    ok = valid[0];
#pragma unroll
    for (int j = 1; j < kMine; ++j) {
      at = select_s64(c % kMine == j, off[j][kTensor], at);
      ok = select_s32(c % kMine == j, valid[j], ok);
    }
  }

  // The loads of fp8 box pair `box`, box + 1 of run I into stage `stage`, by cp.async: thread p's
  // chunk c = p % 8 (bytes 16 c of the pair's 128 a token, one scale group: the lowering puts
  // groups on multiples of 16) of each token it fills (its first kMine) into box + 1 at byte
  // 128 r + 16 c of the token's row r; the scales into box at scales_at + 128 r (zeros for a token
  // without a slot): the chunk's own, or, one_scale_a_pair, the pair's one scale of token c (for
  // c < kMine: one copy for kMine tokens, not one a token and chunk; each 4-byte copy of a quarter
  // warp cost as much of L1 as its 16-byte raw chunks).
  template <int I>
  __device__ __forceinline__ void load_pair(const AttnccArgs& a, uint32_t sbase, int stage, int head, int p, int box) const {
    using T = HopperTraits<Cfg>;
    constexpr Source src = Cfg::kSources[I];
    const int c = p % 8;
    const int first = box * kBoxCols - src.smem_col;  // the pair's first value in the run
    const char* base = run_base<Cfg, I>(a, head) + first + c * 16;
    const uint32_t raw_at = T::stage_box(sbase, stage, box + 1) + c * 16, scale_at = scales_at<I>(T::stage_box(sbase, stage, box), p);
    if constexpr (records<I>()) {
      if (first == 0) {  // the run's scales, once a tile, with its first pair
        long long at;
        int ok;
        lane_token<src.scale_tensor>(c, at, ok);
        if (c < kMine) cp_async_16_at(record_at(sbase, stage, row(p, c % kMine)), scale_base<Cfg, I>(a, head), at, ok != 0);
      }
#pragma unroll
      for (int j = 0; j < kMine; ++j) cp_async_chunk_at<src.copy_bytes>(raw_at + row(p, j) * 128, base, off[j][src.tensor], valid[j]);
    } else if constexpr (one_scale_a_pair<I>()) {
      const char* scales = scale_base<Cfg, I>(a, head) + scale_index<Cfg, I>(first) * 4;
      long long at;
      int ok;
      lane_token<src.scale_tensor>(c, at, ok);
      if (c < kMine) cp_async_4_at(scale_at + row(p, c % kMine) * 128, scales, at, ok != 0);
#pragma unroll
      for (int j = 0; j < kMine; ++j) cp_async_chunk_at<src.copy_bytes>(raw_at + row(p, j) * 128, base, off[j][src.tensor], valid[j]);
    } else {
      const char* scales = scale_base<Cfg, I>(a, head) + scale_index<Cfg, I>(first + c * 16) * 4;
#pragma unroll
      for (int j = 0; j < kMine; ++j) {
        cp_async_chunk_at<src.copy_bytes>(raw_at + row(p, j) * 128, base, off[j][src.tensor], valid[j]);
        cp_async_4_at(scale_at + row(p, j) * 128, scales, off[j][src.scale_tensor], valid[j]);
      }
    }
  }

  // Whether an fp8 run fills one of boxes [from, to).
  __host__ __device__ static constexpr bool has_fp8_box(int from, int to) {
    for (int b = from; b < to; ++b)
      if (is_fp8(Cfg::kSources[box_source<Cfg>(b)].dtype)) return true;
    return false;
  }
  // Whether the producer lands the 16-bit boxes it copies: a cp.async plan's producer_fences (a TMA
  // plan's rare cp.async tiles are landed in issue_boxes itself).
  __host__ __device__ static constexpr bool lands_16bit() { return Cfg::kProducerFences && Cfg::kTmaRows == 0; }
  __host__ __device__ static constexpr bool has_landed_16bit_box(int from, int to) {
    if (!lands_16bit()) return false;
    for (int b = from; b < to; ++b)
      if (!is_fp8(Cfg::kSources[box_source<Cfg>(b)].dtype)) return true;
    return false;
  }
  // Whether the producer waits for some box of [from, to) to land (its cp.async group): to convert
  // it (fp8), or to fence it (a 16-bit box, lands_16bit).
  __host__ __device__ static constexpr bool lands_some(int from, int to) {
    return has_fp8_box(from, to) || has_landed_16bit_box(from, to);
  }

  // Crossover: this CTA's half of the 16-bit boxes of [kFrom, kTo) of stage `stage` into the
  // peer's (kNewer: the cp.async groups committed after this group's, left in flight; the fp8
  // boxes went to the peer as they were converted, convert_pair): once this thread's copies have
  // landed, each of its 16-byte chunks read and stored into the peer's box by st.async, counted
  // on the peer's FULL of the box; then its arrival on its own (thread 0's expecting the peer's
  // half). The consumers write P into the P box only after that FULL, so the chunks are read
  // before P can overwrite them.
  template <int kFrom, int kTo, int kNewer>
  __device__ __forceinline__ void share_group(uint32_t sbase, int stage, int p) const {
    using T = HopperTraits<Cfg>;
    cp_async_wait<kNewer>();
    static_for<kTo - kFrom>([&](auto i) {
      constexpr int box = kFrom + decltype(i)::value;
      if constexpr (!is_fp8(Cfg::kSources[box_source<Cfg>(box)].dtype)) {
        const uint32_t dst = T::stage_box(sbase, stage, box), full = T::full(sbase, stage, box);
#pragma unroll
        for (int k = 0; k < kMine; ++k) {
          const uint32_t at = dst + sw128(row(p, k), p % 8);
          st_async_16(peer + (at - sbase), lds128(at), peer + (full - sbase));
        }
        fence_async_shared();  // the landed copies (generic proxy) before wgmma reads them: the consumers do not fence
        arrive_full(full, p);
      }
    });
  }
  static constexpr int kHalfBoxBytes = Cfg::kBoxBytes / 2;  // crossover: a CTA's half of a box (32 rows)

  // This thread's arrival on a FULL it filled its part of (crossover: thread 0's also expecting the
  // half box the peer stores).
  __device__ __forceinline__ static void arrive_full(uint32_t bar, int p) {
    if (Cfg::kCrossover && p == 0) {
      mbarrier_arrive_expect_tx(bar, kHalfBoxBytes);
    } else {
      mbarrier_arrive(bar);
    }
  }

  // Boxes `box` and box + 1 of stage `stage` from the raw bytes of fp8 run I in box + 1 and their
  // scales in box (their loads landed). Thread p takes the 16 values of chunk c = p % 8 (bytes
  // 16 c of the pair's 128, one scale group: the lowering puts groups on multiples of 16) of each
  // token it fills (its first kMine): reads them all, then (a token's raw row and scales are read
  // only by its quarter warp, whose stores overwrite them: __syncwarp between) converts each
  // (core/dequant.cuh) into staged columns 16 c .. 16 c + 15 of the pair: box `box` + c / 4,
  // 16-byte chunks 2 (c % 4) and 2 (c % 4) + 1 of the token's swizzled row. Threads c >= 4 store their high chunk first, so
  // that a quarter warp's stores (one token) fall on all eight 16-byte bank groups at once. The
  // generic-proxy stores are fenced for wgmma before the arrivals on the FULLs (crossover: here, for
  // the pair, unless kGroupFence: then in convert_landed, for the group).
  template <int I>
  __device__ __forceinline__ void convert_pair(uint32_t sbase, int stage, int p, int box) const {
    using T = HopperTraits<Cfg>;
    constexpr Source src = Cfg::kSources[I];
    const int c = p % 8;
    const uint32_t raw_at = T::stage_box(sbase, stage, box + 1) + c * 16, scale_at = scales_at<I>(T::stage_box(sbase, stage, box), p);
    uint4 raw[kMine];
    float scale[kMine];
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      raw[j] = lds128(raw_at + row(p, j) * 128);
      if constexpr (records<I>()) {
        scale[j] = lds32f(record_at(sbase, stage, row(p, j)) + scale_index<Cfg, I>(box * kBoxCols - src.smem_col) * 4);
      } else {
        scale[j] = lds32f(scale_at + row(p, j) * 128);
      }
    }
    __syncwarp();
    const uint32_t dst = T::stage_box(sbase, stage, box + c / 4);
    const bool high_first = c >= 4;
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      uint4 lo, hi;
      dequant16<src.dtype, Cfg::kElem>(raw[j], scale[j], lo, hi);
      const int r = row(p, j);
      const uint32_t at_lo = dst + sw128(r, 2 * (c % 4)), at_hi = dst + sw128(r, 2 * (c % 4) + 1);
      const uint32_t at_first = high_first ? at_hi : at_lo, at_second = high_first ? at_lo : at_hi;
      const uint4 v_first = high_first ? hi : lo, v_second = high_first ? lo : hi;
      sts128(at_first, v_first);
      sts128(at_second, v_second);
      if constexpr (Cfg::kCrossover) {  // and into the peer's box (share_group)
        const uint32_t peer_full = peer + (T::full(sbase, stage, box + c / 4) - sbase);
        st_async_16(peer + (at_first - sbase), v_first, peer_full);
        st_async_16(peer + (at_second - sbase), v_second, peer_full);
      }
    }
    if constexpr (!Cfg::kGroupFence) {  // (else convert_landed, once for the group)
      fence_async_shared();  // the stores (generic proxy) before wgmma (async proxy) reads them
      arrive_full(T::full(sbase, stage, box), p);
      arrive_full(T::full(sbase, stage, box + 1), p);
    }
  }
};

// A tile for TMA: its tokens are tokens [token, token + tile_n) of page `page[0]` (a page of
// tile_n tokens or more), or the kPages whole pages page[0..kPages) (a page of kTmaRows < tile_n
// tokens: rows j kTmaRows .. of every box from page[j]); `whole` when every token is inside the
// view and every page number valid (else the tile goes by cp.async, which zero-fills and flags
// what is not).
template <class Cfg>
struct TmaTile {
  static constexpr int kPages = Cfg::kTmaRows > 0 ? Cfg::kTileN / Cfg::kTmaRows : 1;
  int page[kPages], token;  // token -1: not whole (no bool of its own: a register the producer lacks)
  __device__ __forceinline__ bool whole() const { return token >= 0; }
  __device__ __forceinline__ void set_none() { token = -1; }

  __host__ __device__ static constexpr bool issues_ahead() { return false; }  // (fill_stage)

  __device__ __forceinline__ void load(const AttnccArgs& a, const SlotSource& ss, int tile) {
    const int pos0 = tile * Cfg::kTileN;
    bool whole = pos0 + Cfg::kTileN <= ss.limit;  // then its page numbers are inside the row
#pragma unroll
    for (int j = 0; j < kPages; ++j) page[j] = whole ? __ldg(ss.row + pos0 / Cfg::kPageSize + j) : 0;
#pragma unroll
    for (int j = 0; j < kPages; ++j) whole = whole && static_cast<unsigned>(page[j]) < static_cast<unsigned>(a.num_pages);
    token = whole ? pos0 % Cfg::kPageSize : -1;
  }

  // The tile's flags, no token without a slot, and FLAGS: thread 0's alone (an arrival counting
  // all 128: the other threads have nothing to do for the tile but keep their EMPTY phases).
  __device__ __forceinline__ static void write_flags(unsigned char* flags, uint32_t flags_bar, int p) {
    static_assert((Cfg::kTileN + 16) % 16 == 0, "flags in 16-byte words");
    if (p == 0) {
#pragma unroll
      for (int i = 0; i < (Cfg::kTileN + 16) / 16; ++i) reinterpret_cast<int4*>(flags)[i] = make_int4(0, 0, 0, 0);
      mbarrier_arrive(flags_bar, kGroupThreads);
    }
  }

  // Boxes [kFrom, kTo) of stage `stage`: page j's copies issued by producer thread j 128 / kPages
  // (lane 0 of a warp; page 16: threads 0, 32, 64, 96; page 64: thread 0 alone, or, the plan's
  // spread_copies, box b by lane 0 of warp b % 4, arriving for all 128), so that the
  // tile's pages go out side by side (thread 0 issuing page 16's 36 copies alone took 1.18-1.20x the
  // time: bench/RESULTS.md, session 38); each issuer expects its page's bytes on the box's FULL,
  // issues its copy and arrives for its share of the producer (FULL counts 128: a cp.async tile's
  // arrivals; 128 arrivals on one mbarrier a box cost ~100 cycles each box on the producer's
  // critical path).
  template <int kFrom, int kTo>
  __device__ __forceinline__ void copy_boxes(const MapsOf<Cfg>& maps, uint32_t sbase, int stage, int head, int p) const {
    using T = HopperTraits<Cfg>;
    constexpr bool kSpread = kPages == 1 && Cfg::kSpreadCopies;  // box b by warp b % 4
    constexpr int kShare = kGroupThreads / kPages;  // the producer threads an issuer arrives for
    static_assert(kShare % 32 == 0 && kShare * kPages == kGroupThreads, "an issuer a page, each in its own warp");
    if (!kSpread && (kPages == 1 ? p != 0 : p % kShare != 0)) return;
    const int j = kPages == 1 ? 0 : p / kShare;
    int mine = page[0];  // (page[j] without a dynamic index into the registers)
#pragma unroll
    for (int i = 1; i < kPages; ++i) mine = j == i ? page[i] : mine;
    static_for<kTo - kFrom>([&](auto i) {
      constexpr int box = kFrom + decltype(i)::value;
      if (kSpread && p != 32 * (box % 4)) return;
      constexpr Source src = Cfg::kSources[box_source<Cfg>(box)];
      const uint32_t bar = T::full(sbase, stage, box);
      mbarrier_arrive_expect_tx(bar, Cfg::kBoxBytes / kPages);
      const int col = (src.offset_bytes + head * src.head_stride_bytes) / 2 + box * kBoxCols - src.smem_col;
      // (a page's rows at a multiple of 1024 bytes: the swizzle's atom)
      tma_load_3d(T::stage_box(sbase, stage, box) + j * (Cfg::kBoxBytes / kPages), &maps.map[src.tensor], col, token, mine, bar);
      mbarrier_arrive(bar, kShare - 1);
    });
  }
};

// A tile into stage `stage`, either kind (TileTokens from the call's arguments, TmaTile from the
// tensor maps): each group of boxes after its EMPTY wait (the release of the stage's previous
// tile), the flags before the early group (stacked: the only one). fp8 tiles without crossover
// (issues_ahead): both groups' copies issued (issue_stage), then each group converted, so the
// late group's loads fly while the early group's wait; the EMPTY late wait before the early
// group's FULL arrivals cannot deadlock: the stage's previous tile is released by consumers that
// need only tiles before this one, all of them filled. Trace events (core/trace.cuh, role 2, slot
// trace_slot: the tile in the CTA's stream): 0 the wait for EMPTY early begins, 1 it ends, 2 EMPTY
// late's ends, 3 the copies are issued, 4 the early group converted, 5 the late group (6 and 7:
// their copies landed, convert_stage).
template <class Cfg, class Tile, class From>
__device__ __forceinline__ void issue_stage(const Tile& tile, const From& from, uint32_t sbase, unsigned char* smem, int stage, int head,
                                            int p, int parity, int trace_slot) {
  using T = HopperTraits<Cfg>;
  static_assert(Tile::issues_ahead() && T::kEarly < T::kBoxes, "a tile whose copies are issued before any conversion");
  ATTNCC_TRACE(p == 0, 2, trace_slot, 0);
  mbarrier_wait(T::empty_early(sbase, stage), parity);
  ATTNCC_TRACE(p == 0, 2, trace_slot, 1);
  tile.write_flags(smem + T::stage_flags(stage), T::flags_bar(sbase, stage), p);
  tile.template issue_boxes<0, T::kEarly>(from, sbase, stage, head, p);
  mbarrier_wait(T::empty_late(sbase, stage), parity);
  ATTNCC_TRACE(p == 0, 2, trace_slot, 2);
  tile.template issue_boxes<T::kEarly, T::kBoxes>(from, sbase, stage, head, p);
  ATTNCC_TRACE(p == 0, 2, trace_slot, 3);
}

// The conversion of a tile's group of boxes [kFrom, kTo) (issue_stage issued its copies), kNewer
// cp.async groups committed after it left in flight; trace events `event` + 2 once its copies
// have landed (the early group's 6, the late's 7) and `event` once it is converted.
template <class Cfg, int kFrom, int kTo, int kNewer, class Tile>
__device__ __forceinline__ void convert_stage(const Tile& tile, uint32_t sbase, int stage, int p, int trace_slot, int event) {
  tile.template wait_boxes<kFrom, kTo, kNewer>();
  ATTNCC_TRACE(p == 0, 2, trace_slot, event + 2);
  tile.template convert_landed<kFrom, kTo>(sbase, stage, p);
  ATTNCC_TRACE(p == 0, 2, trace_slot, event);
}

template <class Cfg, class Tile, class From>
__device__ __forceinline__ void fill_stage(const Tile& tile, const From& from, uint32_t sbase, unsigned char* smem, int stage, int head,
                                           int p, int parity, int trace_slot) {
  using T = HopperTraits<Cfg>;
  if constexpr (T::kEarly < T::kBoxes && Tile::issues_ahead()) {
    issue_stage<Cfg>(tile, from, sbase, smem, stage, head, p, parity, trace_slot);
    convert_stage<Cfg, 0, T::kEarly, Tile::late_groups()>(tile, sbase, stage, p, trace_slot, 4);
    if constexpr (T::kCrossover) tile.template share_group<0, T::kEarly, Tile::late_groups()>(sbase, stage, p);
    convert_stage<Cfg, T::kEarly, T::kBoxes, 0>(tile, sbase, stage, p, trace_slot, 5);
    if constexpr (T::kCrossover) tile.template share_group<T::kEarly, T::kBoxes, 0>(sbase, stage, p);
  } else {
    // (crossover plans have fp8 runs, hence the order above: no peer to wait for here)
    static_assert(!T::kCrossover, "crossover: copies issued ahead");
    ATTNCC_TRACE(p == 0, 2, trace_slot, 0);
    mbarrier_wait(T::empty_early(sbase, stage), parity);
    ATTNCC_TRACE(p == 0, 2, trace_slot, 1);
    tile.write_flags(smem + T::stage_flags(stage), T::flags_bar(sbase, stage), p);
    tile.template copy_boxes<0, T::kEarly>(from, sbase, stage, head, p);
    if constexpr (T::kEarly < T::kBoxes) {
      mbarrier_wait(T::empty_late(sbase, stage), parity);
      ATTNCC_TRACE(p == 0, 2, trace_slot, 2);
      tile.template copy_boxes<T::kEarly, T::kBoxes>(from, sbase, stage, head, p);
    }
    ATTNCC_TRACE(p == 0, 2, trace_slot, 3);
  }
}

}  // namespace hopper
}  // namespace attncc
