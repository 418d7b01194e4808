// attncc/hopper/tile.cuh: what the consumer schedules of the Hopper family (seesaw.cuh,
// relay.cuh, stacked.cuh) do with a KV tile in a consumer warp group: S = Q K^T (wgmma SS), the
// mask and the row maxima, P = 2^(S c - m), O += P V with P from registers (wgmma RS) or from a
// box (SS), the rows' shared state of the two-group schedules, and the write of a finished row
// (out and lse, or the partials). Every function is one warp group's, on its
// 64 x N accumulators (wgmma.cuh: thread t holds rows r and r + 8, columns 8 i + 2 (t % 4) + {0, 1}).
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/softmax.cuh"
#include "attncc/core/trace.cuh"
#include "attncc/core/work.cuh"
#include "attncc/hopper/barrier.cuh"
#include "attncc/hopper/cluster.cuh"
#include "attncc/hopper/traits.cuh"
#include "attncc/hopper/wgmma.cuh"

namespace attncc {
namespace hopper {

__device__ __forceinline__ int lds8(uint32_t addr) {
  unsigned v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return static_cast<int>(v);
}

// A consumer thread's place in the 64 x N accumulator of its warp group: rows r and r + 8,
// columns 8 i + 2 (t % 4) + {0, 1}.
struct Frag {
  int r, q;  // row (0..55), t % 4
  __device__ __forceinline__ explicit Frag(int t) : r(16 * (t / 32) + (t % 32) / 4), q(t % 4) {}
};

// The causal limits of this thread's rows h = 0, 1 (CTA rows row0 + f.r + 8 h): the tokens each
// may see, 0 past the CTA's rows.
template <class Cfg>
__device__ __forceinline__ void row_limits(const CtaWork<Cfg>& w, const Frag& f, int row0, int kv_len, int s_q, int (&limit)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = row0 + f.r + 8 * h;
    limit[h] = R < w.rows_total ? w.token_limit(w.row_token(R), kv_len, s_q) : 0;
  }
}

// Whether some box of [from, to) is one the consumers fence (traits.cuh: consumer_fences).
template <class Cfg>
__host__ __device__ constexpr bool fences_some(int from, int to) {
  for (int b = from; b < to; ++b)
    if (consumer_fences<Cfg>(b)) return true;
  return false;
}

// A consumer thread's release of a stage's group of boxes (its EMPTY early or late, `bar`). Every
// thread arrives: a warp's arrivals as one by an elected lane after __syncwarp measured no faster
// (H100, session 34: 0.987-0.998 of its time per thread) and racecheck, which does not follow
// __syncwarp's ordering into the elected lane's release, reported the other lanes' shared-memory
// accesses as hazards (72,980 on 4 specs). Crossover: on the peer's EMPTY as well, so that each producer's
// EMPTY wait covers both CTAs' consumers before it writes into both (FlashMLA's consumers
// release both CTAs' buffers so; a producer passing the release on to its peer measured 1.05 of
// this, bench/RESULTS.md session 33).
template <class Cfg>
__device__ __forceinline__ void release_stage(uint32_t bar, uint32_t sbase) {
  mbarrier_arrive(bar);
  if constexpr (HopperTraits<Cfg>::kCrossover) mbarrier_arrive_peer(peer_base(sbase) + (bar - sbase));
}

// S = Q K^T over the key's boxes of stage `stage`, every box of the stage waited for in its order
// (a value apart from the key lands before O += P V reads it), each once FULL says it landed; q:
// the warp group's 64 rows in the Q tile's first box. trace_slot: the warp group's trace slot
// (core/trace.cuh: event 1, every box landed), -1 for none. The boxes the consumers fence
// (consumer_fences: a cp.async plan's 16-bit boxes) are waited for a group of the stage at a time,
// as its first box is reached, on the one FULL that counts them (traits.cuh: fenced_full), and
// fenced once (a fence is a MEMBAR.ALL.CTA; the producer issues a group's copies together); the others each as it comes (crossover's: the peer's stores arrive
// pair by pair).
template <class Cfg>
__device__ __forceinline__ void scores_issue(float (&s)[32], uint32_t q, uint32_t sbase, int stage, int parity, int trace_slot = -1) {
  using T = HopperTraits<Cfg>;
  const uint32_t kv = T::stage_box(sbase, stage, 0);
  fence();
  static_for<T::kBoxes>([&](auto i) {
    constexpr int box = decltype(i)::value;
    if constexpr (box == 0 || box == T::kEarly) {  // a group's first box: its fenced boxes, one fence
      constexpr int kEnd = box == 0 ? T::kEarly : T::kBoxes;
      static_for<kEnd - box>([&](auto j) {
        if constexpr (fenced_full<Cfg>(box + decltype(j)::value)) mbarrier_wait(T::full(sbase, stage, box + decltype(j)::value), parity);
      });
      if constexpr (fences_some<Cfg>(box, kEnd)) fence_async_shared();  // the producer's cp.async (generic proxy) -> wgmma (async proxy)
    }
    if constexpr (!consumer_fences<Cfg>(box)) mbarrier_wait(T::full(sbase, stage, box), parity);
    if constexpr (T::q_col_of_box(box) >= 0) {  // the key's: with its columns of the Q tile
#pragma unroll
      for (int kk = 0; kk < kBoxCols / 16; ++kk) {
        const uint64_t qd = desc_k_major(q, T::kQBoxBytes, T::q_col_of_box(box) + 16 * kk),
                       kd = desc_k_major(kv, Cfg::kBoxBytes, box * kBoxCols + 16 * kk);
        if (box == T::first_key_box() && kk == 0) {
          mma_ss_first(s, qd, kd);
        } else {
          mma_ss<Cfg::kTileN, false>(s, qd, kd, 1);
        }
      }
    }
  });
  ATTNCC_TRACE(threadIdx.x % kGroupThreads == 0, threadIdx.x / kGroupThreads, trace_slot, 1);
  commit_group();
}

// ... issued and waited for (scores_issue leaves S's wgmma in flight: its registers untouched until
// a wait_group that covers it, then pin).
template <class Cfg>
__device__ __forceinline__ void scores(float (&s)[32], uint32_t q, uint32_t sbase, int stage, int parity, int trace_slot = -1) {
  scores_issue<Cfg>(s, q, sbase, stage, parity, trace_slot);
  wait_group<0>();
  pin(s);
}

// Masks S (-inf) where a row may not see a token, when the tile needs it (warp-uniform: tiles
// that reach past the first row's limit, or with a flagged token); returns the row maxima of
// the raw scores (the quad's 4 threads hold a row).
template <class Cfg>
__device__ __forceinline__ void mask_and_max(float (&s)[32], float (&mx)[2], const Frag& f, int pos0, int full_limit,
                                             const int (&row_limit)[2], uint32_t flags) {
  const uint4 any = lds128(flags + Cfg::kTileN);
  if (pos0 + Cfg::kTileN > full_limit || (any.x | any.y | any.z | any.w) != 0) {
#pragma unroll
    for (int i = 0; i < Cfg::kTileN / 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = 8 * i + 2 * f.q + (j & 1);
        if (pos0 + col >= row_limit[j >> 1] || lds8(flags + col) != 0) s[4 * i + j] = -INFINITY;
      }
  }
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < Cfg::kTileN / 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) mx[j >> 1] = fmaxf(mx[j >> 1], s[4 * i + j]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
}

// P = 2^(S c - m) in place (0 where m is -inf: nothing seen yet), and the thread's row sums.
template <class Cfg>
__device__ __forceinline__ void exponentiate(float (&s)[32], const float (&m)[2], float c, float (&sum)[2]) {
  const float mb[2] = {m[0] == -INFINITY ? 0.f : m[0], m[1] == -INFINITY ? 0.f : m[1]};
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int i = 0; i < Cfg::kTileN / 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[4 * i + j] = fast_exp2(fmaf(s[4 * i + j], c, -mb[j >> 1]));
      sum[j >> 1] += s[4 * i + j];
    }
}

