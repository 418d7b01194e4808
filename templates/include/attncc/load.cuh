// attncc/load.cuh: from the paged cache in global memory to shared memory.
//
//   1. Paging. The slot of cache position `pos` is
//          dense:  block_table[b, pos / P] * P + pos % P
//          sparse: indices[b, t, pos]                      (-1 = no token)
//      It is computed once per KV tile, one thread per token, and kept in a small shared array
//      (`slots`), so every 16-byte copy of the tile reads its token's slot from shared memory:
//      page size 1 costs one extra 4-byte load per token, nothing per byte. The global read of
//      the page number / index is issued one KV step ahead into a register (SlotPrefetch), so
//      its latency hides behind a whole step of math.
//   2. Copies. cp.async 16-byte copies (cp.async.cg, L1 bypassed), zero-filled for slot -1 so
//      that masked tokens read as 0 (never NaN: unused slots may hold anything).
//        - 16-bit runs go straight into the staged tile at their staged columns (direct mode);
//        - when the record has an fp8 run, every run goes into a "raw" copy of the record and
//          dequant.cuh converts it into the staged tile (raw mode); fp32 scales are copied with
//          4-byte cp.async.
#pragma once

#include "attncc/abi.h"
#include "attncc/common.cuh"

namespace attncc {

// ------------------------------------------------------------------------------------------
// cp.async

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ------------------------------------------------------------------------------------------
// Paging

// Everything a CTA needs to turn a cache position into a slot.
struct SlotSource {
  const int* row;  // dense: this sequence's block-table row; sparse: this query token's indices
  int limit;       // positions >= limit have no slot (past the sequence or past the CTA's view)
};

// Page number (dense) or index (sparse) of position `pos`; -1 outside [0, limit).
template <class Cfg>
__device__ __forceinline__ int load_slot_raw(const SlotSource& s, int pos) {
  if (pos >= s.limit) return -1;
  if constexpr (Cfg::kSparse) {
    return __ldg(s.row + pos);
  } else {
    return __ldg(s.row + pos / Cfg::kPageSize);
  }
}

template <class Cfg>
__device__ __forceinline__ int slot_from_raw(int raw, int pos) {
  if constexpr (Cfg::kSparse) {
    return raw < 0 ? -1 : raw;
  } else {
    return raw < 0 ? -1 : raw * Cfg::kPageSize + pos % Cfg::kPageSize;
  }
}

// One thread per token of a KV tile holds the next tile's page number / index in a register,
// so that the global load is in flight for a whole KV step before it is stored.
template <class Cfg>
struct SlotPrefetch {
  int raw = -1;

