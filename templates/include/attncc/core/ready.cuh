// attncc/core/ready.cuh: part mode's ready words, one per (partial slot, lane), through which
// the combine merges a sequence as soon as its pieces are written instead of after the whole
// decode grid: the parts end over ~20 us (bench/RESULTS.md, session 24's timeline), and the SMs
// their CTAs leave run the combine's blocks meanwhile.
//
// The words follow the partial lse in the workspace (abi.h): ready[slot][lane], int32, 2
// num_parts x lanes (CtaWork::lanes) of them. Each is written only by the decode CTA (part p,
// lane l) whose part holds the slot (2 p or 2 p + 1):
//   at its start  ready[2 p][l] = ready[2 p + 1][l] = 0, fenced, by the one thread that then
//                 lets the combine launch (griddepcontrol.launch_dependents; no other thread of
//                 the CTA issues it before): no combine block can see the word of an earlier call;
//   after a piece whose partials it wrote (slot s)  every writer fences its stores, the writers
//                 meet, then one thread stores ready[s][l] = 1 (release, gpu scope).
// A combine block of a sequence that crosses parts waits (acquire, gpu scope) for the words of
// all its pieces' slots and lanes, then merges. The word of a part's second slot (2 p + 1) is
// cleared even where the part has no such piece: nothing reads it.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/work.cuh"