// The scale of a row state moving from max m_old to m_new (1 while nothing is seen).
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return m_new == -INFINITY ? 1.f : fast_exp2(m_old - m_new);
}

template <int kAcc>
__device__ __forceinline__ void scale_rows(float (&o)[kAcc], const float (&c)[2]) {
#pragma unroll
  for (int i = 0; i < kAcc / 4; ++i) {
    o[4 * i] *= c[0], o[4 * i + 1] *= c[0];
    o[4 * i + 2] *= c[1], o[4 * i + 3] *= c[1];
  }
}

// scale_rows where a row of the warp moved its max; a warp whose 16 rows all kept theirs (every
// c == 1, so O c == O bit for bit) skips the 2 kAcc multiplies by a vote.
template <int kAcc>
__device__ __forceinline__ void scale_rows_if_moved(float (&o)[kAcc], const float (&c)[2]) {
  if (__any_sync(0xffffffffu, c[0] != 1.f || c[1] != 1.f)) scale_rows(o, c);
}

// P (64 x 64 fp32 accumulator layout) as the A operand of an RS wgmma: k-step kk's registers.
template <class Cfg>
__device__ __forceinline__ void pack_p(const float (&p)[32], uint32_t (&a)[Cfg::kTileN / 16][4]) {
  using E = Elem16<Cfg::kElem>;
#pragma unroll
  for (int kk = 0; kk < Cfg::kTileN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = E::pack(p[8 * kk + 2 * r], p[8 * kk + 2 * r + 1]);
}

// O += P V over the columns of a stage's value from box0 (2 kAcc of them), P from registers:
// issued (o and a untouched until a wait_group that covers it, then pin) ...
template <class Cfg, int kAcc>
__device__ __forceinline__ void pv_rs_issue(float (&o)[kAcc], uint32_t (&a)[Cfg::kTileN / 16][4], uint32_t box0) {
  pin(o);
  pin(a);
  fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kTileN / 16; ++kk) mma_rs<2 * kAcc, true>(o, a[kk], desc_n_major(box0, Cfg::kBoxBytes, 16 * kk), 1);
  commit_group();
}

