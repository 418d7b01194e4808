// attncc/mma_sync/kernel.cuh: the mma.sync family's split-KV decode kernel.
//
// ## What one CTA computes
// A CTA takes tile_m rows of one kv head for one sequence and a range of its KV tiles
// (core/work.cuh: CtaWork; part mode runs one decode_tiles per piece of its part's walk) and
// streams them, tile_n tokens at a time:
//
//     for each KV tile:                             (cp.async pipeline, `stages` tiles deep)
//         S  = Q K^T              mma.sync, Q and K from shared memory (ldmatrix); qk_split: two
//                                 warps each take half the k-steps and add their partial blocks
//         S  = masked(S)          causal limit, past the sequence, -1 index (tiles that need it)
//         m' = rowmax(S c, m); P = exp2(S c - m'); l = l 2^(m-m') + rowsum(P); O *= 2^(m-m')
//                                 c = scale log2(e); m moves only by more than 8 (softmax.cuh)
//         O += P V                P through shared memory, V by ldmatrix.trans
//     out = O / l, lse = (m + log2 l) ln 2          -> out/lse (1 split) or partials (combine.cuh)
//
// K and V are views over the same staged tile: the record's runs are copied (and fp8
// dequantized) once into a 16-bit row of staged_width elements per token, and the key (value)
// is the concatenation of the staged column runs key_runs (value_runs). MLA's latent is loaded
// once and used by both products.
//
// ## Warp layout (every number chosen by attncc/families/mma_sync.py; traits.cuh checks it)
// warps = WM x WN. Warp (wm, wn) owns rows [wm*WR, wm*WR + WR) (WR = warp_rows, 16 or 32) in
// both products. In S = Q K^T it computes tokens [wn*TN, wn*TN + TN) of the tile (TN =
// tile_n / WN): no product is computed twice. The row max is completed across the WN warps
// of a row group through shared memory; each warp writes its P block to shared memory, and in
// O += P V it owns value columns [wn*VN, wn*VN + VN) (VN = d_v / WN) against all tile_n tokens.
// The per-warp l sums only its own tokens; the WN partial sums are added at the end.
// qk_split (where the lowering finds it pays): the warps wn = 2 wt + wk, wk = 0, 1, of a
// pair both compute S for the pair's 2 TN tokens, over the even (wk = 0) or odd (wk = 1)
// k-steps, and each adds the partner's partial of its own TN tokens (through the row group's P
// rows, free until P is stored): the Q fragment of a k-step then serves 2 TN tokens, so
// S = Q K^T reads half the Q bytes, for tile_m tile_n fp32 stored and loaded. The layout
// after the sum is the one above.
// warp_rows: among the legal WR in {16, 32}, the one that reads the fewest shared-memory bytes
// per KV tile (the lowering's cost: Q and K reads of S = Q K^T plus P and V reads of O += P V).
//
// ## Pipeline and barriers, per KV step i
//   A  wait for tile i, __syncthreads            tile i visible; step i-1 fully consumed
//      store the slots of tile i + stages; prefetch the page number of tile i + stages + 1
//      [raw mode: dequantize tile i into the staged tile, __syncthreads]
//      S = Q K^T, with the copies of tile i + stages - 1 (into the stage of step i - 1) issued
//      between its k-steps (copy_interleave) or before it
//      [qk_split: the pair's partial S summed in two rounds, each behind a pair barrier]
//      mask, row max -> shared;  B  row-group barrier
//      m, P, l, O rescale (skipped when no row max moved), P -> shared;  C  row-group barrier
//      O += P V
// ping_pong (two row groups): A is CTA-wide only at step 0. Row group 1 alone copies tiles and
// keeps the slots; the groups hand tiles over through named barriers instead of A:
//   row group 0, step i:  sync FULL(i); arrive EMPTY(i - 1)     (done with tile i - 1)
//   row group 1, step i:  sync EMPTY(i - 1); copy tile i + 1 into tile i - 1's stage; S = Q K^T;
//                         wait for its copies, arrive FULL(i + 1); softmax; O += P V
//   (steps that copy nothing skip EMPTY: row group 1 then syncs its own row-group barrier, so
//   its warps still start a step together, e.g. before qk_split's pair_sum writes P rows)
// so row group 0 may run up to about half a step ahead, and one group's softmax (no tensor
// work, two barriers) overlaps the other group's products instead of both idling the tensor
// pipe at once (H200, MLA h_q 128 s_q 2, same run: 334 TFLOP/s without, 351 with).
////
// Runtime (host) conditions: every tensor pointer 16-byte aligned; 1 <= s_q <= max_sq;
// num_splits >= 1 with the workspace when > 1; or num_parts > 0 (balanced, schedule.cuh),
// num_splits == 1 and the workspace of 2 num_parts slots; fewer than 2^31 CTAs.
// Registers: 255 at most with no spills for every example and tests/specs.py plan, both kernels,
// sm_90a and sm_80 (tests/test_build.py reads ptxas -v);
// the largest MLA plans sit at ~250, so a new shape should be compiled once and its report read.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/dequant.cuh"
#include "attncc/core/copy.cuh"
#include "attncc/core/paging.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/ready.cuh"
#include "attncc/core/softmax.cuh"
#include "attncc/core/work.cuh"
#include "attncc/mma_sync/mainloop.cuh"
#include "attncc/mma_sync/traits.cuh"

