// attncc/core/copy.cuh: KV tiles and Q rows from global to shared memory, by cp.async.
//
// 16-byte cp.async copies (cp.async.cg, L1 bypassed), zero-filled for slot -1 so that masked
// tokens read as 0 (never NaN: unused slots may hold anything). The slots come from
// paging.cuh, and so does a slot's byte offset in a cache tensor of any page and token strides.
//   - 16-bit runs go straight into the staged tile at their staged columns (direct mode);
//   - when the record has an fp8 run, every run goes into a "raw" row of the record (each run's
//     bytes at its raw_offset, fp8 scales at raw_scale_offset, rows Cfg::kRawPitchBytes apart;
//     attncc/layout.py lays it out) and dequant.cuh converts it into the staged tile (raw
//     mode); fp32 scales are copied with 4-byte cp.async.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/paging.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/smem.cuh"

namespace attncc {

// ------------------------------------------------------------------------------------------
// Tile copies

// Byte address of the first element of run `src` for kv head `head` of token slot 0: a kv head
// is a tensor dimension of any stride (a separate per-head tensor) or a place in the record.
template <class Cfg, int I>
__device__ __forceinline__ const char* run_base(const AttnccArgs& a, int head) {
  constexpr Source src = Cfg::kSources[I];
  const long long head_bytes = Cfg::kHeadAxis[src.tensor] ? static_cast<long long>(head) * a.head_stride[src.tensor]
                                                          : static_cast<long long>(head) * src.head_stride_bytes;
  return static_cast<const char*>(a.tensors[src.tensor]) + src.offset_bytes + head_bytes;
}
// The scale of value v of run I (v from the run's first value): its index among the run's
// scales, which scale_base's address begins.
template <class Cfg, int I>
__device__ __forceinline__ int scale_index(int v) {
  constexpr Source src = Cfg::kSources[I];
  return (src.seg_lo + v) / src.scale_group - src.scale_first_group;
}
template <class Cfg, int I>
__device__ __forceinline__ const char* scale_base(const AttnccArgs& a, int head) {
  constexpr Source src = Cfg::kSources[I];
  const long long head_bytes = Cfg::kHeadAxis[src.scale_tensor] ? static_cast<long long>(head) * a.head_stride[src.scale_tensor]
                                                                : static_cast<long long>(head) * src.scale_head_stride_bytes;
  return static_cast<const char*>(a.tensors[src.scale_tensor]) + src.scale_offset_bytes + head_bytes +
         src.scale_first_group * 4;
}

// Split a [kRows x kPerRow] grid of work items over kThreads threads; visit(k, ...) calls
// f(row, col) for the k-th item of this thread (k < kCount). When kPerRow divides kThreads, a
// thread keeps one column and visits rows r0, r0 + kThreads / kPerRow, ...: the row offsets are
// compile-time constants and the column (hence the swizzle of a 16-byte chunk) is fixed, so an
// item costs a few instructions.
template <int kRows, int kPerRow, int kThreads>
struct ItemGrid {
  static constexpr bool kFast = kThreads % kPerRow == 0;
  static constexpr int kRowStep = kFast ? kThreads / kPerRow : 1;
  static constexpr int kItems = kRows * kPerRow;
  static constexpr int kCount = kFast ? ceil_div(kRows, kRowStep) : ceil_div(kItems, kThreads);