// ... and waited for.
template <class Cfg, int kAcc>
__device__ __forceinline__ void pv_rs(float (&o)[kAcc], uint32_t (&a)[Cfg::kTileN / 16][4], uint32_t box0) {
  pv_rs_issue<Cfg>(o, a, box0);
  wait_group<0>();
  pin(o);
}

// P into a box (K-major A operand of an SS wgmma: row r, token column c at sw128(r, c / 8)).
template <class Cfg>
__device__ __forceinline__ void store_p(uint32_t box, const float (&p)[32], const Frag& f) {
  using E = Elem16<Cfg::kElem>;
#pragma unroll
  for (int i = 0; i < Cfg::kTileN / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) sts32(box + sw128(f.r + 8 * h, i) + 4 * f.q, E::pack(p[4 * i + 2 * h], p[4 * i + 2 * h + 1]));
}

// O += P V with P from shared memory (box p_box).
template <class Cfg, int kAcc>
__device__ __forceinline__ void pv_ss(float (&o)[kAcc], uint32_t p_box, uint32_t box0) {
  pin(o);
  fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kTileN / 16; ++kk)
    mma_ss<2 * kAcc, true>(o, desc_k_major(p_box, Cfg::kBoxBytes, 16 * kk), desc_n_major(box0, Cfg::kBoxBytes, 16 * kk), 1);
  commit_group();
  wait_group<0>();
  pin(o);
}