namespace attncc {

// ------------------------------------------------------------------------------------------
// One CTA's work on one range of one sequence's KV tiles: the main loop and its epilogue.

template <class Cfg>
__device__ __forceinline__ void decode_tiles(const AttnccArgs& args, const CtaWork<Cfg>& w) {
  using T = DecodeTraits<Cfg>;
  constexpr int M = T::kTileM, N = T::kTileN, S = T::kStages, MT = T::kMT, WR = T::kWarpRows;
  constexpr int kRowGroupThreads = T::kWarpsN * 32;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sbase = smem_addr(smem);
  const uint32_t q_tile = sbase + T::kQOff;
  const uint32_t kv_base = sbase + T::kKVOff;
  const uint32_t raw_base = sbase + T::kRawOff;
  const uint32_t p_tile = sbase + T::kPOff;
  int* const slot_ring = reinterpret_cast<int*>(smem + T::kSlotOff);
  float* const red = reinterpret_cast<float*>(smem + T::kRedOff);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  // The threads that copy KV tiles and keep their slots: all, or (ping_pong) row group 1.
  constexpr bool PP = T::kPingPong;
  const bool producer = !PP || wm == 1;
  const int ptid = PP ? tid - kRowGroupThreads : tid;  // index among the producers
  const int slot_tid = producer ? ptid : N;            // SlotPrefetch: tokens < N have a thread

  // ---- the work of this CTA (kept in shared memory for the epilogue)
  if (tid == 0) stash(smem + T::kWorkOff, w);
  const int s_q = args.s_q;
  bool bad_len;
  const int kv_len = CtaWork<Cfg>::kv_len(args, w.b, bad_len);
  if (bad_len && tid == 0 && args.flags) atomicOr(args.flags, ATTNCC_FLAG_SEQLEN);
  const int last_row = min(w.rows_total, (w.mb + 1) * M) - 1;
  const int cta_limit = w.token_limit(w.row_token(last_row), kv_len, s_q);
  const int tile_begin = w.tile_begin;
  const int tile_end = min(w.tile_end, ceil_div(cta_limit, N));
  const int n_iter = max(tile_end - tile_begin, 0);
  const int head = w.head;

  SlotSource ss;
  ss.row = slot_row<Cfg>(args, w.seq, w.b);
  ss.limit = cta_limit;

  // ---- prologue: the slots of the first S tiles, Q, the first S-1 tiles, the row state
  SlotPrefetch<Cfg> pf;
#pragma unroll
  for (int i = 0; i < S; ++i) {
    pf.load(ss, tile_begin + i, slot_tid);
    pf.store(args, slot_ring + i * T::kSlotPitch, tile_begin + i, slot_tid);
  }
  pf.load(ss, tile_begin + S, slot_tid);
  __syncthreads();

  // Where the copies of relative tile i land: its stage of the staged tile (direct mode) or of
  // the raw rows (raw mode).
  auto copy_dst = [&](int i) {
    return T::kRaw ? raw_base + (i % S) * T::kRawTileBytes : kv_base + (i % S) * T::kKVTileBytes;
  };
  const char* q_any = static_cast<const char*>(args.q);
  issue_q<Cfg, typename T::QRows, T::kThreads>(
      q_tile,
      [&](int r) -> const char* {
        const int R = w.mb * M + r;
        if (R >= w.rows_total) return nullptr;
        return q_any + w.query_row(s_q, R) * Cfg::kDK * 2;
      },
      q_any, fresh_tid());  // a fresh read: its offsets are not hoisted out of a part walk
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < n_iter && producer) T::Copy::issue_all(args, copy_dst(i), slot_ring + i * T::kSlotPitch, head, ptid);
    cp_async_commit();
  }

  // ---- per-thread row state
  float o[MT][T::kNTO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < T::kNTO; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[mt][n][j] = 0.f;
  OnlineSoftmax<MT> sm;
  sm.init();
  int row_limit[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = w.mb * M + wm * WR + mt * 16 + (lane >> 2) + 8 * h;
      row_limit[mt][h] = R < w.rows_total ? w.token_limit(w.row_token(R), kv_len, s_q) : 0;
    }
  const float scale_log2 = args.softmax_scale * kLog2e;  // > 0 (the host checks)
  // Positions below full_limit are visible to every row of the CTA (the first row has the
  // smallest query token): tiles below it skip the mask.
  const int full_limit = w.token_limit(w.row_token(w.mb * M), kv_len, s_q);

  // ---- step: one KV tile per iteration, over the range's tiles
  for (int it = 0; it < n_iter; ++it) {
    const int nx = it + S - 1;  // the tile copied in this step, into the stage step it - 1 used
    const bool copy_next = nx < n_iter;
    if (!PP || it == 0) {
      cp_async_wait<S - 2>();
      __syncthreads();  // A: tile it visible (ping_pong: tile 0 and Q); step it - 1 done
    } else if (!producer) {
      bar_sync(T::kFullBarrier0 + (it & 1), T::kThreads);  // FULL(it)
      if (copy_next) bar_arrive(T::kEmptyBarrier0 + ((it - 1) & 1), T::kThreads);  // EMPTY(it - 1)
    } else if (copy_next) {
      bar_sync(T::kEmptyBarrier0 + ((it - 1) & 1), T::kThreads);  // EMPTY(it - 1)
    } else {
      // The range's last S - 1 steps copy nothing and so skip EMPTY, the only barrier that
      // kept row group 1's warps together: without it, qk_split's pair_sum (into the group's P
      // rows) overwrote what a partner still read in its O += P V of step it - 1 (racecheck:
      // ~68,000 WAR hazards a launch, MLA h_q 128), and without qk_split racecheck still paired
      // the next piece's part walk with its writer (GLA-2). The group's own barrier ends both.
      row_group_sync<Cfg>(wm, kRowGroupThreads);
    }

    // the copies of tile nx and the slots of tile it + S (ping_pong: only while tiles are
    // copied, after EMPTY(it - 1) has ordered them after every reader of the slots overwritten)
    const uint32_t nx_dst = copy_dst(nx);
    const int* nx_slots = slot_ring + (nx % (S + 1)) * T::kSlotPitch;
    if (producer) {
      if constexpr (!T::kInterleaveCopies) {
        if (copy_next) T::Copy::issue_all(args, nx_dst, nx_slots, head, ptid);
        cp_async_commit();
      }
      if (!PP || it == 0 || copy_next) {
        pf.store(args, slot_ring + ((it + S) % (S + 1)) * T::kSlotPitch, tile_begin + it + S, slot_tid);
        pf.load(ss, tile_begin + it + S + 1, slot_tid);
      }
    }

    uint32_t kv_tile;
    if constexpr (T::kRaw) {
      dequant_tile<Cfg, typename T::KVRows, T::kThreads>(raw_base + (it % S) * T::kRawTileBytes, kv_base, tid);
      __syncthreads();
      kv_tile = kv_base;
    } else {
      kv_tile = kv_base + (it % S) * T::kKVTileBytes;
    }
    const int* slots = slot_ring + (it % (S + 1)) * T::kSlotPitch;
    const int pos0 = (tile_begin + it) * N;

    // S = Q K^T (qk_split: the pair's partial blocks, summed by pair_sum)
    typename T::Copy::Cursor nx_cursor;
    if constexpr (T::kInterleaveCopies) {
      if (producer) nx_cursor = T::Copy::cursor(args, nx_slots, head, ptid);
    }
    auto copy_part = [&](auto j) {
      if constexpr (T::kInterleaveCopies && decltype(j)::value < T::kCopySteps) {
        if (copy_next && producer) T::Copy::template issue<decltype(j)::value, T::kCopySteps>(args, nx_dst, nx_cursor, ptid);
      }
    };
    // ping_pong: the producer hands over tile it + 1 (FULL), once its copies have landed
    auto signal_full = [&] {
      if constexpr (PP) {
        if (producer && it + 1 < n_iter) {
          cp_async_wait<0>();  // tile it + 1, copied at the top of this step
          bar_arrive(T::kFullBarrier0 + ((it + 1) & 1), T::kThreads);  // FULL(it + 1); row group 1 sees it after B
        }
      }
    };
    float s[MT][T::kNTS][4];
    if constexpr (T::kQKSplit) {
      float sp[MT][T::kNTQK][4];
      zero(sp);
      qk_tile<Cfg>(sp, q_tile, kv_tile, wm, wn, lane, copy_part);
      const uint32_t xchg = p_tile + T::PRows::bytes(wm * WR);  // the row group's P rows
      pair_sum<Cfg>(s, sp, xchg + wn * T::kPairSlotBytes, xchg + (wn ^ 1) * T::kPairSlotBytes,
                    T::kPairBarrier0 + warp / 2, lane);
    } else {
      zero(s);
      qk_tile<Cfg>(s, q_tile, kv_tile, wm, wn, lane, copy_part);
    }
    if constexpr (T::kInterleaveCopies) cp_async_commit();
    signal_full();

    // mask (raw scores: the scale is folded into the softmax)
    const int col0 = wn * T::kTokPerWarp + 2 * (lane & 3);
    // warp-uniform: the CTA's last tiles (the sequence's end, causal limits), sparse tiles and
    // (rare) dense tiles with a token of a bad page number (paging.cuh's kBadSlot: counted as
    // absent, flagged), which the common path finds in the tile's hole words
    if (Cfg::kSparse || pos0 + N > full_limit || tile_has_hole<T::kHoleWords>(slots + N)) {
      mask(s, [&](int mt, int h, int nt, int j) {
        const int col = col0 + nt * 8 + j;
        return pos0 + col < row_limit[mt][h] && slots[col] >= 0;
      });
    }

    // row max across the row group
    float mx[MT][2];
    warp_row_max(s, mx);
    if constexpr (T::kWarpsN > 1) row_group_reduce<Cfg>(mx, red, wm, wn, lane, [](float a, float b) { return fmaxf(a, b); });  // B

    // P = exp2(S - m'), l, O rescale; P -> shared
    float alpha[MT][2];
    sm.update(s, mx, scale_log2, alpha);
    {
      // Once the running max settles, alpha is 1 for every row: skip the rescale of O.
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) moved = moved || alpha[mt][0] != 1.f || alpha[mt][1] != 1.f;
      if (__any_sync(0xffffffffu, moved)) rescale_rows(o, alpha);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNTS; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm * WR + mt * 16 + (lane >> 2) + 8 * h;
          sts32(p_tile + T::PRows::elem_offset(r, col0 + nt * 8), T::E::pack(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        }
    if constexpr (T::kWarpsN > 1) {
      row_group_sync<Cfg>(wm, kRowGroupThreads);  // C
    } else {
      __syncwarp();
    }

    // O += P V
    pv_tile<Cfg>(o, p_tile, kv_tile, wm, wn, lane);
  }
  cp_async_wait<0>();

  // ---- epilogue: total l across the row group, normalise, write out/lse or the partials (the
  // rows and slots of core/work.cuh)
  float l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) l[mt][h] = quad_sum(sm.l[mt][h]);
  if constexpr (T::kWarpsN > 1) {
    __syncthreads();  // every warp is past its last read of `red`
    row_group_reduce<Cfg>(l, red, wm, wn, lane, [](float a, float b) { return a + b; });
  }

  // The CTA's work again, from shared memory (stashed before barrier A of step 0).
  const CtaWork<Cfg> we = unstash_work<Cfg>(smem + T::kWorkOff);
  const bool direct = we.slot < 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = we.mb * M + wm * WR + mt * 16 + (lane >> 2) + 8 * h;
      if (R >= we.rows_total) continue;
      const int t = we.row_token(R);
      const int hq = we.row_query_head(R);
      const float inv = l[mt][h] > 0.f ? 1.f / l[mt][h] : 0.f;
      const float lse = row_lse(sm.m[mt][h], l[mt][h]);
      const long long qrow = we.out_row(s_q, t, hq);
      const int c0 = wn * T::kColsPerWarp + 2 * (lane & 3);
      if (direct) {
        auto* out = static_cast<typename T::E::T*>(args.out) + qrow * Cfg::kDV;
#pragma unroll
        for (int n = 0; n < T::kNTO; ++n)
          *reinterpret_cast<uint32_t*>(out + c0 + n * 8) = T::E::pack(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        if (wn == 0 && (lane & 3) == 0) args.lse[we.lse_index(s_q, t, hq)] = lse;
      } else {
        const long long prow = we.partial_row(args, t, hq);
        float* out = args.partial_out + prow * Cfg::kDV;
#pragma unroll
        for (int n = 0; n < T::kNTO; ++n)
          *reinterpret_cast<float2*>(out + c0 + n * 8) = make_float2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        if (wn == 0 && (lane & 3) == 0) args.partial_lse[prow] = lse;
      }
    }
}

