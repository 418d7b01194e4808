// attncc/core/combine.cuh: merge the split-KV partials into out and lse.
//
// Split s of a query row left O_s (already divided by its own l_s) and lse_s (natural log,
// -inf when it saw no key). With L = log(sum_s exp(lse_s)),
//     out = sum_s exp(lse_s - L) * O_s,   lse = L,
// and a row whose splits all saw nothing gets out = 0, lse = -inf. A warp merges a row (or, where
// rows are few and each has many pieces, a 128-column slab of one: a float4 a lane, so that
// more warps share the latency): the pieces' lse with lanes over pieces, each of the first 32
// loaded once (warp max and sum), then the weighted sum with several pieces' loads issued
// before any is used, pieces in order: deterministic. Split mode: split s of a row at workspace
// row s * rows + row. Part mode (schedule.cuh): only sequences that cross parts have partials,
// at the slots of their pieces; the others were written by the decode kernel and are skipped
// (all of them where the parts hold whole sequences, schedule.cuh: the arguments or a word the
// decode kernel writes say so, core/ready.cuh, and the blocks return at once).
// Where a sequence lies on the line takes a warp scan of the whole batch, so a part-mode block
// takes several rows of one sequence and scans once: 16 rows, a warp per row, when there are
// blocks enough to fill the GPU, else a warp per slab of as many rows as fill the block (MLA at
// b = 1 merges 66 parts a row: 127 -> 49 us a call on the H200, decode included), or, where
// those blocks would not fit in one wave, a warp per pair of slabs (a kernel of its own), or per
// row (CombineShape::part_tasks).
//
// Where the plan says so (dependent_launch<Cfg>(), common.cuh), launched as a programmatic
// dependent of the decode kernel (CombineLaunch::launch). Split mode: it reads the sequence
// lengths (inputs) before griddepcontrol.wait, the decode kernel's partials after it, and every
// block waits before it exits, so that the combine's grid never completes before the decode
// kernel's. Part mode with ready words (core/ready.cuh: where sequences are at least as many as
// parts): the decode CTAs let it launch as they start, and a block merges its sequence as soon
// as the ready words of its pieces are set, while the decode grid's last parts still run; a
// sequence the decode kernel wrote whole needs no wait. Block 0 alone waits for the decode grid
// (griddepcontrol.wait), first, which keeps the combine's grid from completing before the decode
// kernel's. Without them, as split mode. (A block reads the partials by plain loads after warp
// 0's acquire loads of the words and a CTA barrier: each acquire synchronizes with a writer's
// release, and the barrier orders the block's loads after it.)
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/ready.cuh"
#include "attncc/core/schedule.cuh"
#include "attncc/core/work.cuh"

namespace attncc {

constexpr int kCombineWarps = 8;
constexpr int kSlabCols = 128;     // a warp's columns of a row: 4 a lane
constexpr int kInFlight = 8;       // pieces whose loads a lane has in flight at once (one slab)
constexpr int kPairFlight = kInFlight / 2;  // ... (a pair of slabs)
constexpr int kPartRows = 16;      // part mode: rows of one sequence per block, when blocks are many
constexpr int kManyBlocks = 512;   // ... which is when 16-row blocks number at least this

// What a warp merges of a row: a 128-column slab (kInFlight pieces in flight), a pair of slabs
// (four), or the whole row (two).
enum class MergeTask : int { kSlab = 0, kPair = 1, kRow = 2 };

template <class Cfg>
struct CombineShape {
  static constexpr int kSlabs = ceil_div(Cfg::kDV, kSlabCols);  // warps per row
  static constexpr bool kPairs = kSlabs % 2 == 0 && kSlabs > 2;  // a row of pairs of slabs

