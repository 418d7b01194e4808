// attncc/hopper/produce.cuh: the producer warp group of the Hopper family: KV tiles from the
// paged cache into 128B-swizzled boxes of a stage, by TMA where the plan's page size allows it
// (kTmaRows > 0: TmaTile, below) and by cp.async for any page size and any tile TMA cannot take.
//
// TMA: a tile whose tokens are all inside the CTA's view, in a page with a valid number, is
// copied by one thread, a copy per box; that thread's arrivals on FULL expect the box's bytes and
// count for all 128 producer threads (FULL counts 128, a cp.async tile's arrivals), and it alone
// writes the tile's flags. Its page number is read a step ahead (kernel.cuh: produce).
// cp.async:
// Producer thread p (0..127) copies 16-byte chunk p % 8 of every box for the tokens
// p / 8 + 16 k, k < tile_n / 16. Its tokens are fixed for the whole tile, so it turns each into
// a slot (page table, paging.cuh) and a byte offset in every cache tensor once per tile, and a
// chunk of a box then costs one add and its cp.async (the cooperative page-address computation
// of the GLA paper, with no exchange: each thread computes only what it copies). A token without
// a slot (past the CTA's view, a bad page number, a sparse -1 or out-of-range index) is
// zero-filled and flagged for the consumers. A sparse plan's slots are its query token's indices
// (paging.cuh), read the same way.
// fp8 runs (no TMA): the same threads and tokens, a box pair (128 values a token) at a time,
// loaded into registers, dequantized (core/dequant.cuh) and stored into the boxes: see
// dequant_pair. The conversion is the producer's own work, pipelined against the consumers'
// products by the stages.
//
// Per stage the producer, for tile i:
//   writes the tile's flags (a byte per token: no slot; a word per producer warp: any), then
//   arrives FLAGS[stage] (release: the consumers' wait acquires them);
//   per box, in the stage's order (traits.cuh): its cp.async, then cp.async.mbarrier.arrive on
//   FULL[stage][box], which completes when the copies of every producer thread have landed.
// The consumers fence the boxes to the async proxy (wgmma) after their FULL wait.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/copy.cuh"
#include "attncc/core/dequant.cuh"
#include "attncc/core/paging.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/trace.cuh"
#include "attncc/hopper/barrier.cuh"
#include "attncc/hopper/tma.cuh"
#include "attncc/hopper/traits.cuh"
#include "attncc/hopper/wgmma.cuh"

