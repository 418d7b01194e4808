// attncc/mma_sync/mainloop.cuh: the tile-level math of one KV step, per warp.
//
//   qk_tile          S = Q K^T for the warp's rows and tokens (qk_split: half the k-steps)
//   pair_sum         qk_split: add the partner warp's partial S of this warp's tokens
//   row_group_reduce a per-row value (max, sum) across the WN warps of a row group
//   pv_tile          O += P V for the warp's rows and value columns
// Fragments are mma.sync's C layout (mma.cuh); shapes come from DecodeTraits (traits.cuh).
#pragma once

#include "attncc/core/common.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/smem.cuh"
#include "attncc/mma_sync/mma.cuh"
#include "attncc/mma_sync/traits.cuh"

namespace attncc {

// ------------------------------------------------------------------------------------------
// Value columns

// Staged chunk of value chunk v (runtime): a walk over the (few) value runs.
template <class Cfg>
__device__ __forceinline__ int value_chunk(int v) {
  int out = 0, base = 0;
  static_for<Cfg::kNumValueRuns>([&](auto ri) {
    constexpr Run r = Cfg::kValueRuns[decltype(ri)::value];
    if (v >= base / 8 && v < (base + r.width) / 8) out = r.col / 8 + (v - base / 8);
    base += r.width;
  });
  return out;
}

// ------------------------------------------------------------------------------------------
// S = Q K^T for this warp's rows and tokens: s[mt][nt] += Q[rows mt] . K[tokens nt]^T over the
// warp's k-steps: all of d_k, or with qk_split the k-steps 2 j + wk over the pair's 2 TN tokens,
// the warp's own TN first (n-tiles [0, NTS) own, [NTS, 2 NTS) the partner's).
// on_step(Index<j>) runs after the warp's j-th k-step (the caller's chance to issue copies).
template <class Cfg, class OnStep>
__device__ __forceinline__ void qk_tile(float (&s)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTQK][4], uint32_t q_tile,
                                        uint32_t kv_tile, int wm, int wn, int lane, OnStep&& on_step) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, NT = T::kNTQK, C = T::kQKChains, TN = T::kTokPerWarp;
  constexpr int kStride = T::kQKSplit ? 2 : 1;  // the warp's j-th k-step is kStride * j + wk
  const int wk = T::kQKSplit ? (wn & 1) : 0;
  const int koff = 2 * wk;  // chunk offset of k-step kStride * j + wk from k-step kStride * j
  float chain[C > 1 ? C - 1 : 1][MT][NT][4];  // chains 1..C-1 (chain 0 is s)
#pragma unroll
  for (int c = 0; c < (C > 1 ? C - 1 : 1); ++c)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) chain[c][mt][n][j] = 0.f;
  auto acc = [&](auto kc, int mt, int n) -> float(&)[4] {
    if constexpr (decltype(kc)::value == 0) {
      return s[mt][n];
    } else {
      return chain[decltype(kc)::value - 1][mt][n];
    }
  };
  LaneRow<typename T::QRows> qrow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    qrow[mt] = LaneRow<typename T::QRows>(q_tile, wm * T::kWarpRows + mt * 16 + a_ldm_row(lane), a_ldm_khalf(lane), koff);
  // Token of the warp's i-th column of s.
  auto token = [&](int i) {
    if constexpr (T::kQKSplit) {
      return (wn >> 1) * 2 * TN + (wk * TN + i) % (2 * TN);
    } else {
      return wn * TN + i;
    }
  };
  // Rows of K: pairs of n-tiles via x4, a last odd n-tile via x2.
  constexpr int NP = NT / 2;
  LaneRow<typename T::KVRows> krow[NP > 0 ? NP : 1];
