// attncc/core/softmax.cuh: online softmax over mma C fragments, in the log2 domain.
//
// Scores are used as s2 = (q . k) * scale * log2(e), so that exp(scale * q.k - M) is
// exp2(s2 - m) with m = M * log2(e). The products hand over raw q . k: the scale (positive, so
// the row max commutes with it) is applied to the row max and folded into the exp2 argument,
// exp2(fma(q.k, c, -m)) with c = scale * log2(e). Per query row the running state is
//     m  = max of s2 seen so far          (-inf before the first visible key)
//     l  = sum of exp2(s2 - m)            (this thread's columns only; summed at the end)
//     O  = sum of exp2(s2 - m) * v        (the caller's accumulator)
// and a new block of scores with row max mx updates it as
//     m' = max(m, mx),  alpha = exp2(m - m'),  P = exp2(s2 - m'),
//     l' = alpha * l + rowsum(P),  O' = alpha * O + P V.
// m is only a reference point: any m with s2 - m bounded keeps P, l and O in range, and the
// result O / l does not depend on it. So m moves only when the max exceeds it by more than
// kRescaleSlack (P <= 2^kRescaleSlack meanwhile): after the first few tiles alpha is 1 and the
// caller skips the rescale of O (FlashAttention-4's lazy rescaling).
// A row that has seen no visible key keeps m = -inf; exp2 is then taken against 0 instead of
// m', so that P = exp2(-inf) = 0 and nothing is NaN. At the end
//     out = O / l,   lse = ln(sum exp(scale * q.k)) = (m + log2(l)) * ln(2)
// and a row with l = 0 (no visible key) gives out = 0, lse = -inf.
//
// Fragment shape: s[MT][NT][4] holds MT m16 tiles x NT n8 tiles of the C layout; element
// [mt][nt][j] is row mt*16 + lane/4 + 8*(j/2), column nt*8 + 2*(lane%4) + j%2. Each thread thus
// owns 2 rows per m-tile, indexed [mt][h] with h = j / 2.
#pragma once

#include "attncc/core/common.cuh"
#include "attncc/core/ptx.cuh"

namespace attncc {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kRescaleSlack = 8.f;  // log2 of the largest P between rescales
constexpr float kLn2 = 0.6931471805599453f;

// Max over the 4 lanes of a quad (the lanes that share a row of a C fragment).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// s = visible(mt, h, nt, j) ? s : -inf
template <int MT, int NT, class Visible>
__device__ __forceinline__ void mask(float (&s)[MT][NT][4], Visible visible) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[mt][nt][j] = visible(mt, j >> 1, nt, j & 1) ? s[mt][nt][j] : -INFINITY;
}

// Row max of this warp's columns of s, complete across the quad.
template <int MT, int NT>
__device__ __forceinline__ void warp_row_max(const float (&s)[MT][NT][4], float (&mx)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float x = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) x = fmaxf(x, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
      mx[mt][h] = quad_max(x);
    }
}

template <int MT>
struct OnlineSoftmax {
  float m[MT][2];
  float l[MT][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[mt][h] = -INFINITY;
        l[mt][h] = 0.f;
      }
  }

  // Given the raw scores s (q . k) and their row max mx (over all the CTA's columns of this KV
  // step), with c = scale * log2(e), turn s into P, update m and l, and return alpha, the
  // factor by which O must be rescaled.
  template <int NT>
  __device__ __forceinline__ void update(float (&s)[MT][NT][4], const float (&mx)[MT][2], float c, float (&alpha)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mx2 = mx[mt][h] * c;  // the row max in the log2 domain
        const float m_new = mx2 > m[mt][h] + kRescaleSlack ? mx2 : m[mt][h];  // (-inf: first visible)
        const float ref = m_new == -INFINITY ? 0.f : m_new;
        alpha[mt][h] = fast_exp2(m[mt][h] - ref);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float p = fast_exp2(fmaf(s[mt][nt][2 * h + j], c, -ref));
            s[mt][nt][2 * h + j] = p;
            sum += p;
          }
        l[mt][h] = l[mt][h] * alpha[mt][h] + sum;
        m[mt][h] = m_new;
      }
  }
};

// O *= alpha, row by row.
template <int MT, int NO>
__device__ __forceinline__ void rescale_rows(float (&o)[MT][NO][4], const float (&alpha)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[mt][n][0] *= alpha[mt][0];
      o[mt][n][1] *= alpha[mt][0];
      o[mt][n][2] *= alpha[mt][1];
      o[mt][n][3] *= alpha[mt][1];
    }
}

// Natural-log LSE of a row from its final m (log2 domain) and total l; -inf when l == 0.
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0.f ? (m + __log2f(l)) * kLn2 : -INFINITY;
}

}  // namespace attncc