// ------------------------------------------------------------------------------------------
// The kernels. Split mode: one CTA per (lane, split, sequence), lane fastest, so the CTAs that
// share a sequence's KV tiles run together and share them in L2. Part mode (num_parts > 0): one
// CTA per (lane, part), the lanes of a part walking its pieces together (schedule.cuh). Two
// kernels, not one with a loop that split mode leaves after one pass: inside such a loop the
// main loop recomputed its copy offsets every step (MLA h_q 128: 991 -> 1066 instructions per
// KV step, H200: -5%; as its own kernel the part walk's main loop is 1002).

template <class Cfg>
__global__ void __launch_bounds__(DecodeTraits<Cfg>::kThreads, 1) decode_kernel(const __grid_constant__ AttnccArgs args) {
  decode_tiles<Cfg>(args, CtaWork<Cfg>::of_split(args, blockIdx.x));
}

template <class Cfg>
__global__ void __launch_bounds__(DecodeTraits<Cfg>::kThreads, 1) decode_parts_kernel(const __grid_constant__ AttnccArgs args) {
  using T = DecodeTraits<Cfg>;
  using W = CtaWork<Cfg>;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const walk = smem + T::kWorkOff + T::kWalkOffset;
  if (threadIdx.x < 32) {
    bool whole;
    const PartWalk pw = start_part_walk<Cfg>(args, blockIdx.x / W::lanes(args.s_q), threadIdx.x, whole);
    if (threadIdx.x == 0) {
      stash(walk, pw);
      stash_ints(smem + T::kWorkOff + T::kWholeOffset, whole ? 1 : 0);
      open_ready<Cfg>(args);  // core/ready.cuh
    }
  }
  __syncthreads();
  // Nothing is carried in registers from one piece to the next: the walk is in shared memory
  // and the block index is read afresh.
  for (;;) {
    const PartWalk pw = unstash_walk(walk);
    if (!walk_has_piece<Cfg>(args, pw)) break;
    decode_tiles<Cfg>(args, W::of_piece(args, fresh_ctaid() % W::lanes(args.s_q), walk_piece<Cfg>(args, pw)));
    fence_partials<Cfg>(args);
    __syncthreads();  // every thread is past the piece's epilogue and its last shared read
    if (threadIdx.x == 0) {
      PartWalk next = unstash_walk(walk);
      mark_ready<Cfg>(args, walk_piece<Cfg>(args, next).slot);
      walk_next<Cfg>(args, next);
      stash(walk, next);
    }
    __syncthreads();
  }
  // whether the parts hold whole sequences, for the combine (core/ready.cuh), before any thread
  // lets it launch (here, not in the prologue: gla_g96's parts kernel spilled 8 bytes there)
  if (threadIdx.x == 0) publish_whole_parts<Cfg>(args, unstash_int(smem + T::kWorkOff + T::kWholeOffset, 0) != 0);
  __syncthreads();
  close_parts<Cfg>(args);
}

}  // namespace attncc
