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

template <class Cfg>
__device__ __forceinline__ int* ready_words(const AttnccArgs& a) {
  return reinterpret_cast<int*>(a.partial_lse + 2LL * a.num_parts * a.s_q * Cfg::kHeadsQ);
}

__device__ __forceinline__ void store_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Decode, part `part`'s CTA of lane `lane`, one thread, before the CTA lets the combine launch.
template <class Cfg>
__device__ __forceinline__ void clear_ready(const AttnccArgs& a, int part, int lane) {
  int* w = ready_words<Cfg>(a) + 2 * part * CtaWork<Cfg>::lanes(a.s_q) + lane;
  w[0] = 0;
  w[CtaWork<Cfg>::lanes(a.s_q)] = 0;
  __threadfence();
}

// Decode, one thread, once every writer of slot `slot`'s partials has fenced its stores
// (__threadfence) and the writers have met at a barrier.
template <class Cfg>
__device__ __forceinline__ void mark_ready(const AttnccArgs& a, int slot, int lane) {
  store_release_gpu(ready_words<Cfg>(a) + slot * CtaWork<Cfg>::lanes(a.s_q) + lane, 1);
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
    const int* w = words + slot * lanes + i % lanes;
    while (load_acquire_gpu(w) == 0) __nanosleep(256);
  }
  __syncwarp();
}

}  // namespace attncc