#pragma unroll
  for (int np = 0; np < NP; ++np)
    krow[np] = LaneRow<typename T::KVRows>(kv_tile, token(np * 16 + b_ldm_row(lane)), b_ldm_khalf(lane), koff);
  const LaneRow<typename T::KVRows> krow_odd(kv_tile, token(NP * 16 + (lane & 7)), (lane >> 3) & 1);
  const int kx = T::KVRows::kSwizzle ? (lane & 7) : 0;  // for non-adjacent key halves
  const int khalf = b_ldm_khalf(lane);

  static_for<T::kQKSteps>([&](auto jj) {
    constexpr int k = kStride * decltype(jj)::value;  // (+ wk, folded into the addresses)
    const Index<decltype(jj)::value % C> kc;
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], qrow[mt].at(2 * k));
    // Staged chunks of key columns 16k..16k+7 and 16k+8..16k+15.
    constexpr int c0 = run_to_staged(Cfg::kKeyRuns, 16 * k) / 8;
    constexpr int c1 = run_to_staged(Cfg::kKeyRuns, 16 * k + 8) / 8;
    constexpr bool kAdjacent = c0 % 2 == 0 && c1 == c0 + 1;
    static_assert(!T::kQKSplit || (kAdjacent && c0 % 4 == 0), "qk_split: key runs on multiples of 32 columns");
#pragma unroll
    for (int np = 0; np < NP; ++np) {
      uint32_t b[4];
      uint32_t addr;
      if constexpr (kAdjacent) {
        addr = krow[np].at(c0);
      } else {
        const int c = khalf ? c1 : c0;
        addr = krow[np].row_addr + ((T::KVRows::kSwizzle ? (c ^ kx) : c) << 4);
      }
      ldmatrix_x4(b, addr);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<Cfg::kElem>(acc(kc, mt, 2 * np), a[mt], b[0], b[1]);
        mma_16816<Cfg::kElem>(acc(kc, mt, 2 * np + 1), a[mt], b[2], b[3]);
      }
    }
    if constexpr (NT % 2 == 1) {
      uint32_t b[2];
      uint32_t addr;
      if constexpr (kAdjacent) {
        addr = krow_odd.at(c0);
      } else {
        const int c = ((lane >> 3) & 1) ? c1 : c0;
        addr = krow_odd.row_addr + ((T::KVRows::kSwizzle ? (c ^ kx) : c) << 4);
      }
      ldmatrix_x2(b, addr);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mma_16816<Cfg::kElem>(acc(kc, mt, NT - 1), a[mt], b[0], b[1]);
    }
    on_step(jj);
  });
  if constexpr (C > 1) {
#pragma unroll
    for (int c = 0; c < C - 1; ++c)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j) s[mt][n][j] += chain[c][mt][n][j];
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&x)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) x[mt][n][j] = 0.f;
}

// qk_split: s (this warp's TN tokens) = its partial sp[.][0, NTS) + the partner's partial of the
// same tokens. Each warp hands the partner sp[.][NTS, 2 NTS) in two rounds of half (float2
// units u, lane-major: conflict-free) through two slots, each round a store, a pair barrier and
// an add:
//   round 0: store into my slot, barrier, add from the partner's slot;
//   round 1: store into the partner's slot, barrier, add from my slot.
// A thread only stores to addresses it was the last to read (round 1) or that nobody reads until
// the next barrier, so two barriers are enough.
template <class Cfg>
__device__ __forceinline__ void pair_sum(float (&s)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTS][4],
                                         const float (&sp)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTQK][4],
                                         uint32_t my_slot, uint32_t partner_slot, int pair_barrier, int lane) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, NTS = T::kNTS;
  constexpr int kUnits = MT * NTS;  // float2 units per round: half of MT x NTS fragments of 4
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NTS; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[mt][n][j] = sp[mt][n][j];
#pragma unroll
  for (int round = 0; round < 2; ++round) {
    const uint32_t to = round == 0 ? my_slot : partner_slot;
    const uint32_t from = round == 0 ? partner_slot : my_slot;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int f = (round * kUnits + u) * 2;  // first float of the unit in [mt][n][j] order
      const int mt = f / (4 * NTS), n = f / 4 % NTS, j = f % 4;
      sts64(to + (u * 32 + lane) * 8, sp[mt][NTS + n][j], sp[mt][NTS + n][j + 1]);
    }
    bar_sync(pair_barrier, 64);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int f = (round * kUnits + u) * 2;
      const int mt = f / (4 * NTS), n = f / 4 % NTS, j = f % 4;
      float x, y;
      lds64(from + (u * 32 + lane) * 8, x, y);
      s[mt][n][j] += x;
      s[mt][n][j + 1] += y;
    }
  }
}

