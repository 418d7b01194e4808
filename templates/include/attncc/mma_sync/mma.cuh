// attncc/mma_sync/mma.cuh: warp-level tensor-core primitives (sm_80+): ldmatrix and mma.sync m16n8k16.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), g = lane / 4, q = lane % 4:
//   A 16x16 (row-major), 4 regs of 2 elements:
//       a0: (g, 2q..2q+1)  a1: (g+8, 2q..)  a2: (g, 8+2q..)  a3: (g+8, 8+2q..)
//   B 16x8 (k x n, "col"), 2 regs:  b0: (k = 2q..2q+1, n = g)  b1: (k = 8+2q.., n = g)
//   C 16x8 fp32, 4 regs:  c0,c1: (g, 2q..2q+1)  c2,c3: (g+8, 2q..2q+1)
//
// ldmatrix: each of the (1, 2 or 4) 8x8 matrices is 8 rows of 16 bytes; lanes 8i..8i+7 give
// the row addresses of matrix i; register i of every lane receives its part of matrix i.
//   - non-transposed, rows = the M (or N) index and 16 bytes along K: yields A or B fragments
//     directly from row-major Q / K / P tiles;
//   - .trans, rows = K index and 16 bytes along N: yields B fragments from a row-major V tile.
#pragma once

#include "attncc/core/common.cuh"

namespace attncc {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// C += A * B for one m16n8k16 tile, fp32 accumulate, 16-bit operands of type E.
template <Dtype E>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(E == Dtype::kBF16 || E == Dtype::kFP16, "mma operands are 16-bit");
  if constexpr (E == Dtype::kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Lane -> (row, 8-column half) that a lane addresses in ldmatrix.x4 of a 16x16 A tile:
// matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
__device__ __forceinline__ int a_ldm_row(int lane) { return lane & 15; }
__device__ __forceinline__ int a_ldm_khalf(int lane) { return lane >> 4; }

// ldmatrix.x4 of B fragments for two n-tiles (16 rows of a row-major [n][k] tile, k16):
// matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15); registers
// {r0, r1} are n-tile 0, {r2, r3} n-tile 1.
__device__ __forceinline__ int b_ldm_row(int lane) { return ((lane >> 4) << 3) | (lane & 7); }
__device__ __forceinline__ int b_ldm_khalf(int lane) { return (lane >> 3) & 1; }

// ldmatrix.x4.trans of B fragments for two n-tiles from a row-major [k][n] tile (V):
// matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15); registers
// {r0, r1} are n-tile 0, {r2, r3} n-tile 1.
__device__ __forceinline__ int bt_ldm_row(int lane) { return (((lane >> 3) & 1) << 3) | (lane & 7); }
__device__ __forceinline__ int bt_ldm_nhalf(int lane) { return lane >> 4; }

}  // namespace attncc
