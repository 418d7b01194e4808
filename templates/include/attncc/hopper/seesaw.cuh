// attncc/hopper/seesaw.cuh: the consumer warp groups of the Hopper family, the seesaw schedule.
//
// Two warp groups own the same 64 query rows; WG0 the output's columns [0, 256) (O_L), WG1
// [256, 512) (O_R), 128 fp32 accumulators a thread (MLA's value; any two halves of a wgmma N).
// Tiles come in pairs, a and b, in the two stages of a set (stages 2k and 2k + 1; pair i in set
// i % kSets: with two sets the producer fills the next pair's while this one is read); below
// "stage 0/1" is the pair's a/b stage. With c = scale log2(e), m the running row max (shared),
// c_x = 2^(m_old - m_new):
//
//   WG0                                          WG1
//   S_a = Q K_a^T              (wgmma SS)        S_b = Q K_b^T                       (SS)
//   m_a = max(m, rowmax S_a c); c_a              .
//   -> shared (m_a, c_a)              MAX_A ---> m_b = max(m_a, rowmax S_b c); c_b
//   P_a = 2^(S_a c - m_a); l_L = l_L c_a + sum   P_b = 2^(S_b c - m_b); l_R = l_R c_a c_b + sum
//   P_a -> shared                     P_A        P_b, c_b, m_b -> shared
//   O_L = O_L c_a + P_a V_a[:, L]  (RS)    |     P_B <---
//   release stage 0 (early)                +---> O_R = O_R c_a + P_a V_a[:, R]      (SS)
//   O_L, l_L *= c_b; m = m_b                     release stage 0 (late)
//   O_L += P_b V_b[:, L]  (SS); release 1        O_R = O_R c_b + P_b V_b[:, R] (RS); release 1
//
// so both products of each tile are computed once and stage 0 is free in the middle of the
// pair: the producer refills it while stage 1 is still read, and WG0's next S_a, on a stage that
// has landed, runs while WG1 waits for stage 1 (the groups drift half a pair apart, one's softmax
// under the other's products). (P_a stored unscaled, at m_a, and WG1 rescaling O_R before and
// after P_a V_a, is what lets WG1 take P_a first: P_a c_b would wait for WG1's own P_b.) A
// stage's late group is released by both groups (EMPTY late counts 256): WG1 for the value's
// right half, WG0 for stage 1's P box (it reads P_b there) and, for symmetry, stage 0's.
//
// Value first (kValueFirst: where the producer sets the pace, converting fp8 tiles, or copying
// paged 16-bit tiles by cp.async for a call of few rows, the plan's second form, hopper/launch.cuh):
// WG1 takes its products of tile a before S_b, as soon as MAX_A and P_A are handed:
//
//   WG1: O_R = O_R c_a + P_a V_a[:, R] (SS); release stage 0 (late); S_b = Q K_b^T; m_b, c_b;
//        P_b, c_b, m_b -> shared (P_B); O_R = O_R c_b + P_b V_b[:, R] (RS); release 1
//
// the same sums in the same order (O_R's rescales by c_a and c_b around P_a V_a, l_R's by both),
// so the outputs are bitwise those of the order above; stage 0 is free before tile b lands, and
// the producer, which now waits for nothing else, refills it right after converting b.
//
// kSkipUnmoved (hopper.py's skip_unmoved): each rescale of O above is skipped by a warp whose
// 16 rows all kept their max (every c == 1: O c is O bit for bit), by a vote (scale_rows_if_moved).
//
// MAX_A, P_B and P_A are mbarriers (traits.cuh): the handing group's 128 threads arrive
// (release), the other group waits on the pair's phase (acquire), so the shared row state and P
// pass between the groups by a handoff compute-sanitizer's racecheck can follow (it does not
// model bar.arrive's release: bench/racecheck_probe.cu). No group can arrive at a
// handoff twice before the other has waited on it: each arrival of pair i + 1 follows, in its
// group, a wait that needs the other group past pair i's wait. An odd last tile has
// no b: WG1 skips its products and passes c_b = 1. At the end l = l_L + l_R (shared) and each
// group writes its half: out = O / l, lse = (m + log2 l) ln 2, or the partials.
//
// Trace events (core/trace.cuh; bench/clock_trace.py), per pair, thread 0 of each group: 0 the pair's
// start, 1 S's boxes landed, 2 S done, 3 the row maxima handed (WG0) or
// taken (WG1), 4 P handed, 5 WG0: O_L += P_a V_a done / WG1: P_A taken, 6 WG0: P_B taken / WG1:
// O_R += P_a V_a done, 7 the pair's last product done (value first, WG1: 0 3 5 6 1 2 4 7 in time).
//
// Scores are masked (-inf) past each row's causal limit and for tokens without a slot (the
// producer's flags); a fully masked row keeps m = -inf and P = 0. P goes into the key-only box
// kPBox of its own tile's stage: only S = Q K^T reads those columns, and it is done.
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

