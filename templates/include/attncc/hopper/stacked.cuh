// attncc/hopper/stacked.cuh: the consumer warp groups of the Hopper family, the stacked schedule
// (a value of at most 256 columns: one warp group holds its whole 64 x d_v fp32 output).
//
// A CTA has 128 rows of one kv head. Where it holds more than 64 of them (rows mode), warp group
// g takes rows [64 g, 64 g + 64) over every tile of the stream: each token is read once for 128
// rows (FA3's schedule for GLA: a kv head's 64 query heads at s_q 2). Where it holds 64 or fewer
// (split mode: s_q 1), both groups take rows [0, 64) and tile k of the stream goes to group k % 2;
// at the end they merge their (O, m, l). Per tile, in one group (tile.cuh), with c = scale log2(e):
//
//   S = Q_g K^T                  (wgmma SS, box by box as FULL says each landed)
//   mask; m' = max(m, rowmax S c); r = 2^(m - m'); P = 2^(S c - m'); l = l r + rowsum P
//   O = O r + P V                (wgmma RS: P from registers)
//   release the stage (EMPTY early: both groups' arrivals, or the reading group's twice)
//
// The two groups run independently (no handoff), so one's softmax runs under the other's
// products. With the overlap (rows mode; FA3's order within a group) a group also hides its own
// softmax: with P_i in registers it issues S_{i+1} = Q K_{i+1}^T and O += P_i V_i together, and
// runs tile i + 1's softmax once S_{i+1} is done, under P_i V_i (O's rescale by r_{i+1} waits for
// the next round, before P_{i+1} V_{i+1}). It holds S_{i+1} beside P_i: 232 registers a consumer.
//
// The stream index k of a tile (Progress::tiles) counts across the pieces a CTA walks, which both
// roles share: stage k % kStages, its barriers' phase the stage's parity bit, and in
// split mode the reading group k % 2 (a piece-local index would give a stage's consecutive
// tiles to whichever group, and a model of it deadlocked). With an odd number of stages a stage's
// consecutive tiles then belong to different groups: a group waits for the release of the stage's
// previous tile before its own tile's FULL (the loop below; tests/test_stage_protocol.py models why).
//
// Split-mode merge, through the Q tile (both groups are past their last S = Q K^T): each group
// writes the half of O that the other finishes, and its (m, l); then group g scales and adds
// the columns [g d_v / 2, (g + 1) d_v / 2): O = O_0 2^(m_0 - m) + O_1 2^(m_1 - m), l likewise.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/softmax.cuh"
#include "attncc/core/work.cuh"
#include "attncc/hopper/barrier.cuh"
#include "attncc/hopper/tile.cuh"
#include "attncc/hopper/traits.cuh"
#include "attncc/hopper/wgmma.cuh"

namespace attncc {
namespace hopper {

// The split-mode exchange in the Q tile: per group, its half of O for the other group (kAcc / 2
// floats a thread, as float4s [j][thread]: conflict-free), then (m, l) of its two rows a thread.
template <class Cfg>
struct Exchange {
  using T = HopperTraits<Cfg>;
  static constexpr int kHalfAcc = T::kAcc / 2;
  static constexpr int kOBytes = kHalfAcc * kGroupThreads * 4;  // one group's half of O
  static constexpr int kBytes = 2 * kOBytes + 2 * kGroupThreads * 16;
  static_assert(kBytes <= Cfg::kQBytes, "the exchange fits the Q tile's region");
  static_assert(kHalfAcc % 4 == 0, "float4s");
  uint32_t base;
  __device__ __forceinline__ explicit Exchange(uint32_t q_tile) : base(q_tile) {}
  __device__ __forceinline__ uint32_t o(int g, int j, int t) const { return base + g * kOBytes + (j * kGroupThreads + t) * 16; }
  __device__ __forceinline__ uint32_t ml(int g, int t) const { return base + 2 * kOBytes + (g * kGroupThreads + t) * 16; }
};

// Group g gives o[kFrom, kFrom + kHalfAcc) (the half the other group finishes).
template <class Cfg, int kFrom, int kAcc>
__device__ __forceinline__ void give_half(const Exchange<Cfg>& x, int g, int t, const float (&o)[kAcc]) {
#pragma unroll
  for (int j = 0; j < Exchange<Cfg>::kHalfAcc / 4; ++j)
    sts128(x.o(g, j, t), make_uint4(__float_as_uint(o[kFrom + 4 * j]), __float_as_uint(o[kFrom + 4 * j + 1]),
                                    __float_as_uint(o[kFrom + 4 * j + 2]), __float_as_uint(o[kFrom + 4 * j + 3])));
}

// o[kFrom, kFrom + kHalfAcc) = o mine + the other group's (given by group `other`) scaled.
template <class Cfg, int kFrom, int kAcc>
__device__ __forceinline__ void take_half(const Exchange<Cfg>& x, int other, int t, float (&o)[kAcc], const float (&mine)[2],
                                          const float (&theirs)[2]) {
#pragma unroll
  for (int j = 0; j < Exchange<Cfg>::kHalfAcc / 4; ++j) {
    const uint4 v = lds128(x.o(other, j, t));
    float* d = o + kFrom + 4 * j;
    d[0] = d[0] * mine[0] + __uint_as_float(v.x) * theirs[0];
    d[1] = d[1] * mine[0] + __uint_as_float(v.y) * theirs[0];
    d[2] = d[2] * mine[1] + __uint_as_float(v.z) * theirs[1];
    d[3] = d[3] * mine[1] + __uint_as_float(v.w) * theirs[1];
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[e])::"memory");  // merged before the next load: 4 registers in flight, not 64
  }
}

