// attncc/combine.cuh: merge the split-KV partials into out and lse.
//
// Split s of a query row left O_s (already divided by its own l_s) and lse_s (natural log,
// -inf when it saw no key). With L = log(sum_s exp(lse_s)),
//     out = sum_s exp(lse_s - L) * O_s,   lse = L,
// and a row whose splits all saw nothing gets out = 0, lse = -inf. One warp per query row,
// splits visited in order: deterministic.
#pragma once

#include "attncc/abi.h"
#include "attncc/common.cuh"

namespace attncc {

constexpr int kCombineWarps = 4;

template <class Cfg>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const __grid_constant__ AttnccArgs args) {
  using E = Elem16<Cfg::kElem>;
  static_assert(Cfg::kDV % 4 == 0, "float4 loads");
  const int lane = threadIdx.x & 31;
  const long long rows = static_cast<long long>(args.batch) * args.s_q * Cfg::kHeadsQ;  // [b, s_q, h_q]
  const long long row = static_cast<long long>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int ns = args.num_splits;
  const float* plse = args.partial_lse + row;  // split s at plse[s * rows]

  float mx = -INFINITY;
  for (int s = lane; s < ns; s += 32) mx = fmaxf(mx, plse[s * rows]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  float sum = 0.f;
  if (mx != -INFINITY)
    for (int s = lane; s < ns; s += 32) sum += __expf(plse[s * rows] - mx);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  const float lse = mx == -INFINITY ? -INFINITY : mx + __logf(sum);

  auto* out = static_cast<typename E::T*>(args.out) + row * Cfg::kDV;
  for (int c = lane * 4; c < Cfg::kDV; c += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lse != -INFINITY) {
      for (int s = 0; s < ns; ++s) {
        const float w = __expf(plse[s * rows] - lse);  // 0 for an empty split
        if (w == 0.f) continue;
        const float4 v = *reinterpret_cast<const float4*>(args.partial_out + (s * rows + row) * Cfg::kDV + c);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
      }
    }
    uint2 packed;
    packed.x = E::pack(acc.x, acc.y);
    packed.y = E::pack(acc.z, acc.w);
    *reinterpret_cast<uint2*>(out + c) = packed;
  }
  if (lane == 0) {
    // row = (b * s_q + t) * h_q + h  ->  lse[b, h, t]
    const long long h = row % Cfg::kHeadsQ;
    const long long bt = row / Cfg::kHeadsQ;
    const long long t = bt % args.s_q, b = bt / args.s_q;
    args.lse[(b * Cfg::kHeadsQ + h) * args.s_q + t] = lse;
  }
}

template <class Cfg>
struct CombineLaunch {
  static constexpr int kThreads = kCombineWarps * 32;
  static unsigned blocks(const AttnccArgs& a) {
    const long long rows = static_cast<long long>(a.batch) * a.s_q * Cfg::kHeadsQ;
    return static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps);
  }
};

}  // namespace attncc
