// attncc/core/combine.cuh: merge the split-KV partials into out and lse.
//
// Split s of a query row left O_s (already divided by its own l_s) and lse_s (natural log,
// -inf when it saw no key). With L = log(sum_s exp(lse_s)),
//     out = sum_s exp(lse_s - L) * O_s,   lse = L,
// and a row whose splits all saw nothing gets out = 0, lse = -inf. One warp per query row,
// splits visited in order: deterministic. Split mode: split s of a row at workspace row
// s * rows + row. Part mode (schedule.cuh): only sequences that cross parts have partials, at
// the slots of their pieces; the others were written by the decode kernel and are skipped.
// Where a sequence lies on the line takes a warp scan of the whole batch, so a part-mode block
// takes kPartRows rows of one sequence and scans once. A warp per row, each scanning, took
// 33 us on MLA h_q 128 b 128 (H200, uniform or ragged lengths); now 22 (and 19 -> 5-8 us on
// a batch with nothing to merge).
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/schedule.cuh"
#include "attncc/core/work.cuh"

namespace attncc {

constexpr int kCombineWarps = 8;
constexpr int kPartRows = 16;  // part mode: rows of one sequence per block

// Merge the partials at workspace rows prow(first), ..., prow(last), in that order, into the
// query row `row` ([b, s_q, h_q]) of out and lse; prow(k) < 0 names no partial (skipped). One
// warp; every lane walks the pieces.
template <class Cfg, class PartialRow>
__device__ __forceinline__ void merge_partials(const AttnccArgs& args, long long row, int first, int last, PartialRow prow) {
  using E = Elem16<Cfg::kElem>;
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int k = first; k <= last; ++k)
    if (prow(k) >= 0) mx = fmaxf(mx, args.partial_lse[prow(k)]);
  float sum = 0.f;
  if (mx != -INFINITY)
    for (int k = first; k <= last; ++k)
      if (prow(k) >= 0) sum += __expf(args.partial_lse[prow(k)] - mx);
  const float lse = mx == -INFINITY ? -INFINITY : mx + __logf(sum);

  // Each lane owns columns 4 lane + 128 j: a piece's loads for all of them are issued together.
  constexpr int kChunks = ceil_div(Cfg::kDV, 128);
  float4 acc[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (lse != -INFINITY) {
    for (int k = first; k <= last; ++k) {
      const long long r = prow(k);
      if (r < 0) continue;
      const float w = __expf(args.partial_lse[r] - lse);  // 0 for a piece that saw nothing
      if (w == 0.f) continue;
      const float* src = args.partial_out + r * Cfg::kDV;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = lane * 4 + j * 128;
        if (c >= Cfg::kDV) continue;
        const float4 v = *reinterpret_cast<const float4*>(src + c);
        acc[j].x += w * v.x;
        acc[j].y += w * v.y;
        acc[j].z += w * v.z;
        acc[j].w += w * v.w;
      }
    }
  }
  auto* out = static_cast<typename E::T*>(args.out) + row * Cfg::kDV;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane * 4 + j * 128;
    if (c >= Cfg::kDV) continue;
    uint2 packed;
    packed.x = E::pack(acc[j].x, acc[j].y);
    packed.y = E::pack(acc[j].z, acc[j].w);
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

// Four blocks per SM: a register budget of 64. With none given, ptxas held the fp8 sparse MLA
// combine to 48 registers and spilled 4 bytes.
template <class Cfg>
__global__ void __launch_bounds__(kCombineWarps * 32, 4) combine_kernel(const __grid_constant__ AttnccArgs args) {
  static_assert(Cfg::kDV % 4 == 0, "float4 loads");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (args.num_parts == 0) {  // split mode: split s of the row at s * rows + row
    const long long rows = static_cast<long long>(args.batch) * args.s_q * Cfg::kHeadsQ;  // [b, s_q, h_q]
    const long long row = static_cast<long long>(blockIdx.x) * kCombineWarps + warp;
    if (row < rows) merge_partials<Cfg>(args, row, 0, args.num_splits - 1, [&](int s) { return s * rows + row; });
    return;
  }
  // Part mode: rows [chunk kPartRows, ...) of sequence seq (dense: seq = b; sparse: seq = b s_q + t).
  using W = CtaWork<Cfg>;
  const int seq_rows = W::seq_rows(args.s_q);
  const int chunks = ceil_div(seq_rows, kPartRows);
  const int seq = static_cast<int>(blockIdx.x / chunks), chunk = static_cast<int>(blockIdx.x % chunks);
  __shared__ SeqPieces pieces;
  if (warp == 0) {  // where the sequence lies on the line of all tiles (schedule.cuh)
    const TilePrefix line = tiles_before<Cfg>(args, seq, lane);
    const SeqPieces sp = SeqPieces::of(line.before, W::seq_tiles(args, seq), line.total, args.num_parts);
    if (lane == 0) pieces = sp;
  }
  __syncthreads();
  const SeqPieces sp = pieces;
  if (sp.whole()) return;  // the decode kernel wrote this sequence
  // The pieces in part order: parts first .. last, minus the empty ones (slot -1).
  const long long slot_rows = static_cast<long long>(args.s_q) * Cfg::kHeadsQ;
  for (int i = chunk * kPartRows + warp; i < min(seq_rows, (chunk + 1) * kPartRows); i += kCombineWarps) {
    const long long row = static_cast<long long>(seq) * seq_rows + i;
    const long long in_slot = row % slot_rows;  // (t, h) within a slot: [slot, s_q, h_q]
    merge_partials<Cfg>(args, row, sp.first, sp.last, [=](int p) {
      const int slot = sp.slot(p);
      return slot < 0 ? -1LL : slot * slot_rows + in_slot;
    });
  }
}

template <class Cfg>
struct CombineLaunch {
  static constexpr int kThreads = kCombineWarps * 32;
  static unsigned blocks(const AttnccArgs& a) {
    if (a.num_parts > 0)  // one block per kPartRows rows of each sequence
      return static_cast<unsigned>(1LL * CtaWork<Cfg>::num_seqs(a) * ceil_div(CtaWork<Cfg>::seq_rows(a.s_q), kPartRows));
    const long long rows = static_cast<long long>(a.batch) * a.s_q * Cfg::kHeadsQ;
    return static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps);
  }
};

}  // namespace attncc