  // Part mode: a warp's task and a block's rows of one sequence. Where 16-row blocks are many, a
  // row, 16 a block; else a slab, as many rows as the block's warps cover, where those blocks fit
  // in one wave (`wave`: the decode grid's CTAs, about one an SM, times the combine's blocks an
  // SM), else a pair of slabs where they fit, else a row, 8 or 16 a block. MLA b = 8 on 66 parts
  // merges 1,024 rows of 4 slabs: 512 blocks of a slab a warp, two waves of 396, or 256 of a pair,
  // 0.974 of the call's time (H100, same-process A/B; b = 32 s_k 8192 0.936, b = 16 s_q 2 0.921,
  // GLA-2 b = 8 (rows) 0.966; bench/RESULTS.md session 51).
  struct PartTasks {
    MergeTask task;
    int rows;
  };
  static constexpr int kSlabRows = kCombineWarps / kSlabs > 0 ? kCombineWarps / kSlabs : 1;  // a block's, a slab a warp
  // Part mode's blocks: one a `rows` rows of each sequence.
  __host__ __device__ static long long part_blocks(int num_seqs, int seq_rows, int rows) {
    return 1LL * num_seqs * ceil_div(seq_rows, rows);
  }
  __host__ __device__ static bool fits(int num_seqs, int seq_rows, int rows, long long wave) {
    return part_blocks(num_seqs, seq_rows, rows) <= wave;
  }
  __host__ __device__ static PartTasks part_tasks(int num_seqs, int seq_rows, long long wave) {
    if (part_blocks(num_seqs, seq_rows, kPartRows) >= kManyBlocks) return {MergeTask::kRow, kPartRows};
    if (fits(num_seqs, seq_rows, kSlabRows, wave)) return {MergeTask::kSlab, kSlabRows};
    if (kPairs && fits(num_seqs, seq_rows, 2 * kSlabRows, wave)) return {MergeTask::kPair, 2 * kSlabRows};
    return {MergeTask::kRow, fits(num_seqs, seq_rows, kCombineWarps, wave) ? kCombineWarps : kPartRows};
  }
  // Blocks the GPU holds at once, for part_tasks: the decode grid's CTAs times kCombineBlocks.
  __host__ __device__ static long long wave(const AttnccArgs& a) {
    return 1LL * a.num_parts * CtaWork<Cfg>::lanes(a.s_q) * Cfg::kCombineBlocks;
  }
  // Split mode: a warp per row when the rows fill the GPU's warps, else a warp per slab.
  __host__ __device__ static bool whole_rows(long long rows) { return rows >= kManyBlocks * kCombineWarps / 2; }
};

// The decode kernel's partials are complete and visible (a no-op without dependent launch: the
// stream orders the kernels).
template <class Cfg>
__device__ __forceinline__ void wait_for_decode() {
  if constexpr (dependent_launch<Cfg>()) griddep_wait();
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, d));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(0xffffffffu, x, d);
  return x;
}