// The shared row state of the two-group schedules: m, c_a, c_b, then l of each warp group
// (floats per row; the seesaw's, or the relay's rescales of tiles a and b, l and m at the end),
// by 32-bit shared addresses (generic pointers would hold two registers each through the main
// loop).
struct RowState {
  uint32_t base;
  static constexpr int kRows = 64;
  __device__ __forceinline__ explicit RowState(uint32_t addr) : base(addr) {}
  __device__ __forceinline__ float m(int r) const { return lds32f(base + 4 * r); }
  __device__ __forceinline__ float ca(int r) const { return lds32f(base + 4 * (kRows + r)); }
  __device__ __forceinline__ float cb(int r) const { return lds32f(base + 4 * (2 * kRows + r)); }
  __device__ __forceinline__ float l(int wg, int r) const { return lds32f(base + 4 * ((3 + wg) * kRows + r)); }
  __device__ __forceinline__ void set_m(int r, float v) const { sts32(base + 4 * r, __float_as_uint(v)); }
  __device__ __forceinline__ void set_ca(int r, float v) const { sts32(base + 4 * (kRows + r), __float_as_uint(v)); }
  __device__ __forceinline__ void set_cb(int r, float v) const { sts32(base + 4 * (2 * kRows + r), __float_as_uint(v)); }
  __device__ __forceinline__ void set_l(int wg, int r, float v) const { sts32(base + 4 * ((3 + wg) * kRows + r), __float_as_uint(v)); }
};

// Row h (f.r + 8 h, CTA row R) of this thread's accumulators o[kFrom, kTo), whose o[0] is output
// column col0 (2 q past an 8-column group's start, q = the thread's place in its quad), scaled by
// inv: into out (and lse, where with_lse) when the CTA holds the sequence's whole range, else
// into the partials for the combine. In the accumulator layout a quad holds a row's 8-column
// group i two columns a thread. 16-bit out: the two threads of a pair (q, q ^ 1) swap their packed
// halves of groups i and i + 1 (one shuffle), so that each stores 4 consecutive columns (q even:
// group i's 2 q .. 2 q + 3; odd: group i + 1's 2 q - 2 .. 2 q + 1) in one 8-byte store, half the
// store instructions (each as many cache lines: 8 rows). (The fp32 partials, the same way with two
// shuffles a store, spilled in the part kernels: they keep a store a group.) A quad is one row,
// so a pair is active together: the caller may skip rows by quad.
template <class Cfg, int kFrom, int kTo, int kAcc>
__device__ __forceinline__ void write_row(const AttnccArgs& a, const CtaWork<Cfg>& w, const float (&o)[kAcc], int h, int R, float inv,
                                          float lse, int col0, bool with_lse) {
  static_assert(kFrom % 8 == 0 && kTo % 8 == 0 && 0 <= kFrom && kFrom < kTo && kTo <= kAcc, "whole pairs of 8-column groups");
  const int tq = w.row_token(R);
  const int hq = w.row_query_head(R);
  if (w.slot < 0) {
    using E = Elem16<Cfg::kElem>;
    const bool odd = threadIdx.x & 1;                   // q odd: the pair's second thread
    const unsigned pair = __activemask();
    auto* out = static_cast<typename E::T*>(a.out) + w.out_row(a.s_q, tq, hq) * Cfg::kDV + col0 + (odd ? 8 - 2 : 0);
#pragma unroll
    for (int i = kFrom / 4; i < kTo / 4; i += 2) {
      const uint32_t mine = E::pack(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
      const uint32_t next = E::pack(o[4 * i + 4 + 2 * h] * inv, o[4 * i + 4 + 2 * h + 1] * inv);
      const uint32_t got = __shfl_xor_sync(pair, odd ? mine : next, 1);
      *reinterpret_cast<uint2*>(out + 8 * i) = odd ? make_uint2(got, next) : make_uint2(mine, got);
    }
    if (with_lse) a.lse[w.lse_index(a.s_q, tq, hq)] = lse;
  } else {
    const long long prow = w.partial_row(a, tq, hq);
    float* out = a.partial_out + prow * Cfg::kDV + col0;
#pragma unroll
    for (int i = kFrom / 4; i < kTo / 4; ++i) *reinterpret_cast<float2*>(out + 8 * i) = make_float2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
    if (with_lse) a.partial_lse[prow] = lse;
  }
}

}  // namespace hopper
}  // namespace attncc
