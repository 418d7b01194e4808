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

namespace attncc {

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

}  // namespace attncc