  __device__ __forceinline__ void load(const SlotSource& s, int tile, int tid) {
    if (tid < Cfg::kTileN) raw = load_slot_raw<Cfg>(s, tile * Cfg::kTileN + tid);
  }
  // Store the slot of the tile last loaded (`tile`, again) into `slots`.
  __device__ __forceinline__ void store(int* slots, int tile, int tid) const {
    if (tid < Cfg::kTileN) slots[tid] = slot_from_raw<Cfg>(raw, tile * Cfg::kTileN + tid);
  }
};

// ------------------------------------------------------------------------------------------
// Raw-record layout (raw mode): per token, each run's bytes then, for fp8 runs, its scales,
// each piece padded to 16 bytes.

template <class Cfg>
struct RawLayout {
  __host__ __device__ static constexpr int pad16(int x) { return (x + 15) / 16 * 16; }
  __host__ __device__ static constexpr int data_offset(int i) {
    int off = 0;
    for (int k = 0; k < i; ++k) off += pad16(Cfg::kSources[k].data_bytes()) + pad16(Cfg::kSources[k].num_scales() * 4);
    return off;
  }
  __host__ __device__ static constexpr int scale_offset(int i) { return data_offset(i) + pad16(Cfg::kSources[i].data_bytes()); }
  static constexpr int kPitchBytes = data_offset(Cfg::kNumSources);
  __host__ __device__ static constexpr int bytes(int tokens) { return tokens * kPitchBytes; }
};

// ------------------------------------------------------------------------------------------
// Tile copies

// Byte address of the first element of run `src` for kv head `head` of token slot 0.
template <class Cfg, class Src>
__device__ __forceinline__ const char* run_base(const AttnccArgs& a, const Src& src, int head) {
  return static_cast<const char*>(a.tensors[src.tensor]) + src.offset_bytes + head * src.head_stride_bytes;
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
//   chunk-major (otherwise, or when the caller disallows token-major: its Cursor holds a pointer
//     per pass and source, too many registers to keep live through S = Q K^T when the copies
//     are interleaved there): ItemGrid over the [tile_n x chunks] grid of each source, a slot
//     read and an address computation per copy.
template <class Cfg, class Rows, bool kRaw, int kThreads, bool kAllowTokenMajor = true>
struct TileCopy {
  using Raw = RawLayout<Cfg>;
  template <int I>
  using DataGrid = ItemGrid<Cfg::kTileN, Cfg::kSources[I].data_bytes() / 16, kThreads>;
  template <int I>
  using ScaleGrid = ItemGrid<Cfg::kTileN, Cfg::kSources[I].has_scale() ? Cfg::kSources[I].num_scales() : 1, kThreads>;

  static constexpr int kTPT = 8;  // token-major: threads per token
  static constexpr int kPasses = Cfg::kTileN * kTPT % kThreads == 0 ? Cfg::kTileN * kTPT / kThreads : 0;
  __host__ __device__ static constexpr bool token_major() {
    if (!kAllowTokenMajor || kPasses < 1) return false;
    for (int i = 0; i < Cfg::kNumSources; ++i)
      if (!kRaw && (Cfg::kSources[i].smem_col / 8) % kTPT != 0) return false;
    return true;
  }
  static constexpr bool kTokenMajor = token_major();
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
    const int per_row = Cfg::kSources[i].num_scales();
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
          constexpr long long kStride = Cfg::kTokenStride[src.tensor];
          c.row[u][decltype(si)::value] = run_base<Cfg>(a, src, head) + max(slot, 0) * kStride + tid % kTPT * 16;
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
          constexpr long long kStride = Cfg::kTokenStride[src.tensor];
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
                    d = dst + tok * Raw::kPitchBytes + Raw::data_offset(kI) + (p + j * kTPT) * 16;
                  } else {
                    d = LaneRow<Rows>(dst, tok, p).at(src.smem_col / 8 + j * kTPT);
                  }
                  cp_async_16(d, cur.row[u][kI] + j * kTPT * 16, cur.valid[u]);
                }
              } else {
                const char* base = run_base<Cfg>(a, src, cur.head);
                DataGrid<kI>::visit(k, tid, [&](int tok, int ch) {
                  const int slot = cur.slots[tok];
                  uint32_t d;
                  if constexpr (kRaw) {
                    d = dst + tok * Raw::kPitchBytes + Raw::data_offset(kI) + ch * 16;
                  } else {
                    d = dst + Rows::chunk_offset(tok, src.smem_col / 8 + ch);
                  }
                  cp_async_16(d, base + max(slot, 0) * kStride + ch * 16, slot >= 0);
                });
              }
            }
          });
          if constexpr (scale_items(kI) > 0) {
            constexpr long long kScaleStride = Cfg::kTokenStride[src.scale_tensor];
            static_for<scale_items(kI)>([&](auto ki) {
              constexpr int k = decltype(ki)::value;
              constexpr int item = kFirst + data_items(kI) + k;
              if constexpr (item >= lo && item < hi) {
                const char* sbase = static_cast<const char*>(a.tensors[src.scale_tensor]) + src.scale_offset_bytes +
                                    cur.head * src.scale_head_stride_bytes + src.first_group() * 4;
                ScaleGrid<kI>::visit(k, tid, [&](int tok, int g) {
                  const int slot = cur.slots[tok];
                  cp_async_4(dst + tok * Raw::kPitchBytes + Raw::scale_offset(kI) + g * 4,
                             sbase + max(slot, 0) * kScaleStride + g * 4, slot >= 0);
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