  template <class F>
  __device__ __forceinline__ static void visit(int k, int tid, F&& f) {
    if constexpr (kFast) {
      const int r0 = tid / kPerRow, col = tid % kPerRow;
      if (kRows % kRowStep == 0 || r0 + k * kRowStep < kRows) f(r0 + k * kRowStep, col);
    } else {
      const unsigned c = static_cast<unsigned>(tid) + k * kThreads;
      if (kItems % kThreads == 0 || c < static_cast<unsigned>(kItems)) f(static_cast<int>(c / kPerRow), static_cast<int>(c % kPerRow));
    }
  }
};

template <int kRows, int kPerRow, int kThreads, class F>
__device__ __forceinline__ void for_each_item(int tid, F&& f) {
  using G = ItemGrid<kRows, kPerRow, kThreads>;
#pragma unroll
  for (int k = 0; k < G::kCount; ++k) G::visit(k, tid, f);
}

// The cp.async copies of one KV tile of Cfg::kTileN tokens whose slots are in `slots`:
//   direct mode (kRaw = false): 16-bit runs into the staged tile `dst` (layout Rows);
//   raw mode    (kRaw = true):  every run, and fp8 scales, into the raw record rows at `dst`.
// A token with slot -1 reads address `base` with size 0: zero-filled.
// A thread's copies are kItems items (per source: its data chunks, then its scales); issue<P, N>
// issues the P-th of N near-equal parts of them, so that the copies of the next tile can be
// spread over the k-steps of S = Q K^T (their issue slots then hide behind ldmatrix latency).
//
// Data chunks are split over the threads in one of two ways:
//   token-major (kTokenMajor): 8 threads per token, so that one cp.async of a warp reads 4
//     tokens x 128 contiguous bytes. Thread tid copies chunks p + 8 j (p = tid % 8) of the
//     kPasses = tile_n * 8 / threads tokens tid / 8 + u * threads / 8. Its slots are read once
//     per tile (Cursor) and every copy's shared address is a constant plus one per-thread value
//     (LaneRow; staged columns on multiples of 8 chunks): a copy costs little more than its
//     cp.async, which matters when the copies are spread over the k-steps of S = Q K^T.
//   chunk-major (otherwise, or where the lowering chose it: a token-major Cursor holds a pointer
//     per pass and source, too many registers to keep live through S = Q K^T when the copies
//     are interleaved there): ItemGrid over the [tile_n x chunks] grid of each source, a slot
//     read and an address computation per copy.
template <class Cfg, class Rows, bool kRaw, int kThreads, bool kTokenMajorCopies>
struct TileCopy {
  static constexpr int kRawPitch = Cfg::kRawPitchBytes;
  template <int I>
  using DataGrid = ItemGrid<Cfg::kTileN, Cfg::kSources[I].data_bytes() / 16, kThreads>;
  template <int I>
  using ScaleGrid = ItemGrid<Cfg::kTileN, Cfg::kSources[I].has_scale() ? Cfg::kSources[I].scale_count : 1, kThreads>;

  static constexpr int kTPT = 8;  // token-major: threads per token
  static constexpr int kPasses = Cfg::kTileN * kTPT % kThreads == 0 ? Cfg::kTileN * kTPT / kThreads : 0;
  __host__ __device__ static constexpr bool token_major_legal() {
    if (kPasses < 1) return false;
    for (int i = 0; i < Cfg::kNumSources; ++i)
      if (!kRaw && (Cfg::kSources[i].smem_col / 8) % kTPT != 0) return false;
    return true;
  }
  static constexpr bool kTokenMajor = kTokenMajorCopies;  // the lowering's choice
  static_assert(!kTokenMajor || token_major_legal(),
                "token-major copies: tile_n * 8 a multiple of the copy threads, staged runs on 64-column boundaries");
  static constexpr int kCursorPointers = kTokenMajor ? kPasses * Cfg::kNumSources : 0;  // Cursor::row in use
  // Token-major: chunks of source i per thread and token.
  __host__ __device__ static constexpr int token_chunks(int i) { return ceil_div(Cfg::kSources[i].data_bytes() / 16, kTPT); }

  __host__ __device__ static constexpr int data_items(int i) {
    const int per_row = Cfg::kSources[i].data_bytes() / 16;
    if (kTokenMajor) return kPasses * token_chunks(i);
    return kThreads % per_row == 0 ? ceil_div(Cfg::kTileN, kThreads / per_row) : ceil_div(Cfg::kTileN * per_row, kThreads);
  }
  __host__ __device__ static constexpr int scale_items(int i) {
    if (!kRaw || !Cfg::kSources[i].has_scale()) return 0;
    const int per_row = Cfg::kSources[i].scale_count;
    return kThreads % per_row == 0 ? ceil_div(Cfg::kTileN, kThreads / per_row) : ceil_div(Cfg::kTileN * per_row, kThreads);
  }
  __host__ __device__ static constexpr int first_item(int i) {
    int n = 0;
    for (int k = 0; k < i; ++k) n += data_items(k) + scale_items(k);
    return n;
  }
  static constexpr int kItems = first_item(Cfg::kNumSources);

  // What a thread needs to issue its copies of one tile: the tile's slots (chunk-major, scales)
  // and, token-major, its tokens' addresses in every source (one slot read per token).
  struct Cursor {
    const int* slots;
    int head;
    const char* row[kPasses > 0 ? kPasses : 1][Cfg::kNumSources];  // token-major: source + slot * stride + chunk p
    bool valid[kPasses > 0 ? kPasses : 1];                         // token-major: the token has a slot
  };

