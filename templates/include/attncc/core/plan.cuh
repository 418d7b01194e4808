// attncc/core/plan.cuh: a decode step's schedule on the device (k.plan(seqlens), DESIGN.md
// section 3a): part mode's line of every part (core/work.cuh ScheduleLine), made once per step
// and read by the decode CTAs of every layer instead of cutting the line each (at b = 128, two
// scans of the lengths: ~11 K cycles before a CTA's first piece, bench/RESULTS.md session 42).
// A block of one warp a part, each cutting the line as a decode CTA would (part_line), so the
// two cannot differ; no host sync, so a CUDA graph can hold it.
#pragma once

#include <climits>

#include "attncc/abi.h"
#include "attncc/core/work.cuh"

namespace attncc {

template <class Cfg>
__global__ void __launch_bounds__(32) plan_schedule_kernel(const __grid_constant__ AttnccArgs a, ScheduleLine* lines) {
  const int part = blockIdx.x, lane = threadIdx.x;
  const TileKey k = tiles_key<Cfg>(a, lane);
  const PartLine line = part_line<Cfg>(a, k.total, part, lane);
  if (lane == 0) lines[part] = ScheduleLine{line.total, line.begin, line.end, line.first_base, k.key, line.first_seq, line.whole ? 1 : 0};
}

// attncc_plan_schedule (abi.h): the lines of args->num_parts parts for its lengths and shapes.
template <class Cfg>
int plan_schedule(const AttnccArgs* args, void* lines) {
  if (args == nullptr || lines == nullptr || args->num_parts < 1 || args->batch < 1 || args->s_q < 1 || args->s_q > Cfg::kMaxSq ||
      (!Cfg::kSparse && args->seqlens == nullptr) || reinterpret_cast<uintptr_t>(lines) % 16 != 0)
    return cudaErrorInvalidValue;
  AttnccArgs a = *args;
  a.flags = nullptr;  // a bad length is the call's to flag
  if (a.block_table_cols <= 0) a.block_table_cols = INT_MAX / Cfg::kPageSize;  // no block table: unclamped
  plan_schedule_kernel<Cfg><<<a.num_parts, 32, 0, static_cast<cudaStream_t>(a.stream)>>>(a, static_cast<ScheduleLine*>(lines));
  return cudaGetLastError();
}

}  // namespace attncc