namespace attncc {

// Whether a part-mode launch uses the ready words: where the plan has them (the lowering's
// ready_words: sparse plans, attncc/families/base.py) and its sequences are at least as many as
// its parts. Then most parts hold whole sequences, a boundary's pieces end with their two parts,
// at different times over the grid's tail, and their merges fill it. Where parts outnumber
// sequences, each sequence's merge waits for the last of its many parts anyway (H200, MLA b = 1,
// 66 parts: 31.9 -> 40.1 us with them, b = 8: 1.3 % slower; bench/RESULTS.md, session 26), and
// the combine waits for the decode grid as in split mode. Decode and combine kernels decide
// alike, from the call's arguments.
template <class Cfg>
__host__ __device__ __forceinline__ bool ready_words_on(const AttnccArgs& a) {
  return Cfg::kReadyWords && dependent_launch<Cfg>() && a.num_parts > 0 && CtaWork<Cfg>::num_seqs(a) >= a.num_parts;
}

// The words, and the word of slot `slot`, lane `lane`.
template <class Cfg>
__device__ __forceinline__ int* ready_words_at(float* partial_lse, int s_q, int parts) {
  return reinterpret_cast<int*>(partial_lse + 2LL * parts * s_q * Cfg::kHeadsQ);
}
template <class Cfg>
__device__ __forceinline__ int* ready_words(const AttnccArgs& a) {
  return ready_words_at<Cfg>(a.partial_lse, a.s_q, a.num_parts);
}
template <class Cfg>
__device__ __forceinline__ int* ready_word(const AttnccArgs& a, int slot, int lane) {
  return ready_words<Cfg>(a) + slot * CtaWork<Cfg>::lanes(a.s_q) + lane;
}

// The word after them says whether the parts hold whole sequences (schedule.cuh), for the
// combine's blocks, which then have nothing to merge, without a scan of the lengths each: 1, or 0
// (cut). Sparse plans need none: their sequences (queries) all have top-k's tiles, so the
// arguments tell (equal_whole_parts); they are the plans with ready words, whose combine launches
// as the decode CTAs start. Other plans' combine launches once every decode CTA has let it (at the
// CTA's end, close_parts): where the sequences are enough for whole parts (whole_parts_possible;
// else neither kernel touches the word), each CTA writes it (all the same value, from the lengths)
// and fences it first, so that a combine block reads this call's value at once (at the L2: a
// block's L1 may hold an earlier call's).
template <class Cfg>
__device__ __forceinline__ int* whole_word_at(float* partial_lse, int s_q, int parts) {
  return ready_words_at<Cfg>(partial_lse, s_q, parts) + 2 * parts * CtaWork<Cfg>::lanes(s_q);
}
template <class Cfg>
__device__ __forceinline__ void publish_whole_parts(const AttnccArgs& a, bool whole) {
  static_assert(!Cfg::kReadyWords || Cfg::kSparse, "the word is written as the CTA ends: for a combine launched after that");
  if constexpr (!Cfg::kSparse && Cfg::kWholeParts) {
    if (!whole_parts_possible(CtaWork<Cfg>::num_seqs(a), a.num_parts)) return;  // as part_line and the reader below ask
    *whole_word_at<Cfg>(a.partial_lse, a.s_q, a.num_parts) = whole ? 1 : 0;
    __threadfence();
  }
}
template <class Cfg>
__device__ __forceinline__ bool whole_parts_for_combine(const AttnccArgs& a) {
  using W = CtaWork<Cfg>;
  if constexpr (!Cfg::kWholeParts) {
    return false;
  } else if constexpr (Cfg::kSparse) {
    return equal_whole_parts(W::num_seqs(a), static_cast<int>(line_length(ceil_div(Cfg::kTopK, Cfg::kTileN), Cfg::kPieceCostTiles)),
                             a.num_parts, W::whole_slack_tiles(a));
  } else {
    return whole_parts_possible(W::num_seqs(a), a.num_parts) &&
           load_acquire_gpu(whole_word_at<Cfg>(a.partial_lse, a.s_q, a.num_parts)) == 1;
  }
}

// The decode's part kernels, in order:
// at the start, one thread of the CTA (part, lane from the block index): with ready words, its
// words cleared and the combine let launch (no other thread of the CTA issues the trigger).
template <class Cfg>
__device__ __forceinline__ void open_ready(const AttnccArgs& a) {
  if (!ready_words_on<Cfg>(a)) return;
  const int lanes = CtaWork<Cfg>::lanes(a.s_q), part = blockIdx.x / lanes, lane = blockIdx.x % lanes;
  int* w = ready_word<Cfg>(a, 2 * part, lane);
  w[0] = 0;      // slot 2 part
  w[lanes] = 0;  // slot 2 part + 1
  __threadfence();
  if constexpr (dependent_launch<Cfg>()) griddep_launch_dependents();
}
// after a piece, every writer of its results, before the writers meet: its partial stores fenced
template <class Cfg>
__device__ __forceinline__ void fence_partials(const AttnccArgs& a) {
  if (ready_words_on<Cfg>(a)) __threadfence();
}
// then one thread, once they have met: the piece's slot marked ready (slot -1: written whole)
template <class Cfg>
__device__ __forceinline__ void mark_ready(const AttnccArgs& a, int slot) {
  if (slot >= 0 && ready_words_on<Cfg>(a)) store_release_gpu(ready_word<Cfg>(a, slot, fresh_ctaid() % CtaWork<Cfg>::lanes(a.s_q)), 1);
}
// at the end, the CTA's threads, its results written: without ready words, the combine let
// launch only now
template <class Cfg>
__device__ __forceinline__ void close_parts(const AttnccArgs& a) {
  if constexpr (dependent_launch<Cfg>()) {
    if (!ready_words_on<Cfg>(a)) griddep_launch_dependents();
  }
}

// Combine, one warp: until the words of every lane of every slot of `sp`'s pieces are set.
template <class Cfg>
__device__ __forceinline__ void wait_ready(const AttnccArgs& a, const SeqPieces& sp, int lane) {
  const int lanes = CtaWork<Cfg>::lanes(a.s_q);
  const int* words = ready_words<Cfg>(a);
  const int n = (sp.last - sp.first + 1) * lanes;
  for (int i = lane; i < n; i += 32) {
    const int slot = sp.slot(sp.first + i / lanes);
    if (slot < 0) continue;  // an empty part: no piece
    const int* w = words + slot * lanes + i % lanes;  // ready_word's, the base out of the loop
    while (load_acquire_gpu(w) == 0) __nanosleep(256);
  }
  __syncwarp();
}

}  // namespace attncc