// One consumer warp group's part of a piece: n_iter tiles from tile_begin, rows of `w`; `pr`:
// where the stream of tiles stands before this piece (traits.cuh).
template <class Cfg>
__device__ __forceinline__ void consume(const AttnccArgs& a, const CtaWork<Cfg>& w, int n_iter, int kv_len, uint32_t sbase,
                                        unsigned char* smem, int wg, int t, Progress<Cfg::kStages>& pr) {
  using T = HopperTraits<Cfg>;
  constexpr int kAcc = T::kAcc;
  const Frag f(t);
  static_assert(Cfg::kTileM == RowState::kRows, "row state of 64 rows");
  const RowState rs(sbase + Cfg::kRowsOff);
  const int s_q = a.s_q;

  float o[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  int row_limit[2];
  row_limits(w, f, w.mb * Cfg::kTileM, kv_len, s_q, row_limit);
  // positions below full_limit are visible to every row (the first row has the smallest token)
  const int full_limit = w.token_limit(w.row_token(w.mb * Cfg::kTileM), kv_len, s_q);
  const float c = a.softmax_scale * kLog2e;
  // producer_q (kernel.cuh: produce_q): this group is past its last S = Q K^T of the piece
  // (scores waits for it), so the producer may copy the next piece's Q rows (Q_EMPTY counts both
  // groups) under the last products and the epilogue
  auto release_q = [&]() {
    if constexpr (Cfg::kProducerQ) mbarrier_arrive(T::q_empty(sbase));
  };
  auto scale_o = [](float(&acc)[kAcc], const float(&by)[2]) {  // O's rows by c_a or c_b (kSkipUnmoved: by a vote)
    if constexpr (Cfg::kSkipUnmoved) scale_rows_if_moved(acc, by); else scale_rows(acc, by);
  };

  for (int it = 0; it < n_iter; it += 2, ++pr.pairs) {
    const bool has_b = it + 1 < n_iter;
    const int pair = pr.pairs & 1;  // the handoffs' phase: one per pair (of this and earlier pieces)
    const int sa = 2 * (pr.pairs % T::kSets), sb = sa + 1;  // the stages of tiles a and b
    const uint32_t p_box_a = T::stage_box(sbase, sa, T::kPBox), p_box_b = T::stage_box(sbase, sb, T::kPBox);  // P_a, P_b
    float s[32];
    float mx[2], sum[2], ca[2], cb[2];
    uint32_t pa[Cfg::kTileN / 16][4];
    if (wg == 0) {
      const int parity = pr.parity(sa);
      ATTNCC_TRACE(t == 0, 0, pr.pairs, 0);
      scores<Cfg>(s, sbase + Cfg::kQOff, sbase, sa, parity, pr.pairs);
      ATTNCC_TRACE(t == 0, 0, pr.pairs, 2);
      if (it + 2 >= n_iter) release_q();
      mbarrier_wait(T::flags_bar(sbase, sa), parity);
      mask_and_max<Cfg>(s, mx, f, (w.tile_begin + it) * Cfg::kTileN, full_limit, row_limit, sbase + T::stage_flags(sa));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[h], mx[h] * c);
        ca[h] = rescale_factor(m[h], m_new);
        m[h] = m_new;
        if (f.q == 0) rs.set_m(f.r + 8 * h, m_new), rs.set_ca(f.r + 8 * h, ca[h]);
      }
      mbarrier_arrive(T::max_a(sbase));  // MAX_A
      ATTNCC_TRACE(t == 0, 0, pr.pairs, 3);
      exponentiate<Cfg>(s, m, c, sum);
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] = l[h] * ca[h] + sum[h];
      store_p<Cfg>(p_box_a, s, f);  // P_a, at m_a
      fence_async_shared();
      mbarrier_arrive(T::p_a(sbase));  // P_A
      ATTNCC_TRACE(t == 0, 0, pr.pairs, 4);
      scale_o(o, ca);
      pack_p<Cfg>(s, pa);
      pv_rs<Cfg>(o, pa, T::stage_box(sbase, sa, 0));  // O_L += P_a V_a[:, L]
      ATTNCC_TRACE(t == 0, 0, pr.pairs, 5);
      release_stage<Cfg>(T::empty_early(sbase, sa), sbase);
      release_stage<Cfg>(T::empty_late(sbase, sa), sbase);
      mbarrier_wait(T::p_b(sbase), pair);  // P_B
      ATTNCC_TRACE(t == 0, 0, pr.pairs, 6);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        cb[h] = rs.cb(f.r + 8 * h);
        m[h] = rs.m(f.r + 8 * h);
        l[h] *= cb[h];
      }
      __syncwarp();  // the quad's reads of m_b before its first lane writes the next m_a
      scale_o(o, cb);
      if (has_b) {
        pv_ss<Cfg>(o, p_box_b, T::stage_box(sbase, sb, 0));  // O_L += P_b V_b[:, L]
        ATTNCC_TRACE(t == 0, 0, pr.pairs, 7);
        release_stage<Cfg>(T::empty_early(sbase, sb), sbase);
        release_stage<Cfg>(T::empty_late(sbase, sb), sbase);
      }
    } else {
      // WG1's steps, in either order below
      auto scores_b = [&]() {  // S_b and its row maxima
        if (has_b) {
          const int parity = pr.parity(sb);
          scores<Cfg>(s, sbase + Cfg::kQOff, sbase, sb, parity, pr.pairs);
          ATTNCC_TRACE(t == 0, 1, pr.pairs, 2);
          mbarrier_wait(T::flags_bar(sbase, sb), parity);
          mask_and_max<Cfg>(s, mx, f, (w.tile_begin + it + 1) * Cfg::kTileN, full_limit, row_limit,
                            sbase + T::stage_flags(sb));
        } else {
          mx[0] = mx[1] = -INFINITY;
        }
        if (it + 2 >= n_iter) release_q();  // the group's last S of the piece
      };
      auto take_max_a = [&]() {  // m_a and c_a, handed by WG0
        mbarrier_wait(T::max_a(sbase), pair);  // MAX_A
        ATTNCC_TRACE(t == 0, 1, pr.pairs, 3);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m[h] = rs.m(f.r + 8 * h);  // m_a
          ca[h] = rs.ca(f.r + 8 * h);
        }
      };
      auto rescale_b = [&]() {  // m_b = max(m_a, rowmax S_b c), c_b
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float m_new = fmaxf(m[h], mx[h] * c);
          cb[h] = rescale_factor(m[h], m_new);
          m[h] = m_new;
        }
      };
      auto p_b = [&]() {  // P_b into its box and packed for O_R += P_b V_b
        if (has_b) {
          exponentiate<Cfg>(s, m, c, sum);
          store_p<Cfg>(p_box_b, s, f);
          pack_p<Cfg>(s, pa);
        } else {
          sum[0] = sum[1] = 0.f;
        }
      };
      auto hand_p_b = [&]() {  // l_R; m_b, c_b and P_b to WG0
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          l[h] = l[h] * ca[h] * cb[h] + sum[h];
          if (f.q == 0) rs.set_m(f.r + 8 * h, m[h]), rs.set_cb(f.r + 8 * h, cb[h]);
        }
        fence_async_shared();
        mbarrier_arrive(T::p_b(sbase));  // P_B
        ATTNCC_TRACE(t == 0, 1, pr.pairs, 4);
      };
      auto pv_a = [&]() {  // O_R += P_a V_a[:, R], then stage a's late boxes released
        mbarrier_wait(T::p_a(sbase), pair);  // P_A
        ATTNCC_TRACE(t == 0, 1, pr.pairs, 5);
        pv_ss<Cfg>(o, p_box_a, T::stage_box(sbase, sa, T::kOut));
        ATTNCC_TRACE(t == 0, 1, pr.pairs, 6);
        release_stage<Cfg>(T::empty_late(sbase, sa), sbase);
      };
      auto pv_b = [&]() {  // O_R += P_b V_b[:, R], then stage b's late boxes released
        if (has_b) {
          pv_rs<Cfg>(o, pa, T::stage_box(sbase, sb, T::kOut));
          ATTNCC_TRACE(t == 0, 1, pr.pairs, 7);
          release_stage<Cfg>(T::empty_late(sbase, sb), sbase);
        }
      };
      ATTNCC_TRACE(t == 0, 1, pr.pairs, 0);
      if constexpr (Cfg::kValueFirst) {
        // O_R c_a + P_a V_a[:, R] as soon as P_a is handed, which releases stage a's late boxes
        // before tile b lands (the producer refills a while it converts b); then S_b
        take_max_a();
        scale_o(o, ca);
        pv_a();
        scores_b();
        rescale_b();
        p_b();
        __syncwarp();  // the quad's reads of m_a and c_a before its first lane overwrites m
        hand_p_b();
        scale_o(o, cb);
        pv_b();
      } else {
        scores_b();
        take_max_a();
        rescale_b();
        __syncwarp();  // the quad's reads of m_a and c_a before its first lane overwrites m
        p_b();
        hand_p_b();
        scale_o(o, ca);
        pv_a();
        scale_o(o, cb);
        pv_b();
      }
    }
    pr.used(sa);
    if (has_b) pr.used(sb);
  }
  if (n_iter == 0) release_q();  // a piece of no tile: no S read Q

  // ---- epilogue: l = l_L + l_R, then each group's half of out (or of the partials)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (f.q == 0) rs.set_l(wg, f.r + 8 * h, l[h]);
  }
  bar_sync(Cfg::kConsumerBarrier, 2 * kGroupThreads);
  const CtaWork<Cfg> we = unstash_work<Cfg>(smem + Cfg::kWorkOff);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = we.mb * Cfg::kTileM + f.r + 8 * h;
    if (R >= we.rows_total) continue;
    const float lt = rs.l(0, f.r + 8 * h) + rs.l(1, f.r + 8 * h);
    write_row<Cfg, 0, kAcc>(a, we, o, h, R, lt > 0.f ? 1.f / lt : 0.f, row_lse(m[h], lt), wg * T::kOutCols + 2 * f.q,
                            wg == 0 && f.q == 0);
  }
}

}  // namespace hopper
}  // namespace attncc