// O += P V for this warp's rows and value columns, over all tile_n tokens.
template <class Cfg>
__device__ __forceinline__ void pv_tile(float (&o)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTO][4], uint32_t p_tile,
                                        uint32_t kv_tile, int wm, int wn, int lane) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, NTO = T::kNTO;
  LaneRow<typename T::PRows> prow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    prow[mt] = LaneRow<typename T::PRows>(p_tile, wm * T::kWarpRows + mt * 16 + a_ldm_row(lane), a_ldm_khalf(lane));
  // V rows (tokens) of this lane: kt*16 + bt_ldm_row(lane); its 8-column half: bt_ldm_nhalf.
  const int vrow = bt_ldm_row(lane);
  const int nhalf = bt_ldm_nhalf(lane);
  const int vx = T::KVRows::kSwizzle ? (lane & 7) : 0;
  const int vchunk0 = wn * (T::kColsPerWarp / 8);  // first value chunk of this warp
  static_assert(NTO % 2 == 0, "value columns per warp are a multiple of 16");

#pragma unroll
  for (int kt = 0; kt < T::kTileN / 16; ++kt) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], prow[mt].at(2 * kt));
    const uint32_t vbase = kv_tile + (kt * 16 + vrow) * T::KVRows::kPitchBytes;
#pragma unroll
    for (int np = 0; np < NTO / 2; ++np) {
      int c;
      if constexpr (Cfg::kNumValueRuns == 1) {
        c = Cfg::kValueRuns[0].col / 8 + vchunk0 + 2 * np + nhalf;
      } else {
        c = value_chunk<Cfg>(vchunk0 + 2 * np + nhalf);
      }
      uint32_t b[4];
      ldmatrix_x4_trans(b, vbase + ((c ^ vx) << 4));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<Cfg::kElem>(o[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<Cfg::kElem>(o[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void row_group_sync(int group, int threads) { bar_sync(Cfg::kRowGroupBarrier0 + group, threads); }

// The WN values of one row of `red` (row-major [tile_m][WN], 16-byte aligned): in 16- or 8-byte loads.
template <int WN>
__device__ __forceinline__ void load_row(const float* row, float (&v)[WN]) {
  if constexpr (WN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < WN / 4; ++i) {
      const float4 x = reinterpret_cast<const float4*>(row)[i];
      v[4 * i] = x.x, v[4 * i + 1] = x.y, v[4 * i + 2] = x.z, v[4 * i + 3] = x.w;
    }
  } else if constexpr (WN % 2 == 0) {
#pragma unroll
    for (int i = 0; i < WN / 2; ++i) {
      const float2 x = reinterpret_cast<const float2*>(row)[i];
      v[2 * i] = x.x, v[2 * i + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < WN; ++i) v[i] = row[i];
  }
}

// x[mt][h], one value per row of this warp (the same in the 4 lanes of a quad), combined with
// `op` over the WN warps of the row group, through `red` ([tile_m][WN]) and one row-group
// barrier. The caller orders the write after every earlier read of `red`.
template <class Cfg, class Op>
__device__ __forceinline__ void row_group_reduce(float (&x)[DecodeTraits<Cfg>::kMT][2], float* red, int wm, int wn,
                                                 int lane, Op op) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, WN = T::kWarpsN;
  auto row = [&](int mt, int h) { return red + (wm * T::kWarpRows + mt * 16 + (lane >> 2) + 8 * h) * WN; };
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) row(mt, h)[wn] = x[mt][h];
  }
  row_group_sync<Cfg>(wm, WN * 32);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[WN];
      load_row(row(mt, h), v);
      float r = v[0];
#pragma unroll
      for (int w = 1; w < WN; ++w) r = op(r, v[w]);
      x[mt][h] = r;
    }
}


}  // namespace attncc
