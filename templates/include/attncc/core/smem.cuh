// attncc/core/smem.cuh: row-major 16-bit tiles in shared memory, addressed in 16-byte chunks.
#pragma once

#include <stdint.h>

namespace attncc {

constexpr int kSmemLimitBytes = 232448;  // 227 KB: the largest dynamic shared memory of a CTA on sm_90

// The byte layout of a row-major tile of 16-bit elements, kCols wide, with the row pitch and
// the swizzle the lowering chose (families/mma_sync.py, SmemRows.of). ldmatrix reads one chunk
// from each of 8 consecutive rows; those 8 chunks must fall in 8 different 16-byte bank groups,
// or the read serialises:
//   - swizzled: no padding, chunk c of row r is stored at chunk c ^ (r % 8) (XOR swizzle inside
//     each aligned group of 8 chunks), which needs a multiple of 8 chunks per row;
//   - otherwise the pitch in chunks must be odd, so rows start in different bank groups.
template <int kCols, int kPitch, bool kSwizzled>
struct SmemRows {
  static_assert(kCols % 8 == 0, "a staged row is a whole number of 16-byte chunks");
  static constexpr int kChunks = kCols / 8;
  static constexpr bool kSwizzle = kSwizzled;
  static constexpr int kPitchBytes = kPitch;
  static constexpr int kPitchChunks = kPitch / 16;
  static_assert(kPitch % 16 == 0 && kPitchChunks >= kChunks, "the pitch holds the row's chunks");
  static_assert(kSwizzle ? (kChunks % 8 == 0 && kPitchChunks == kChunks) : kPitchChunks % 2 == 1,
                "conflict-free ldmatrix: XOR swizzle of whole 8-chunk groups, or an odd pitch");

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
// In every ldmatrix of the mma.sync kernel, lane l addresses a row r with r % 8 == l % 8 and
// either chunk C or C + 1 of it, C even, l's choice fixed for the whole kernel (off = `half`).
// With the XOR swizzle the physical chunk is (C + half) ^ (r % 8) = (C & ~7) + ((C & 7) ^ xh)
// with xh = (r % 8) ^ half; for constant C the second term takes 4 values, which the compiler
// keeps in registers across the unrolled k-steps. A warp-fixed chunk offset koff in {0, 2} (the
// odd k-steps of a qk_split pair) is folded in the same way, xh ^= koff, when every C is a
// multiple of 4: then C + koff + half = C ^ koff ^ half. In general: off < 2^k and C a multiple
// of 2^k (2^k <= 8) give C + off = C ^ off, which is how the token-major tile copies use it
// (off = the thread's chunk phase p < threads per token).
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

}  // namespace attncc

namespace attncc {

// A region of a CTA's shared-memory plan (the lowering's offsets; the sizes are what the
// kernel uses).
struct SmemRegion {
  int offset;
  int bytes;
};

// Every region 16-byte aligned, inside [0, total), and no two overlapping.
template <int N>
__host__ __device__ constexpr bool smem_plan_ok(const SmemRegion (&r)[N], int total) {
  for (int i = 0; i < N; ++i) {
    if (r[i].offset % 16 != 0 || r[i].bytes < 0 || r[i].offset + r[i].bytes > total) return false;
    for (int j = 0; j < i; ++j)
      if (r[i].bytes > 0 && r[j].bytes > 0 && r[i].offset < r[j].offset + r[j].bytes && r[j].offset < r[i].offset + r[i].bytes)
        return false;
  }
  return true;
}

}  // namespace attncc
