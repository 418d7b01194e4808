// attncc/hopper/relay.cuh: the consumer warp groups of the Hopper family, the relay schedule
// (FlashMLA's sparse fp8 decode's division of the work).
//
// Two warp groups own the same 64 query rows; WG0 the output's columns [0, 256) (O_L), WG1
// [256, 512) (O_R), as in the seesaw (seesaw.cuh), but only WG0 computes scores. Per tile x, in
// stage s (tiles in pairs a, b in the two stages of the plan's one set, as the seesaw's, so the
// producer's order and the handoffs' phases are the seesaw's), with c = scale log2(e), m the
// running row max (WG0's registers), c_x = 2^(m_old - m_new):
//
//   WG0                                                    WG1
//   S_x = Q K_x^T                (wgmma SS)                .
//   m = max(m, rowmax S_x c); c_x -> shared (slot of x)     .
//   P_x = 2^(S_x c - m); l = l c_x + sum                   .
//   P_x -> the stage's P box                 P_A / P_B --> c_x from shared
//   O_L = O_L c_x + P_x V_x[:, L]    (SS)                  O_R = O_R c_x + P_x V_x[:, R]   (SS)
//   release stage s (early, late)                          release stage s (late)
//
// WG1 holds no scores, no row state and no P: its registers are O_R's 128 and addresses, so the
// producer gets more (hopper.py: 152, the seesaw's 72). The
// tensor cores run WG1's product of tile x beside WG0's S of tile x + 1; WG0's softmax is not
// overlapped (the seesaw's point), the price of that.
//
// P_A and P_B (traits.cuh's handoffs, 128 arrivals each, one phase a pair): WG0 arrives on P_A
// after tile a's P and c_a are stored and fenced, on P_B after tile b's (or at once, when the
// pair has no b: WG1 still waits on it, and skips the product). No handoff completes twice
// before WG1 waits on it: WG0's next arrival on P_A needs stage a refilled, hence released by
// WG1 after its wait (the plan's one set of stages: traits.cuh asserts it); the same for P_B and
// for the c slots, which WG0 rewrites only then. At the end l (WG0's) and m go through shared
// memory to WG1, and each group writes its half: out = O / l, lse = (m + log2 l) ln 2, or the
// partials.
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

template <class Cfg>
__device__ __forceinline__ void consume_relay(const AttnccArgs& a, const CtaWork<Cfg>& w, int n_iter, int kv_len, uint32_t sbase,
                                              unsigned char* smem, int wg, int t, Progress<Cfg::kStages>& pr) {
  using T = HopperTraits<Cfg>;
  constexpr int kAcc = T::kAcc;
  static_assert(T::kSets == 1, "relay: one set of a pair's stages (a handoff's next arrival needs its stage released)");
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
  const int full_limit = w.token_limit(w.row_token(w.mb * Cfg::kTileM), kv_len, s_q);
  const float c = a.softmax_scale * kLog2e;

  for (int it = 0; it < n_iter; it += 2, ++pr.pairs) {
    const bool has_b = it + 1 < n_iter;
    const int pair = pr.pairs & 1;
#pragma unroll
    for (int x = 0; x < 2; ++x) {  // tile a, then b
      const int st = x;            // its stage (one set)
      const uint32_t p_box = T::stage_box(sbase, st, T::kPBox);
      const uint32_t hand = x == 0 ? T::p_a(sbase) : T::p_b(sbase);
      const bool here = x == 0 || has_b;
      if (wg == 0) {
        if (here) {
          const int parity = pr.parity(st);
          float s[32], mx[2], sum[2], cx[2];
          scores<Cfg>(s, sbase + Cfg::kQOff, sbase, st, parity, pr.pairs);
          mbarrier_wait(T::flags_bar(sbase, st), parity);
          mask_and_max<Cfg>(s, mx, f, (w.tile_begin + it + x) * Cfg::kTileN, full_limit, row_limit, sbase + T::stage_flags(st));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float m_new = fmaxf(m[h], mx[h] * c);
            cx[h] = rescale_factor(m[h], m_new);
            m[h] = m_new;
            if (f.q == 0) x == 0 ? rs.set_ca(f.r + 8 * h, cx[h]) : rs.set_cb(f.r + 8 * h, cx[h]);
          }
          exponentiate<Cfg>(s, m, c, sum);
#pragma unroll
          for (int h = 0; h < 2; ++h) l[h] = l[h] * cx[h] + sum[h];
          store_p<Cfg>(p_box, s, f);
          fence_async_shared();  // P (generic proxy) before either group's wgmma reads it
          mbarrier_arrive(hand);
          scale_rows(o, cx);
          pv_ss<Cfg>(o, p_box, T::stage_box(sbase, st, 0));  // O_L += P_x V_x[:, L] (P from shared: RS measured no faster)
          release_stage<Cfg>(T::empty_early(sbase, st), sbase);
          release_stage<Cfg>(T::empty_late(sbase, st), sbase);
        } else {
          mbarrier_arrive(hand);  // a pair without b: the handoff's phase still turns
        }
      } else {
        mbarrier_wait(hand, pair);
        if (here) {
          float cx[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) cx[h] = x == 0 ? rs.ca(f.r + 8 * h) : rs.cb(f.r + 8 * h);
          scale_rows(o, cx);
          pv_ss<Cfg>(o, p_box, T::stage_box(sbase, st, T::kOut));  // O_R += P_x V_x[:, R]
          release_stage<Cfg>(T::empty_late(sbase, st), sbase);
        }
      }
    }
    pr.used(0);
    if (has_b) pr.used(1);
  }

  // ---- epilogue: l and m from WG0, then each group's half of out (or of the partials)
  if (wg == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      if (f.q == 0) rs.set_l(0, f.r + 8 * h, l[h]), rs.set_m(f.r + 8 * h, m[h]);
    }
  }
  bar_sync(Cfg::kConsumerBarrier, 2 * kGroupThreads);
  const CtaWork<Cfg> we = unstash_work<Cfg>(smem + Cfg::kWorkOff);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = we.mb * Cfg::kTileM + f.r + 8 * h;
    if (R >= we.rows_total) continue;
    const float lt = rs.l(0, f.r + 8 * h), mt = rs.m(f.r + 8 * h);
    write_row<Cfg, 0, kAcc>(a, we, o, h, R, lt > 0.f ? 1.f / lt : 0.f, row_lse(mt, lt), wg * T::kOutCols + 2 * f.q, wg == 0 && f.q == 0);
  }
}

}  // namespace hopper
}  // namespace attncc