// Merge the partials at workspace rows prow(first), ..., prow(last), in that order, into
// kSlabsPerWarp slabs from `slab` of the query row `row` ([b, s_q, h_q]) of out (and, from slab
// 0, lse); prow(k) < 0 names no partial (skipped). One warp: lanes over pieces for the lse (each
// of the first 32 loaded once), then pieces in order, kInFlight of them loaded before any is used.
template <class Cfg, int kSlabsPerWarp, int kInFlight, class PartialRow>
__device__ __forceinline__ void merge_partials(const AttnccArgs& args, long long row, int slab, int first, int last, PartialRow prow) {
  using E = Elem16<Cfg::kElem>;
  const int lane = threadIdx.x & 31;
  const long long r0 = first + lane <= last ? prow(first + lane) : -1LL;  // the first 32 pieces
  const float lse0 = r0 >= 0 ? args.partial_lse[r0] : -INFINITY;
  float mx = lse0;
  for (int k = first + 32 + lane; k <= last; k += 32) {
    const long long r = prow(k);
    if (r >= 0) mx = fmaxf(mx, args.partial_lse[r]);
  }
  mx = warp_max(mx);
  float sum = mx == -INFINITY ? 0.f : __expf(lse0 - mx);
  if (mx != -INFINITY) {
    for (int k = first + 32 + lane; k <= last; k += 32) {
      const long long r = prow(k);
      if (r >= 0) sum += __expf(args.partial_lse[r] - mx);
    }
  }
  sum = warp_sum(sum);
  const float lse = mx == -INFINITY ? -INFINITY : mx + __logf(sum);

  float4 acc[kSlabsPerWarp];
#pragma unroll
  for (int j = 0; j < kSlabsPerWarp; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (lse != -INFINITY) {
    // 32 pieces at a time: lane k holds the row and weight of piece base + k
    for (int base = first; base <= last; base += 32) {
      const long long r = base == first ? r0 : base + lane <= last ? prow(base + lane) : -1LL;
      const float w = r < 0 ? 0.f : __expf((base == first ? lse0 : args.partial_lse[r]) - lse);  // 0: saw nothing
      const int n = min(32, last - base + 1);
      for (int i = 0; i < n; i += kInFlight) {
        float4 v[kInFlight][kSlabsPerWarp];
        float wu[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int src = (i + u) & 31;
          wu[u] = __shfl_sync(0xffffffffu, w, src);
          const long long ru = __shfl_sync(0xffffffffu, r, src);
#pragma unroll
          for (int j = 0; j < kSlabsPerWarp; ++j) {
            const int c = (slab + j) * kSlabCols + 4 * lane;
            v[u][j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (i + u < n && wu[u] != 0.f && c < Cfg::kDV) v[u][j] = *reinterpret_cast<const float4*>(args.partial_out + ru * Cfg::kDV + c);
          }
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
#pragma unroll
          for (int j = 0; j < kSlabsPerWarp; ++j) {
            acc[j].x += wu[u] * v[u][j].x;
            acc[j].y += wu[u] * v[u][j].y;
            acc[j].z += wu[u] * v[u][j].z;
            acc[j].w += wu[u] * v[u][j].w;
          }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kSlabsPerWarp; ++j) {
    const int c = (slab + j) * kSlabCols + 4 * lane;
    if (c >= Cfg::kDV) continue;
    uint2 packed;
    packed.x = E::pack(acc[j].x, acc[j].y);
    packed.y = E::pack(acc[j].z, acc[j].w);
    *reinterpret_cast<uint2*>(static_cast<typename E::T*>(args.out) + row * Cfg::kDV + c) = packed;
  }
  if (slab == 0 && lane == 0) {
    // row = (b * s_q + t) * h_q + h  ->  lse[b, h, t]
    const long long h = row % Cfg::kHeadsQ;
    const long long bt = row / Cfg::kHeadsQ;
    const long long t = bt % args.s_q, b = bt / args.s_q;
    args.lse[(b * Cfg::kHeadsQ + h) * args.s_q + t] = lse;
  }
}

// A warp's task: a whole row (kSlabs slabs, two pieces in flight) where the rows are many, one
// slab (kInFlight pieces in flight) where they are few and each has many pieces.
template <class Cfg, class PartialRow>
__device__ __forceinline__ void merge_task(const AttnccArgs& args, bool whole_rows, long long row, int slab, int first, int last,
                                           PartialRow prow) {
  if (whole_rows)
    merge_partials<Cfg, CombineShape<Cfg>::kSlabs, 2>(args, row, 0, first, last, prow);
  else
    merge_partials<Cfg, 1, kInFlight>(args, row, slab, first, last, prow);
}

// Cfg::kCombineBlocks blocks per SM (the lowering's combine_blocks: 3, 80 registers a thread for a
// lane's loads in flight, or 2 where the ready words' wait needs 128): the more blocks an SM
// holds, the more of their memory waits overlap. A warp's tasks: kPairTasks, pairs of slabs (part
// mode where part_tasks says so); else rows or slabs as the call's shape says (merge_task). The
// pairs are a kernel of their own: at 80 registers one kernel of all three forms spilled (ptxas),
// and MLA b = 1 took 1.02 of the time with the pairs' code beside the slabs'.
template <class Cfg, bool kPairTasks>
__global__ void __launch_bounds__(kCombineWarps * 32, Cfg::kCombineBlocks) combine_kernel(const __grid_constant__ AttnccArgs args) {
  static_assert(Cfg::kDV % 4 == 0, "float4 loads");
  static_assert(Cfg::kCombineBlocks == 2 || (Cfg::kCombineBlocks == 3 && Cfg::kDV > kSlabCols && !Cfg::kReadyWords),
                "combine_blocks: 3 only where the kernel fits 80 registers (families/base.py combine_blocks)");
  using S = CombineShape<Cfg>;
  static_assert(!kPairTasks || S::kPairs, "pairs of slabs of a row of four or more");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (args.num_parts == 0) {  // split mode: split s of the row at s * rows + row
    const long long rows = static_cast<long long>(args.batch) * args.s_q * Cfg::kHeadsQ;  // [b, s_q, h_q]
    const bool whole = S::whole_rows(rows);
    const int per_row = whole ? 1 : S::kSlabs;  // tasks a row
    const long long task = static_cast<long long>(blockIdx.x) * kCombineWarps + warp;
    const long long row = task / per_row;
    wait_for_decode<Cfg>();
    if (row < rows) merge_task<Cfg>(args, whole, row, static_cast<int>(task % per_row), 0, args.num_splits - 1, [&](int s) { return s * rows + row; });
    return;
  }
  // Part mode: rows [chunk part_rows, ...) of sequence seq (dense: seq = b; sparse: seq = b s_q + t).
  using W = CtaWork<Cfg>;
  const int seq_rows = W::seq_rows(args.s_q);
  const typename S::PartTasks pt = S::part_tasks(W::num_seqs(args), seq_rows, S::wave(args));
  const int chunks = ceil_div(seq_rows, pt.rows);
  const int seq = static_cast<int>(blockIdx.x / chunks), chunk = static_cast<int>(blockIdx.x % chunks);
  const bool ready = ready_words_on<Cfg>(args);  // else every block waits for the decode grid
  if (whole_parts_for_combine<Cfg>(args)) {  // the decode kernel wrote every sequence (core/ready.cuh)
    if (blockIdx.x == 0) wait_for_decode<Cfg>();
    return;
  }
  __shared__ SeqPieces pieces;
  if (warp == 0) {  // where the sequence lies on the line of all tiles (schedule.cuh)
    const TilePrefix line = tiles_before<Cfg>(args, seq, lane);
    const SeqPieces sp = SeqPieces::of(line.before, W::seq_tiles(args, seq), line.total, args.num_parts, Cfg::kPieceCostTiles);
    if (lane == 0) pieces = sp;
  }
  __syncthreads();
  const SeqPieces sp = pieces;
  if (!ready || blockIdx.x == 0) wait_for_decode<Cfg>();
  if (sp.whole()) return;  // the decode kernel wrote this sequence
  if (ready) {
    if (warp == 0) wait_ready<Cfg>(args, sp, lane);  // its pieces' partials written (core/ready.cuh)
    __syncthreads();
  }
  // The pieces in part order: parts first .. last, minus the empty ones (slot -1).
  const long long slot_rows = static_cast<long long>(args.s_q) * Cfg::kHeadsQ;
  const int row0 = chunk * pt.rows, rows = min(seq_rows - row0, pt.rows);
  const bool whole = pt.task == MergeTask::kRow;
  const int per_row = kPairTasks ? S::kSlabs / 2 : whole ? 1 : S::kSlabs;  // tasks a row
  for (int task = warp; task < rows * per_row; task += kCombineWarps) {
    const long long row = static_cast<long long>(seq) * seq_rows + row0 + task / per_row;
    const long long in_slot = row % slot_rows;  // (t, h) within a slot: [slot, s_q, h_q]
    const auto prow = [=](int p) {
      const int slot = sp.slot(p);
      return slot < 0 ? -1LL : slot * slot_rows + in_slot;
    };
    if constexpr (kPairTasks)
      merge_partials<Cfg, 2, kPairFlight>(args, row, 2 * (task % per_row), sp.first, sp.last, prow);
    else
      merge_task<Cfg>(args, whole, row, task % per_row, sp.first, sp.last, prow);
  }
}

template <class Cfg>
struct CombineLaunch {
  static constexpr int kThreads = kCombineWarps * 32;
  using S = CombineShape<Cfg>;
  // The call's task and blocks: part mode, a block per part_tasks' rows of each sequence; split
  // mode, a row or a slab a warp.
  struct Grid {
    MergeTask task;
    unsigned blocks;
  };
  static Grid grid(const AttnccArgs& a) {
    if (a.num_parts > 0) {
      const int seq_rows = CtaWork<Cfg>::seq_rows(a.s_q), num_seqs = CtaWork<Cfg>::num_seqs(a);
      const typename S::PartTasks pt = S::part_tasks(num_seqs, seq_rows, S::wave(a));
      return {pt.task, static_cast<unsigned>(S::part_blocks(num_seqs, seq_rows, pt.rows))};
    }
    const long long rows = static_cast<long long>(a.batch) * a.s_q * Cfg::kHeadsQ;
    const bool whole = S::whole_rows(rows);
    const long long tasks = rows * (whole ? 1 : S::kSlabs);
    return {whole ? MergeTask::kRow : MergeTask::kSlab, static_cast<unsigned>((tasks + kCombineWarps - 1) / kCombineWarps)};
  }

  // The combine after the decode kernel on `stream`, where the call has partials to merge (split
  // or part mode); where the plan says so, as the decode kernel's programmatic dependent (it may
  // launch while the decode kernel's last CTAs run, and waits for their partials).
  static cudaError_t launch(const AttnccArgs& a, cudaStream_t stream) {
    if (a.num_splits == 1 && a.num_parts == 0) return cudaSuccess;
    const Grid g = grid(a);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(g.blocks);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = dependent_launch<Cfg>() ? 1 : 0;
    if constexpr (S::kPairs) {
      if (g.task == MergeTask::kPair) return cudaLaunchKernelEx(&config, combine_kernel<Cfg, true>, a);
    }
    return cudaLaunchKernelEx(&config, combine_kernel<Cfg, false>, a);
  }
};

}  // namespace attncc
