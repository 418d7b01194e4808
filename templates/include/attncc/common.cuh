// attncc/common.cuh: vocabulary shared by every device header.
//
//   Dtype, Source, Run   the plan's description of a cached token record, as constexpr data
//   static_for           a compile-time loop, so that per-source and per-k-step constants fold
//   Elem16<Dtype>        the 16-bit element type of q, out and the staged tile (bf16 or fp16)
//   SmemRows             the byte layout of a row-major 16-bit tile in shared memory
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace attncc {

// ------------------------------------------------------------------------------------------
// Plan vocabulary

enum class Dtype : int { kBF16 = 0, kFP16 = 1, kE4M3 = 2, kE5M2 = 3 };

__host__ __device__ constexpr bool is_fp8(Dtype d) { return d == Dtype::kE4M3 || d == Dtype::kE5M2; }
__host__ __device__ constexpr int dtype_bytes(Dtype d) { return is_fp8(d) ? 1 : 2; }

// One run of the token record that is staged into shared memory (the plan's "sources").
// Element e of the run, for kv head j and token slot s, lives at
//   tensors[tensor] + s * token_stride[tensor] + offset_bytes + j * head_stride_bytes + e * bytes(dtype)
// and lands in staged column smem_col + e. An fp8 run carries one fp32 scale per `scale_group`
// elements of its segment, at
//   tensors[scale_tensor] + s * token_stride[scale_tensor] + scale_offset_bytes
//     + j * scale_head_stride_bytes + ((seg_lo + e) / scale_group) * 4.
struct Source {
  int tensor;
  int offset_bytes;
  int head_stride_bytes;
  int width;
  Dtype dtype;
  int seg_lo;
  int smem_col;
  int scale_tensor;             // -1 when the run has no scale (16-bit runs)
  int scale_offset_bytes;
  int scale_head_stride_bytes;
  int scale_group;

  __host__ __device__ constexpr int data_bytes() const { return width * dtype_bytes(dtype); }
  __host__ __device__ constexpr bool has_scale() const { return scale_tensor >= 0; }
  // Scales that cover this run: groups seg_lo / G .. (seg_lo + width - 1) / G.
  __host__ __device__ constexpr int first_group() const { return has_scale() ? seg_lo / scale_group : 0; }
  __host__ __device__ constexpr int num_scales() const {
    return has_scale() ? (seg_lo + width - 1) / scale_group - seg_lo / scale_group + 1 : 0;
  }
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
};

// ------------------------------------------------------------------------------------------
// Shared-memory layout of a row-major tile of 16-bit elements, kCols wide, addressed in
// 16-byte chunks (8 elements). ldmatrix reads one chunk from each of 8 consecutive rows; those
// 8 chunks must fall in 8 different 16-byte bank groups, or the read serialises.
//   - kCols / 8 a multiple of 8: no padding, chunk c of row r is stored at chunk c ^ (r % 8)
//     (XOR swizzle inside each aligned group of 8 chunks).
//   - kCols / 8 odd: rows already start in different bank groups; stored as is.
//   - otherwise: each row padded by one chunk (pitch odd).
template <int kCols>
struct SmemRows {
  static_assert(kCols % 8 == 0, "a staged row is a whole number of 16-byte chunks");
  static constexpr int kChunks = kCols / 8;
  static constexpr bool kSwizzle = kChunks % 8 == 0;
  static constexpr int kPitchChunks = (kSwizzle || kChunks % 2 == 1) ? kChunks : kChunks + 1;
  static constexpr int kPitchBytes = kPitchChunks * 16;

  __host__ __device__ static constexpr int bytes(int rows) { return rows * kPitchBytes; }

  // Byte offset of chunk `chunk` of row `row`.
  static __device__ __forceinline__ uint32_t chunk_offset(int row, int chunk) {
    if constexpr (kSwizzle) {
      return row * kPitchBytes + ((chunk ^ (row & 7)) << 4);
    } else {
      return row * kPitchBytes + (chunk << 4);
    }
  }
  // Byte offset of element `col` of row `row`.
  static __device__ __forceinline__ uint32_t elem_offset(int row, int col) {
    return chunk_offset(row, col >> 3) + ((col & 7) << 1);
  }
};

// Addressing of one lane's (or thread's) row of a SmemRows tile, for chunks C + off where the
// offset `off` is fixed per lane and C is a compile-time constant.
//
// In every ldmatrix of the decode kernel, lane l addresses a row r with r % 8 == l % 8 and either
// chunk C or C + 1 of it, C even, l's choice fixed for the whole kernel (off = `half`). With the
// XOR swizzle the physical chunk is (C + half) ^ (r % 8) = (C & ~7) + ((C & 7) ^ xh) with
// xh = (r % 8) ^ half; for constant C the second term takes 4 values, which the compiler keeps
// in registers across the unrolled k-steps. A warp-fixed chunk offset koff in {0, 2} (the odd
// k-steps of a qk_split pair) is folded in the same way, xh ^= koff, when every C is a multiple
// of 4: then C + koff + half = C ^ koff ^ half. In general: off < 2^k and C a multiple of 2^k
// (2^k <= 8) give C + off = C ^ off, which is how the token-major tile copies use it (off = the
// thread's chunk phase p < threads per token).
template <class Rows>
struct LaneRow {
  uint32_t row_addr;  // tile + r * pitch (plain: + koff chunks)
  int xh;             // swizzled: (r % 8) ^ half ^ koff; plain: half

  LaneRow() = default;
  __device__ __forceinline__ LaneRow(uint32_t tile, int row, int half, int koff = 0) {
    row_addr = tile + row * Rows::kPitchBytes + (Rows::kSwizzle ? 0 : koff * 16);
    xh = Rows::kSwizzle ? ((row & 7) ^ half ^ koff) : half;
  }
  // Address of chunk C + koff + half (C: see above).
  __device__ __forceinline__ uint32_t at(int c) const {
    if constexpr (Rows::kSwizzle) {
      return row_addr + ((c & ~7) << 4) + (((c & 7) ^ xh) << 4);
    } else {
      return row_addr + ((c + xh) << 4);
    }
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace attncc