// A state's weight in a merge at max m (0 for a state that saw nothing).
__device__ __forceinline__ float merge_weight(float m_state, float m) { return m_state == -INFINITY ? 0.f : fast_exp2(m_state - m); }

// Split mode's end, in group kG: give the other group its half of O and (m, l), take theirs,
// merge the columns [kG d_v / 2, (kG + 1) d_v / 2) and write them (group 0 the lse too).
template <class Cfg, int kG, int kAcc>
__device__ __forceinline__ void merge_split(const AttnccArgs& a, const CtaWork<Cfg>& we, float (&o)[kAcc], const float (&m)[2],
                                            const float (&l)[2], uint32_t sbase, const Frag& f, int t, int row0) {
  using X = Exchange<Cfg>;
  constexpr int kMine = kG * X::kHalfAcc, kTheirs = (1 - kG) * X::kHalfAcc;  // o's first index of each half
  const X x(sbase + Cfg::kQOff);
  // each group runs its own instantiation of this function: the barriers are unaligned (ptx.cuh)
  bar_sync_unaligned(Cfg::kConsumerBarrier, 2 * kGroupThreads);  // both groups past their last S: the Q tile is free
  give_half<Cfg, kTheirs>(x, kG, t, o);
  sts128(x.ml(kG, t), make_uint4(__float_as_uint(m[0]), __float_as_uint(m[1]), __float_as_uint(l[0]), __float_as_uint(l[1])));
  bar_sync_unaligned(Cfg::kConsumerBarrier, 2 * kGroupThreads);
  const uint4 other = lds128(x.ml(1 - kG, t));
  const float m_o[2] = {__uint_as_float(other.x), __uint_as_float(other.y)}, l_o[2] = {__uint_as_float(other.z), __uint_as_float(other.w)};
  float mine[2], theirs[2], lt[2], mt[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mt[h] = fmaxf(m[h], m_o[h]);
    mine[h] = merge_weight(m[h], mt[h]);
    theirs[h] = merge_weight(m_o[h], mt[h]);
    lt[h] = l[h] * mine[h] + l_o[h] * theirs[h];
  }
  take_half<Cfg, kMine>(x, 1 - kG, t, o, mine, theirs);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = row0 + f.r + 8 * h;
    if (R < we.rows_total)
      write_row<Cfg, kMine, kMine + X::kHalfAcc>(a, we, o, h, R, lt[h] > 0.f ? 1.f / lt[h] : 0.f, row_lse(mt[h], lt[h]), 2 * f.q,
                                                 kG == 0 && f.q == 0);
  }
}