namespace attncc {
namespace hopper {

// 16 bytes of the streamed cache at base + off into registers (non-coherent, not kept in L1),
// zero when !valid (nothing is read).
__device__ __forceinline__ uint4 ldg_stream_16(const char* base, long long off, bool valid) {
  uint4 v;
  asm volatile("{\n.reg .pred p;\n.reg .u64 a;\nsetp.ne.b32 p, %4, 0;\nadd.s64 a, %5, %6;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\n"
      "mov.b32 %2, 0;\nmov.b32 %3, 0;\n@p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [a];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "r"(static_cast<int>(valid)), "l"(base), "l"(off));
  return v;
}
// An fp32 (a scale) at base + off, 0 when !valid.
__device__ __forceinline__ float ldg_f32(const char* base, long long off, bool valid) {
  float v;
  asm volatile("{\n.reg .pred p;\n.reg .u64 a;\nsetp.ne.b32 p, %1, 0;\nadd.s64 a, %2, %3;\nmov.b32 %0, 0;\n@p ld.global.nc.f32 %0, [a];\n}\n"
      : "=f"(v)
      : "r"(static_cast<int>(valid)), "l"(base), "l"(off));
  return v;
}

// The 128-byte line at base + off into L2 (the sum formed in the instruction's own register, as
// cp_async_16_at's).
__device__ __forceinline__ void prefetch_l2_at(const char* base, long long off) {
  asm volatile("{\n.reg .u64 a;\nadd.s64 a, %0, %1;\nprefetch.global.L2 [a];\n}\n" ::"l"(base), "l"(off));
}

// cp.async of 16 bytes from base + off (zero-filled when !valid), the sum formed in the
// instruction's own register: the compiler cannot hoist a tile's 64-bit addresses (a box's
// worth of them) out of the copy sequence into the producer's few registers.
__device__ __forceinline__ void cp_async_16_at(uint32_t dst, const char* base, long long off, bool valid) {
  asm volatile(
      "{\n.reg .u64 a;\nadd.s64 a, %1, %2;\ncp.async.cg.shared.global [%0], [a], 16, %3;\n}\n" ::"r"(dst), "l"(base), "l"(off),
      "r"(valid ? 16 : 0)
      : "memory");
}

template <class Cfg>
struct TileTokens {
  static constexpr int kTok = Cfg::kTileN / 16;  // tokens per producer thread
  long long off[kTok][Cfg::kNumTensors];         // byte offset of the token in each cache tensor
  bool valid[kTok];

  // The slots of tile `tile` (relative to position 0 of the sequence) for producer thread p,
  // and, for fp8 runs, each token's lines prefetched into L2 (prefetch_fp8).
  __device__ __forceinline__ void load(const AttnccArgs& a, const SlotSource& ss, int tile, int p, int head) {
    int raw[kTok];
#pragma unroll
    for (int k = 0; k < kTok; ++k) raw[k] = load_slot_raw<Cfg>(ss, tile * Cfg::kTileN + p / 8 + 16 * k);
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      const int slot = slot_from_raw<Cfg>(a, raw[k], tile * Cfg::kTileN + p / 8 + 16 * k);
      valid[k] = slot >= 0;
      static_for<Cfg::kNumTensors>([&](auto ti) { off[k][decltype(ti)::value] = token_offset<Cfg, decltype(ti)::value>(a, max(slot, 0)); });
    }
    // (the kernels of a contiguous cache only: at any strides the offsets' arithmetic leaves the
    // producer too few registers, 2-40 bytes spilled)
    if constexpr (has_fp8<Cfg>() && contiguous_cache<Cfg>::value) {
#pragma unroll
      for (int k = 0; k < kTok; ++k) prefetch_fp8(a, head, p, k);
    }
  }

  // fp8 runs: token k's 128-byte lines of each run into L2 (thread p takes line p % 8 of every
  // 8), as soon as its slot is known and before the producer waits for the stage, so that the box
  // pairs' register loads (dequant_pair), one pair after another, wait for L2 rather than for
  // HBM: the whole tile is in flight at once. (H200, same-process A/B, outputs bitwise equal: fp8
  // MLA h_q 128 b=128 s_k 8192 0.953 of the time without at s_q 2, 0.952 at s_q 1; the sparse
  // example 0.963 / 0.966; one bulk prefetch a token, cp.async.bulk.prefetch.L2, 0.997; bench/
  // RESULTS.md, session 18.)
  __device__ __forceinline__ void prefetch_fp8(const AttnccArgs& a, int head, int p, int k) const {
    static_for<Cfg::kNumSources>([&](auto si) {
      constexpr int I = decltype(si)::value;
      constexpr Source src = Cfg::kSources[I];
      if constexpr (is_fp8(src.dtype)) {
        constexpr int kLines = src.width / 128;  // whole box pairs: 128 bytes each
        static_for<(kLines + 7) / 8>([&](auto li) {
          const int line = p % 8 + 8 * decltype(li)::value;
          if ((kLines % 8 == 0 || line < kLines) && valid[k]) prefetch_l2_at(run_base<Cfg, I>(a, head) + line * 128, off[k][src.tensor]);
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
        flags[p / 8 + 16 * k] = valid[k] ? 0 : 1;
        any = any || !valid[k];
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, any);
    if (p % 32 == 0) reinterpret_cast<int*>(flags + Cfg::kTileN)[p / 32] = static_cast<int>(ballot);
    mbarrier_arrive(flags_bar);
  }

  // Boxes [kFrom, kTo) of stage `stage`: this thread's copies of each, then its arrival on the
  // box's FULL. 16-bit boxes first: their cp.async, the arrival counted when they land (in
  // flight while the fp8 boxes are converted). Then each fp8 run's boxes in the group, in pairs
  // (dequant_pair), the arrivals on both boxes' FULL after the stores.
  template <int kFrom, int kTo>
  __device__ __forceinline__ void copy_boxes(const AttnccArgs& a, uint32_t sbase, int stage, int head, int p) const {
    using T = HopperTraits<Cfg>;
    static_for<kTo - kFrom>([&](auto i) {
      constexpr int box = kFrom + decltype(i)::value;
      constexpr int I = box_source<Cfg>(box);
      constexpr Source src = Cfg::kSources[I];
      if constexpr (!is_fp8(src.dtype)) {
        const char* base = run_base<Cfg, I>(a, head) + (box * kBoxCols - src.smem_col) * 2 + (p % 8) * 16;
        const uint32_t dst = T::stage_box(sbase, stage, box);
#pragma unroll
        for (int k = 0; k < kTok; ++k) cp_async_16_at(dst + sw128(p / 8 + 16 * k, p % 8), base, off[k][src.tensor], valid[k]);
        cp_async_arrive(T::full(sbase, stage, box));
      }
    });
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
        // a loop, not unrolled: ptxas would hoist every pair's loads to the top, past the
        // producer's registers
#pragma unroll 1
        for (int b = box; b < kEnd; b += 2) dequant_pair<I>(a, sbase, stage, head, p, b);
      }
    });
  }

  // Boxes `box` and box + 1 of stage `stage` from fp8 run I: 128 fp8 values a token. Thread p
  // takes the 16 values of chunk c = p % 8 (bytes 16 c of the pair's 128, one scale group: the
  // lowering puts groups on multiples of 16) of each of its tokens: all its loads (data and
  // scale, zero for a token without a slot) are issued first, then each chunk is converted
  // (core/dequant.cuh) into staged columns 16 c .. 16 c + 15 of the pair: box `box` + c / 4,
  // 16-byte chunks 2 (c % 4) and 2 (c % 4) + 1 of the token's swizzled row. Threads c >= 4 store
  // their high chunk first, so that a quarter warp's stores (one token) fall on all eight 16-byte
  // bank groups at once. Then the generic-proxy stores are fenced for wgmma and both FULLs arrived.
  template <int I>
  __device__ __forceinline__ void dequant_pair(const AttnccArgs& a, uint32_t sbase, int stage, int head, int p, int box) const {
    using T = HopperTraits<Cfg>;
    constexpr Source src = Cfg::kSources[I];
    const int first = box * kBoxCols - src.smem_col;  // the pair's first value in the run
    const int c = p % 8;
    const char* base = run_base<Cfg, I>(a, head) + first + c * 16;
    const char* scales = scale_base<Cfg, I>(a, head) + ((src.seg_lo + first + c * 16) / src.scale_group - src.scale_first_group) * 4;
    uint4 raw[kTok];
    float scale[kTok];
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      raw[k] = ldg_stream_16(base, off[k][src.tensor], valid[k]);
      scale[k] = ldg_f32(scales, off[k][src.scale_tensor], valid[k]);
    }
    const uint32_t box0 = T::stage_box(sbase, stage, box + c / 4);
    const bool high_first = c >= 4;
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      uint4 lo, hi;
      dequant16<src.dtype, Cfg::kElem>(raw[k], scale[k], lo, hi);
      const int row = p / 8 + 16 * k;
      const uint32_t at_lo = box0 + sw128(row, 2 * (c % 4)), at_hi = box0 + sw128(row, 2 * (c % 4) + 1);
      sts128(high_first ? at_hi : at_lo, high_first ? hi : lo);
      sts128(high_first ? at_lo : at_hi, high_first ? lo : hi);
    }
    fence_async_shared();  // the stores (generic proxy) before wgmma (async proxy) reads them
    mbarrier_arrive(T::full(sbase, stage, box));
    mbarrier_arrive(T::full(sbase, stage, box + 1));
  }
};

// A tile for TMA: its tokens are tokens [token, token + tile_n) of page `page`; `whole` when
// every token is inside the view and the page number valid (else the tile goes by cp.async,
// which zero-fills and flags what is not).
template <class Cfg>
struct TmaTile {
  int page, token;
  bool whole;

