// attncc/core/paging.cuh: from a cache position to its token slot.
//
// The slot of cache position `pos` is
//     dense:  block_table[b, pos / P] * P + pos % P
//     sparse: indices[b, t, pos]                      (-1 = no token)
// It is computed once per KV tile, one thread per token, and kept in a small shared array
// (`slots`), so every 16-byte copy of the tile reads its token's slot from shared memory: page
// size 1 costs one extra 4-byte load per token, nothing per byte. The global read of the page
// number / index is issued one KV step ahead into a register (SlotPrefetch), so its latency
// hides behind a whole step of math.
#pragma once

#include "attncc/abi.h"

namespace attncc {

// Everything a CTA needs to turn a cache position into a slot (with the launch's arguments:
// num_pages and flags are read from them where used, not kept in registers).
struct SlotSource {
  const int* row;  // dense: this sequence's block-table row; sparse: this query token's indices
  int limit;       // positions >= limit have no slot (past the sequence or past the CTA's view)
};

// SlotSource::row of a CTA's sequence: dense, batch entry b's block-table row; sparse, query token
// seq's indices (seq = b s_q + t).
template <class Cfg>
__device__ __forceinline__ const int* slot_row(const AttnccArgs& a, int seq, int b) {
  return Cfg::kSparse ? a.indices + static_cast<long long>(seq) * Cfg::kTopK : a.block_table + static_cast<long long>(b) * a.block_table_stride;
}

// The slot index (page number or index) of cache position `pos` within its row.
template <class Cfg>
__device__ __forceinline__ int slot_index(int pos) {
  return Cfg::kSparse ? pos : pos / Cfg::kPageSize;
}

// The raw value of a position past `limit`: no slot, and not a bad value either.
constexpr int kPastEnd = -2147483647 - 1;

// Page number (dense) or index (sparse) of position `pos`; kPastEnd at or past `limit`.
template <class Cfg>
__device__ __forceinline__ int load_slot_raw(const SlotSource& s, int pos) {
  if (pos >= s.limit) return kPastEnd;
  return __ldg(s.row + slot_index<Cfg>(pos));
}

// A slot that is not a token: -1 (past the sequence, or a sparse -1) and kBadSlot (a value
// that cannot be a slot, below). Copies zero-fill both; masks drop both.
constexpr int kBadSlot = -2;

// The slot of position `pos` from its raw value. A raw value that cannot be a slot (dense: a
// page outside [0, num_pages) of a position the sequence has; sparse: an index outside
// [-1, num_pages * P)) is never used: the token counts as absent (kBadSlot), and its bit is set
// in *a.flags. The common case costs one unsigned compare.
template <class Cfg>
__device__ __forceinline__ int slot_from_raw(const AttnccArgs& a, int raw, int pos) {
  if constexpr (Cfg::kSparse) {
    if (static_cast<unsigned long long>(static_cast<long long>(raw) + 1) <=
        static_cast<unsigned long long>(a.num_pages) * Cfg::kPageSize)
      return raw;  // -1 .. num_pages * P - 1
    if (raw == kPastEnd) return -1;
    if (a.flags) atomicOr(a.flags, ATTNCC_FLAG_INDEX);
    return kBadSlot;
  } else {
    if (static_cast<unsigned>(raw) < static_cast<unsigned>(a.num_pages)) return raw * Cfg::kPageSize + pos % Cfg::kPageSize;
    if (raw == kPastEnd) return -1;
    if (a.flags) atomicOr(a.flags, ATTNCC_FLAG_PAGE);
    return kBadSlot;
  }
}

// One thread per token of a KV tile holds the next tile's page number / index in a register,
// so that the global load is in flight for a whole KV step before it is stored.
template <class Cfg>
struct SlotPrefetch {
  int raw = kPastEnd;