// One consumer warp group's part of a piece: n_iter tiles from tile_begin; `pr`: where the
// stream of tiles stands before this piece (traits.cuh).
template <class Cfg>
__device__ __forceinline__ void consume_stacked(const AttnccArgs& a, const CtaWork<Cfg>& w, int n_iter, int kv_len, uint32_t sbase,
                                                unsigned char* smem, int wg, int t, Progress<Cfg::kStages>& pr) {
  using T = HopperTraits<Cfg>;
  constexpr int kAcc = T::kAcc;
  static_assert(!T::kSeesaw, "the stacked schedule's plan");
  const Frag f(t);
  const int s_q = a.s_q;
  const bool split = w.rows_total - w.mb * Cfg::kTileM <= T::kGroupRows;  // the same in both groups
  const int row0 = w.mb * Cfg::kTileM + (split ? 0 : wg * T::kGroupRows);  // the group's first CTA row
  const uint32_t q = sbase + Cfg::kQOff + (split ? 0 : wg * T::kGroupRows * 128);

  float o[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  int row_limit[2];
  row_limits(w, f, row0, kv_len, s_q, row_limit);
  // positions below full_limit are visible to every row of the group (its first row has the smallest token)
  const int full_limit = w.token_limit(w.row_token(row0), kv_len, s_q);
  const float c = a.softmax_scale * kLog2e;

  const int take = split ? wg : -1;  // split mode: the parity of the stream's tiles this group reads
  // Tile `it`'s softmax on its scores s (from stage st): P in s (fp32), its rows' rescale of O in r
  const auto softmax = [&](float (&s)[32], int it, int st, float (&r)[2]) {
    float mx[2], sum[2];
    mask_and_max<Cfg>(s, mx, f, (w.tile_begin + it) * Cfg::kTileN, full_limit, row_limit, sbase + T::stage_flags(st));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], mx[h] * c);
      r[h] = rescale_factor(m[h], m_new);
      m[h] = m_new;
    }
    exponentiate<Cfg>(s, m, c, sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * r[h] + sum[h];
  };
  if (Cfg::kOverlap && !split) {
    // overlap (rows mode, FA3's order): with tile i's P in registers, tile i + 1's S = Q K^T and
    // O += P_i V_i are issued together, tile i + 1's softmax runs once its S is done, under P_i V_i
    float s[32], r[2];
    uint32_t p[Cfg::kTileN / 16][4];
    if (n_iter > 0) {
      scores<Cfg>(s, q, sbase, pr.stage, pr.parity(pr.stage));
      mbarrier_wait(T::flags_bar(sbase, pr.stage), pr.parity(pr.stage));
      softmax(s, 0, pr.stage, r);
      pack_p<Cfg>(s, p);
    }
    // tiles 0 .. n_iter - 2: no branch between a wgmma and its wait (ptxas serializes every wgmma of the
    // kernel otherwise, C7514)
    for (int it = 0; it + 1 < n_iter; ++it, pr.next_tile()) {
      const int st = pr.stage, next = st + 1 == Cfg::kStages ? 0 : st + 1;  // (st's FULL: waited a round ago)
      const int next_parity = pr.parity(next);
      pr.used(st);
      float sn[32];
      scale_rows(o, r);
      scores_issue<Cfg>(sn, q, sbase, next, next_parity);  // S_{i+1}
      mbarrier_wait(T::flags_bar(sbase, next), next_parity);
      pv_rs_issue<Cfg>(o, p, T::stage_box(sbase, st, T::kValueBox));  // O += P_i V_i
      wait_group<1>();  // S_{i+1}
      pin(sn);
      softmax(sn, it + 1, next, r);
      wait_group<0>();  // P_i V_i
      pin(o);
      pin(p);
      mbarrier_arrive(T::empty_early(sbase, st), 1);
      pack_p<Cfg>(sn, p);  // P_{i+1}
    }
    if (n_iter > 0) {  // the last tile's O += P V
      const int st = pr.stage;
      pr.used(st);
      scale_rows(o, r);
      pv_rs<Cfg>(o, p, T::stage_box(sbase, st, T::kValueBox));
      mbarrier_arrive(T::empty_early(sbase, st), 1);
      pr.next_tile();
    }
  } else {
    for (int it = 0; it < n_iter; ++it, pr.next_tile()) {
      const int st = pr.stage;
      const int parity = pr.parity(st);
      pr.used(st);
      // warp-uniform as the compiler sees it (wgmma under a branch it cannot prove so is serialized)
      const bool mine = __shfl_sync(0xffffffffu, static_cast<int>(take < 0 || (pr.tiles & 1) == take), 0) != 0;
      if (!mine) continue;
      // Split mode: the stage's last tile was the other group's (an odd number of stages), whose
      // phases of FULL and FLAGS this group never waited for. A parity wait cannot tell phase n from
      // n + 2: while that tile is still landing the wait below would return at once and read it. So
      // first the other group's release of that tile (EMPTY, the phase the producer waited for before
      // filling this one): then this tile's phases are the next ones. (Without it, GLA-2 s_q 1 gave
      // different outputs call to call and failed launches at b = 128: bench/RESULTS.md, session 35.)
      if (split) mbarrier_wait(T::empty_early(sbase, st), parity ^ 1);
      float s[32], r[2];
      uint32_t p[Cfg::kTileN / 16][4];
      scores<Cfg>(s, q, sbase, st, parity);
      mbarrier_wait(T::flags_bar(sbase, st), parity);
      softmax(s, it, st, r);
      scale_rows(o, r);
      pack_p<Cfg>(s, p);
      pv_rs<Cfg>(o, p, T::stage_box(sbase, st, T::kValueBox));  // O += P V
      mbarrier_arrive(T::empty_early(sbase, st), split ? 2 : 1);
    }
  }

  // ---- epilogue
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  const CtaWork<Cfg> we = unstash_work<Cfg>(smem + Cfg::kWorkOff);
  const int row0_e = we.mb * Cfg::kTileM + (take < 0 ? wg * T::kGroupRows : 0);  // row0, not held through the loop
  if (take < 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = row0_e + f.r + 8 * h;
      if (R < we.rows_total) write_row<Cfg, 0, kAcc>(a, we, o, h, R, l[h] > 0.f ? 1.f / l[h] : 0.f, row_lse(m[h], l[h]), 2 * f.q, f.q == 0);
    }
    return;
  }
  // one instantiation per group, so that the half it gives away is dead after giving it
  if (wg == 0) {
    merge_split<Cfg, 0>(a, we, o, m, l, sbase, f, t, row0_e);
  } else {
    merge_split<Cfg, 1>(a, we, o, m, l, sbase, f, t, row0_e);
  }
}

}  // namespace hopper
}  // namespace attncc