  __device__ __forceinline__ static Cursor cursor(const AttnccArgs& a, const int* slots, int head, int tid) {
    Cursor c;
    c.slots = slots;
    c.head = head;
    if constexpr (kTokenMajor) {
#pragma unroll
      for (int u = 0; u < kPasses; ++u) {
        const int slot = slots[tid / kTPT + u * (kThreads / kTPT)];
        c.valid[u] = slot >= 0;
        static_for<Cfg::kNumSources>([&](auto si) {
          constexpr Source src = Cfg::kSources[decltype(si)::value];
          c.row[u][decltype(si)::value] = run_base<Cfg, decltype(si)::value>(a, head) + token_offset<Cfg, src.tensor>(a, max(slot, 0)) + tid % kTPT * 16;
        });
      }
    }
    return c;
  }

  template <int kPart, int kParts>
  __device__ __forceinline__ static void issue(const AttnccArgs& a, uint32_t dst, const Cursor& cur, int tid) {
    constexpr int lo = kPart * kItems / kParts, hi = (kPart + 1) * kItems / kParts;
    if constexpr (lo < hi) {
      static_for<Cfg::kNumSources>([&](auto si) {
        constexpr int kI = decltype(si)::value;
        constexpr Source src = Cfg::kSources[kI];
        constexpr int kFirst = first_item(kI);
        if constexpr (kFirst < hi && kFirst + data_items(kI) + scale_items(kI) > lo) {
          constexpr int kPerRow = src.data_bytes() / 16;
          static_for<data_items(kI)>([&](auto ki) {
            constexpr int k = decltype(ki)::value;
            if constexpr (kFirst + k >= lo && kFirst + k < hi) {
              if constexpr (kTokenMajor) {
                constexpr int u = k / token_chunks(kI), j = k % token_chunks(kI);  // pass, chunk step
                const int tok = tid / kTPT + u * (kThreads / kTPT), p = tid % kTPT;
                if (kPerRow % kTPT == 0 || p + j * kTPT < kPerRow) {
                  uint32_t d;
                  if constexpr (kRaw) {
                    d = dst + tok * kRawPitch + src.raw_offset + (p + j * kTPT) * 16;
                  } else {
                    d = LaneRow<Rows>(dst, tok, p).at(src.smem_col / 8 + j * kTPT);
                  }
                  cp_async_chunk<src.copy_bytes>(d, cur.row[u][kI] + j * kTPT * 16, cur.valid[u]);
                }
              } else {
                const char* base = run_base<Cfg, kI>(a, cur.head);
                DataGrid<kI>::visit(k, tid, [&](int tok, int ch) {
                  const int slot = cur.slots[tok];
                  uint32_t d;
                  if constexpr (kRaw) {
                    d = dst + tok * kRawPitch + src.raw_offset + ch * 16;
                  } else {
                    d = dst + Rows::chunk_offset(tok, src.smem_col / 8 + ch);
                  }
                  cp_async_chunk<src.copy_bytes>(d, base + token_offset<Cfg, src.tensor>(a, max(slot, 0)) + ch * 16, slot >= 0);
                });
              }
            }
          });
          if constexpr (scale_items(kI) > 0) {
            static_for<scale_items(kI)>([&](auto ki) {
              constexpr int k = decltype(ki)::value;
              constexpr int item = kFirst + data_items(kI) + k;
              if constexpr (item >= lo && item < hi) {
                const char* sbase = scale_base<Cfg, kI>(a, cur.head);
                ScaleGrid<kI>::visit(k, tid, [&](int tok, int g) {
                  const int slot = cur.slots[tok];
                  cp_async_4(dst + tok * kRawPitch + src.raw_scale_offset + g * 4,
                             sbase + token_offset<Cfg, src.scale_tensor>(a, max(slot, 0)) + g * 4, slot >= 0);
                });
              }
            });
          }
        }
      });
    }
  }

  __device__ __forceinline__ static void issue_all(const AttnccArgs& a, uint32_t dst, const int* slots, int head, int tid) {
    issue<0, 1>(a, dst, cursor(a, slots, head, tid), tid);
  }
};

// Issue the copies of the CTA's query rows into the Q tile (layout QRows); row r of the tile
// starts at `row_ptr(r)`, or is zero-filled when row_ptr returns nullptr (`any` is some valid
// global address, never read).
template <class Cfg, class QRows, int kThreads, class RowPtr>
__device__ __forceinline__ void issue_q(uint32_t dst, RowPtr row_ptr, const void* any, int tid) {
  for_each_item<Cfg::kTileM, Cfg::kDK / 8, kThreads>(tid, [&](int r, int ch) {
    const char* p = row_ptr(r);
    cp_async_16(dst + QRows::chunk_offset(r, ch), p ? p + ch * 16 : any, p != nullptr);
  });
}

}  // namespace attncc