  __device__ __forceinline__ void load(const SlotSource& s, int tile, int tid) {
    if (tid < Cfg::kTileN) raw = load_slot_raw<Cfg>(s, tile * Cfg::kTileN + tid);
  }
  // Store the slots of the tile last loaded (`tile`, again) into `slots` and, dense, after them
  // the tile's hole words: word w the ballot of tokens 32 w .. 32 w + 31 whose page number was
  // bad (tile_has_hole). Called by whole warps, a warp's tids consecutive from a multiple of 32.
  __device__ __forceinline__ void store(const AttnccArgs& a, int* slots, int tile, int tid) const {
    const int slot = tid < Cfg::kTileN ? slot_from_raw<Cfg>(a, raw, tile * Cfg::kTileN + tid) : -1;
    if (tid < Cfg::kTileN) slots[tid] = slot;
    if constexpr (!Cfg::kSparse) {
      const unsigned bad = __ballot_sync(0xffffffffu, slot == kBadSlot);
      if (tid < Cfg::kTileN && tid % 32 == 0) slots[Cfg::kTileN + tid / 32] = static_cast<int>(bad);
    }
  }
};

// Whether a tile has a token of a bad page number: its kWords hole words (after its slots,
// written by SlotPrefetch::store) not all 0. Read whole (a broadcast); the same for every thread.
template <int kWords>
__device__ __forceinline__ bool tile_has_hole(const int* words) {
  int any = 0;
  static_assert(kWords >= 1, "a hole word per 32 tokens");
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      const int4 v = *reinterpret_cast<const int4*>(words + i);
      any |= v.x | v.y | v.z | v.w;
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 2) {
      const int2 v = *reinterpret_cast<const int2*>(words + i);
      any |= v.x | v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) any |= words[i];
  }
  return any != 0;
}

// The cached length of dense sequence `seq`, clamped to what its block-table row can hold
// ([0, block_table_cols * P]); `bad` when it had to be.
template <class Cfg>
__device__ __forceinline__ int kv_length(const AttnccArgs& a, int seq, bool& bad) {
  const int n = __ldg(a.seqlens + seq);
  const int clamped = min(max(n, 0), a.block_table_cols * Cfg::kPageSize);
  bad = clamped != n;
  return clamped;
}

// A plan's config whose kernels read every cache tensor as contiguous: a token's bytes
// (kTokenStride) apart, pages kPageSize tokens apart. The launch picks these kernels when the
// call's strides say so (cache_is_contiguous), else the ones that take any strides: the common
// case keeps the one multiply per address of a compile-time stride.
template <class Cfg>
struct ContiguousCache : Cfg {
  static constexpr bool kContiguousCache = true;
};
template <class Cfg, class = void>
struct contiguous_cache {
  static constexpr bool value = false;
};
template <class Cfg>
struct contiguous_cache<Cfg, decltype(void(Cfg::kContiguousCache))> {
  static constexpr bool value = Cfg::kContiguousCache;
};

// Whether every cache tensor of the call is laid out as ContiguousCache's kernels read it.
template <class Cfg>
inline bool cache_is_contiguous(const AttnccArgs& a) {
  for (int i = 0; i < Cfg::kNumTensors; ++i)
    if (a.token_stride[i] != Cfg::kTokenStride[i] || a.page_stride[i] != Cfg::kTokenStride[i] * Cfg::kPageSize) return false;
  return true;
}

// Byte offset of token slot `slot` (>= 0) in cache tensor kTensor: page slot / P, token
// slot % P of that page, at the call's strides (or the contiguous ones, above).
template <class Cfg, int kTensor>
__device__ __forceinline__ long long token_offset(const AttnccArgs& a, int slot) {
  if constexpr (contiguous_cache<Cfg>::value) {
    constexpr long long kStride = Cfg::kTokenStride[kTensor];
    return slot * kStride;
  } else if constexpr (Cfg::kPageSize == 1) {
    return static_cast<long long>(slot) * a.page_stride[kTensor];
  } else {
    // 32 x 32 -> 64-bit products (IMAD.WIDE): the strides are < 2^31 (the host checks)
    const unsigned u = static_cast<unsigned>(slot);
    return static_cast<long long>(static_cast<int>(u / Cfg::kPageSize)) * a.page_stride[kTensor] +
           static_cast<long long>(static_cast<int>(u % Cfg::kPageSize)) * a.token_stride[kTensor];
  }
}

}  // namespace attncc