  __device__ __forceinline__ void load(const AttnccArgs& a, const SlotSource& ss, int tile) {
    const int pos0 = tile * Cfg::kTileN;
    whole = pos0 + Cfg::kTileN <= ss.limit;  // then its page number is inside the row
    page = whole ? __ldg(ss.row + pos0 / Cfg::kPageSize) : 0;
    token = pos0 % Cfg::kPageSize;
    whole = whole && static_cast<unsigned>(page) < static_cast<unsigned>(a.num_pages);
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

  // Boxes [kFrom, kTo) of stage `stage`: thread 0 expects each box's bytes on its FULL, issues its
  // copy and arrives for the whole producer (FULL counts 128: a cp.async tile's arrivals); 128
  // arrivals on one mbarrier a box cost ~100 cycles each box on the producer's critical path.
  template <int kFrom, int kTo>
  __device__ __forceinline__ void copy_boxes(const TmaMaps<Cfg::kNumTensors>& maps, uint32_t sbase, int stage, int head, int p) const {
    using T = HopperTraits<Cfg>;
    if (p != 0) return;
    static_for<kTo - kFrom>([&](auto i) {
      constexpr int box = kFrom + decltype(i)::value;
      constexpr Source src = Cfg::kSources[box_source<Cfg>(box)];
      const uint32_t bar = T::full(sbase, stage, box);
      mbarrier_arrive_expect_tx(bar, Cfg::kBoxBytes);
      const int col = (src.offset_bytes + head * src.head_stride_bytes) / 2 + box * kBoxCols - src.smem_col;
      tma_load_3d(T::stage_box(sbase, stage, box), &maps.map[src.tensor], col, token, page, bar);
      mbarrier_arrive(bar, kGroupThreads - 1);
    });
  }
};

// A tile into stage `stage`, either kind (TileTokens from the call's arguments, TmaTile from the
// tensor maps): each group of boxes after its EMPTY wait (the release of the stage's previous
// tile), the flags before the early group (stacked: the only one). Trace events (core/trace.cuh,
// role 2, slot trace_slot: the tile in the CTA's stream): 0 the wait for EMPTY early begins, 1 it
// ends, 2 EMPTY late's ends, 3 the copies are issued.
template <class Cfg, class Tile, class From>
__device__ __forceinline__ void fill_stage(const Tile& tile, const From& from, uint32_t sbase, unsigned char* smem, int stage, int head,
                                           int p, int parity, int trace_slot) {
  using T = HopperTraits<Cfg>;
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

}  // namespace hopper
}  // namespace attncc
