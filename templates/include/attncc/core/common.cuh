// attncc/core/common.cuh: vocabulary shared by every device header of every family.
//
//   Dtype, Source, Run   the plan's description of a cached token record, as constexpr data
//   Store                where write_cache stores one segment of it
//   static_for           a compile-time loop, so that per-source and per-k-step constants fold
//   Elem16<Dtype>        the 16-bit element type of q, out and the staged tile (bf16 or fp16)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace attncc {

// ------------------------------------------------------------------------------------------
// Plan vocabulary (attncc/layout.py computes every field)

// The archs this translation unit is built for (nvcc's list, seen by the host pass too) all
// have programmatic dependent launch (sm_90+).
constexpr int kBuiltArchs[] = {__CUDA_ARCH_LIST__};
__host__ __device__ constexpr bool built_for_dependent_launch() {
  for (int arch : kBuiltArchs)
    if (arch < 900) return false;
  return true;
}
// The combine is a programmatic dependent of the decode kernel: where the plan says so
// (kDependentLaunch) and the build has the instructions (an sm_80 build of an sm90a plan, run on
// a GPU without them, keeps the stream's order: CombineLaunch::launch sets no attribute).
template <class Cfg>
__host__ __device__ constexpr bool dependent_launch() {
  return Cfg::kDependentLaunch && built_for_dependent_launch();
}

enum class Dtype : int { kBF16 = 0, kFP16 = 1, kE4M3 = 2, kE5M2 = 3 };

__host__ __device__ constexpr bool is_fp8(Dtype d) { return d == Dtype::kE4M3 || d == Dtype::kE5M2; }
__host__ __device__ constexpr int dtype_bytes(Dtype d) { return is_fp8(d) ? 1 : 2; }

// One run of the token record that is staged into shared memory (the plan's "sources").
// Element e of the run, for kv head j and token slot s (page s / P, token s % P), lives at
//   tensors[tensor] + (s / P) page_stride[tensor] + (s % P) token_stride[tensor] (abi.h: the view's)
//     + offset_bytes + j * head_stride + e * bytes(dtype)
// where head_stride is the view's head_stride[tensor] where kHeadAxis[tensor] (a separate
// per-head tensor), else head_stride_bytes (a place in the record; likewise for scales).
// and lands in staged column smem_col + e. In a raw row (fp8 records are copied raw, then
// dequantized) its bytes sit at raw_offset and its scales at raw_scale_offset. An fp8 run
// carries scale_count fp32 scales, one per `scale_group` elements of its segment, from group
// scale_first_group on, at
//   tensors[scale_tensor] + (token offset of s) + scale_offset_bytes
//     + j * (head stride) + ((seg_lo + e) / scale_group) * 4.
// copy_bytes: the size of the cp.async copies that read the run: 16, or 8 for an fp8 run whose
// kv heads' copies sit 8 mod 16 bytes apart in a packed record (each 16-byte chunk in two halves).
struct Source {
  int tensor;
  int offset_bytes;
  int head_stride_bytes;
  int width;
  Dtype dtype;
  int seg_lo;
  int smem_col;
  int raw_offset;
  int raw_scale_offset;
  int scale_tensor;             // -1 when the run has no scale (16-bit runs)
  int scale_offset_bytes;
  int scale_head_stride_bytes;
  int scale_group;
  int scale_first_group;
  int scale_count;
  int copy_bytes;

  __host__ __device__ constexpr int data_bytes() const { return width * dtype_bytes(dtype); }
  __host__ __device__ constexpr bool has_scale() const { return scale_tensor >= 0; }
  // The 16-byte copies both families make of the run can take it where the cache keeps it: a
  // 16-byte aligned first byte, copies of 16 bytes or 8-byte halves (an fp8 run's only) and kv
  // heads' copies a multiple of the copy apart.
  __host__ __device__ constexpr bool copies_fit() const {
    return offset_bytes % 16 == 0 && (copy_bytes == 16 || (copy_bytes == 8 && is_fp8(dtype))) && head_stride_bytes % copy_bytes == 0;
  }
};

// Where write_cache stores one segment (the plan's "stores", spec order). Copy j (kv head j; one
// copy when shared) of a token's `dim` values lives at
//   tensors[tensor] + (token offset of the slot, as for a Source) + offset_bytes + j * head stride
// and, for an fp8 segment, its dim / scale_group fp32 scales at
//   tensors[scale_tensor] + (token offset) + scale_offset_bytes + j * (head stride) + g * 4,
// a head stride being the view's where the tensor has a head axis (kHeadAxis), else the field.
struct Store {
  int tensor;
  int offset_bytes;
  int head_stride_bytes;
  int copies;
  int dim;
  Dtype dtype;
  int scale_group;              // 0: a 16-bit segment
  int scale_tensor;             // -1: none
  int scale_offset_bytes;
  int scale_head_stride_bytes;
  float max_finite;             // fp8: the quantization range (scale = amax / max_finite); 0 otherwise
};

// A run of staged columns [col, col + width) that is part of the key or the value.
struct Run {
  int col;
  int width;
};

// Staged column of logical column `c` of a concatenation of runs (c inside the concatenation).
// Callers use it on multiples of 8: runs are multiples of 8 wide, so 8 consecutive logical
// columns are 8 consecutive staged columns.
template <int kNumRuns>
__host__ __device__ constexpr int run_to_staged(const Run (&runs)[kNumRuns], int c) {
  int base = 0;
  for (int r = 0; r < kNumRuns; ++r) {
    if (c < base + runs[r].width) return runs[r].col + (c - base);
    base += runs[r].width;
  }
  return -1;
}

template <int kNumRuns>
__host__ __device__ constexpr int runs_width(const Run (&runs)[kNumRuns]) {
  int w = 0;
  for (int r = 0; r < kNumRuns; ++r) w += runs[r].width;
  return w;
}

// ------------------------------------------------------------------------------------------
// Compile-time loops: f(Index<0>{}), ..., f(Index<N-1>{}); inside, decltype(i)::value is a
// constant expression.

template <int I>
struct Index {
  static constexpr int value = I;
};

template <int N, int I = 0, class F>
__host__ __device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(Index<I>{});
    static_for<N, I + 1>(f);
  }
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------------------
// 16-bit element types

template <Dtype D>
struct Elem16;

template <>
struct Elem16<Dtype::kBF16> {
  using T = __nv_bfloat16;
  using T2 = __nv_bfloat162;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ T from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ float2 unpack(uint32_t v) { return __bfloat1622float2(*reinterpret_cast<const T2*>(&v)); }
};

template <>
struct Elem16<Dtype::kFP16> {
  using T = __half;
  using T2 = __half2;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ T from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float2 unpack(uint32_t v) { return __half22float2(*reinterpret_cast<const T2*>(&v)); }
};

}  // namespace attncc
