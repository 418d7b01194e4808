// attncc/core/work.cuh: what one CTA of any family works on, and the part walk.
//
// The rows of a CTA are query rows that read the same kv head j: row R packs (query token t,
// query head in the group hh) as R = t * group + hh (FlashMLA's packing; sparse: each query
// token is its own sequence and R = hh). A CTA takes tile_m consecutive rows of one kv head
// (its lane: row block x kv head), for one sequence and a range of its KV tiles. The range is
// one of num_splits equal splits of the sequence (split mode), or each piece in turn of a
// balanced part of all sequences' tiles (part mode, schedule.cuh: the CTA walks the sequences
// its part crosses). attncc/split.py is the host's side of the same arithmetic.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/paging.cuh"
#include "attncc/core/schedule.cuh"

namespace attncc {

// ------------------------------------------------------------------------------------------
// What a CTA works on: rows of one kv head, one sequence, a range of its KV tiles, and where
// the result goes. Lane (row block fastest, then kv head) and sequence (dense: b; sparse:
// b * s_q + t) come from the block index: split mode, block = lane + lanes (split + splits seq);
// part mode (schedule.cuh), block = lane + lanes part, and the part's walk names the pieces.
template <class Cfg>
struct CtaWork {
  int mb, head, seq, b, t_fixed, rows_total;
  int tile_begin, tile_end;  // the sequence's tiles this CTA reads (before the causal cut)
  int slot;                  // -1: write out and lse; else the partial slot (split or part slot)

  // CTAs that read the same KV tiles: row blocks x kv heads.
  __host__ __device__ __forceinline__ static int lanes(int s_q) {
    const int rows = Cfg::kSparse ? Cfg::kGroup : s_q * Cfg::kGroup;
    return ceil_div(rows, Cfg::kTileM) * Cfg::kHeadsKV;
  }
  __host__ __device__ __forceinline__ static int num_seqs(int batch, int s_q) { return Cfg::kSparse ? batch * s_q : batch; }
  __host__ __device__ __forceinline__ static int num_seqs(const AttnccArgs& a) { return num_seqs(a.batch, a.s_q); }
  // Query rows of one sequence, contiguous in [b, s_q, h_q]: dense s_q h_q, sparse h_q.
  __host__ __device__ __forceinline__ static int seq_rows(int s_q) { return Cfg::kSparse ? Cfg::kHeadsQ : s_q * Cfg::kHeadsQ; }
  // The cached length of a sequence as the kernels use it (dense: clamped, paging.cuh).
  __device__ __forceinline__ static int kv_len(const AttnccArgs& a, int seq, bool& bad) {
    bad = false;
    if constexpr (Cfg::kSparse) {
      return Cfg::kTopK;
    } else {
      return kv_length<Cfg>(a, seq, bad);
    }
  }
  // schedule.cuh whole_parts_fit's slack: the plan's kWholeSlackTiles where the launch is
  // compute-bound (its rows a sequence, s_q x group or a sparse query's group, reach the plan's
  // kWholeTightRows), else -1 (only the relative bound)
  __device__ __forceinline__ static int whole_slack_tiles(const AttnccArgs& a) {
    const int rows = Cfg::kSparse ? Cfg::kGroup : a.s_q * Cfg::kGroup;
    return rows >= Cfg::kWholeTightRows ? Cfg::kWholeSlackTiles : -1;
  }
  __device__ __forceinline__ static int seq_tiles(const AttnccArgs& a, int seq) {
    bool bad;
    return ceil_div(kv_len(a, seq, bad), Cfg::kTileN);
  }
  // Its length on part mode's line: its tiles and a piece's cost (schedule.cuh line_length).
  __device__ __forceinline__ static long long seq_line(const AttnccArgs& a, int seq) {
    return line_length(seq_tiles(a, seq), Cfg::kPieceCostTiles);
  }

  __device__ __forceinline__ static CtaWork make(const AttnccArgs& a, int lane, int seq) {
    CtaWork w;
    w.rows_total = Cfg::kSparse ? Cfg::kGroup : a.s_q * Cfg::kGroup;
    const int n_mblocks = ceil_div(w.rows_total, Cfg::kTileM);
    w.mb = lane % n_mblocks;
    w.head = lane / n_mblocks;
    w.seq = seq;
    w.b = Cfg::kSparse ? seq / a.s_q : seq;
    w.t_fixed = Cfg::kSparse ? seq % a.s_q : 0;
    return w;
  }
  // Split mode: split `split` of `num_splits` equal tile ranges of the sequence.
  __device__ __forceinline__ static CtaWork of_split(const AttnccArgs& a, int ctaid) {
    const int n_lanes = lanes(a.s_q);
    const int split = (ctaid / n_lanes) % a.num_splits;
    CtaWork w = make(a, ctaid % n_lanes, ctaid / n_lanes / a.num_splits);
    const int n_tiles = seq_tiles(a, w.seq);
    const int per_split = ceil_div(n_tiles, a.num_splits);
    w.tile_begin = split * per_split;
    w.tile_end = min(w.tile_begin + per_split, n_tiles);
    w.slot = a.num_splits == 1 ? -1 : split;
    return w;
  }
  // Part mode: one piece of the part's walk.
  __device__ __forceinline__ static CtaWork of_piece(const AttnccArgs& a, int lane, const Piece& pc) {
    CtaWork w = make(a, lane, pc.seq);
    w.tile_begin = pc.tile_begin;
    w.tile_end = pc.tile_end;
    w.slot = pc.slot;
    return w;
  }
  // Where the result of query token t, query head hq goes: slot < 0 (the CTA holds the whole
  // sequence's range) writes out [b, s_q, h_q, d_v] row out_row and lse [b, h_q, s_q] entry
  // lse_index; otherwise the partials' row partial_row (abi.h's workspace), for the combine.
  __device__ __forceinline__ long long out_row(int s_q, int t, int hq) const {
    return (static_cast<long long>(b) * s_q + t) * Cfg::kHeadsQ + hq;
  }
  __device__ __forceinline__ long long lse_index(int s_q, int t, int hq) const {
    return (static_cast<long long>(b) * Cfg::kHeadsQ + hq) * s_q + t;
  }
  // Row of the partial workspace: split mode [split, b, s_q, h_q], part mode [slot, s_q, h_q].
  __device__ __forceinline__ long long partial_row(const AttnccArgs& a, int t, int hq) const {
    const long long slot_row = a.num_parts > 0 ? slot : static_cast<long long>(slot) * a.batch + b;
    return (slot_row * a.s_q + t) * Cfg::kHeadsQ + hq;
  }
  // Query token and query head (within the group) of CTA row R.
  __device__ __forceinline__ int row_token(int R) const { return Cfg::kSparse ? t_fixed : R / Cfg::kGroup; }
  __device__ __forceinline__ int row_head(int R) const { return Cfg::kSparse ? R : R % Cfg::kGroup; }
  // ... its query head of all h_q, and its row of q's and out's [b, s_q, h_q, ...] (out_row).
  __device__ __forceinline__ int row_query_head(int R) const { return head * Cfg::kGroup + row_head(R); }
  __device__ __forceinline__ long long query_row(int s_q, int R) const { return out_row(s_q, row_token(R), row_query_head(R)); }
  // Query token t sees cache positions < token_limit (bottom-right aligned causal mask).
  __device__ __forceinline__ static int token_limit(int t, int kv_len, int s_q) {
    if constexpr (Cfg::kCausal) {
      return min(max(kv_len - s_q + t + 1, 0), kv_len);
    } else {
      return kv_len;
    }
  }
};

// The line lengths (schedule.cuh: tiles and a piece's cost) of all sequences and of the sequences
// before `seq`, summed by one warp: each lane sums a strided share (its loads independent of each
// other, so they are in flight together), then the warp's sums. Where sequence `seq` starts on
// the line of schedule.cuh.
struct TilePrefix {
  long long total, before;
};
template <class Cfg>
__device__ __forceinline__ TilePrefix tiles_before(const AttnccArgs& a, int seq, int lane) {
  using W = CtaWork<Cfg>;
  const int num_seqs = W::num_seqs(a);
  long long all = 0, before = 0;
  for (int s = lane; s < num_seqs; s += 32) {
    const long long n = W::seq_line(a, s);
    all += n;
    before += s < seq ? n : 0;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    all += __shfl_xor_sync(0xffffffffu, all, d);
    before += __shfl_xor_sync(0xffffffffu, before, d);
  }
  return {all, before};
}

// How a part-mode launch cuts the line of all tiles (schedule.cuh), by warp 0 of a CTA: the
// line's length (total: tiles_before's), whether the parts hold whole sequences, part `part`'s
// bounds [begin, end) and the first sequence of its walk. One scan over the sequences, 32 at a time:
// the starts of the sequences holding a cut (the gaps between them are the whole-sequence parts'
// lengths; only where the sequences are enough for whole parts, schedule.cuh), the ones
// holding part_begin(part) and part_begin(part + 1) (begin'), and both modes' first sequences
// (cut: the first with base >= begin or base + n > begin, schedule.cuh first_seq_sequential;
// whole: the first with base >= begin', the sequences of no tiles just before the one holding
// the cut included).
struct PartLine {
  long long total, begin, end;
  bool whole;
  int first_seq;
  long long first_base;
};
template <class Cfg>
__device__ PartLine part_line(const AttnccArgs& a, long long total, int part, int lane) {
  using W = CtaWork<Cfg>;
  const int num_seqs = W::num_seqs(a), parts = a.num_parts;
  const long long cut0 = part_begin(part, total, parts), cut1 = part_begin(part + 1, total, parts);
  const bool may_be_whole = Cfg::kWholeParts && whole_parts_possible(num_seqs, parts) && total > 0;  // the plan's whole_parts
  const LineCuts cuts = LineCuts::of(may_be_whole ? total : 1, parts);
  const unsigned lanes_below = (1u << lane) - 1u;
  long long base = 0, last = 0, longest = 0;  // last: the start of the last sequence holding a cut
  long long begin = total, end = total;       // begin'(part), begin'(part + 1)
  int run = 0;                                // the first sequence after the last one of some tiles
  int cut_seq = num_seqs, whole_seq = -1;
  long long cut_base = total;
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int n = s0 + lane < num_seqs ? static_cast<int>(W::seq_line(a, s0 + lane)) : 0;  // its line length
    int incl = n;  // inclusive prefix within these 32 sequences
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += x;
    }
    const long long b = base + incl - n, e = base + incl;
    if (may_be_whole) {
      const unsigned holds = __ballot_sync(0xffffffffu, n > 0 && cuts.held_by(b, e));
      // the gap from the previous sequence holding a cut (in these 32 or before them)
      const unsigned below = holds & lanes_below;
      const long long prev = __shfl_sync(0xffffffffu, b, below ? 31 - __clz(below) : lane);
      long long gap = (holds >> lane & 1u) ? b - (below ? prev : last) : 0;
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) {
        const long long other = __shfl_xor_sync(0xffffffffu, gap, d);
        gap = other > gap ? other : gap;
      }
      longest = gap > longest ? gap : longest;
      if (holds) last = __shfl_sync(0xffffffffu, b, 31 - __clz(holds));
      // the sequences holding this part's two cuts, and the first of the run of no-tile ones before the first
      const unsigned some = __ballot_sync(0xffffffffu, n > 0), some_below = some & lanes_below;
      const int run_here = some_below ? s0 + 32 - __clz(some_below) : run;
      const unsigned at0 = __ballot_sync(0xffffffffu, b <= cut0 && cut0 < e);
      const unsigned at1 = __ballot_sync(0xffffffffu, b <= cut1 && cut1 < e);
      if (at0) {
        begin = __shfl_sync(0xffffffffu, b, __ffs(at0) - 1);
        whole_seq = __shfl_sync(0xffffffffu, run_here, __ffs(at0) - 1);
      }
      if (at1) end = __shfl_sync(0xffffffffu, b, __ffs(at1) - 1);
      if (some) run = s0 + 32 - __clz(some);
    }
    const unsigned hit = __ballot_sync(0xffffffffu, s0 + lane < num_seqs && (b >= cut0 || e > cut0));
    if (hit && cut_seq == num_seqs) {
      cut_seq = s0 + __ffs(hit) - 1;
      cut_base = __shfl_sync(0xffffffffu, b, __ffs(hit) - 1);
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  longest = total - last > longest ? total - last : longest;
  PartLine line;
  line.total = total;
  line.whole = may_be_whole && whole_parts_fit(longest, total, parts, W::whole_slack_tiles(a));
  line.begin = line.whole ? begin : cut0;
  line.end = line.whole ? end : cut1;
  line.first_seq = line.whole ? whole_seq : cut_seq;  // whole: total > 0, so a sequence holds the cut
  line.first_base = line.whole ? begin : cut_base;
  return line;
}

// A decode step's schedule made once (k.plan(seqlens) on the device: core/plan.cuh), read by
// part-mode CTAs instead of cutting the line each: part p's PartLine, and the key of the tile
// counts and shape it was made for (abi.h: AttnccArgs.schedule, ATTNCC_SCHEDULE_LINE_BYTES a
// part). A CTA still sums the tiles, one strided load a lane as tiles_before, to check the key:
// a schedule of other lengths (they changed after the plan) or shapes is not used, the CTA
// cuts the line itself and flags ATTNCC_FLAG_SCHEDULE. The line depends on the tile counts only,
// so lengths that moved within their last tile keep the key.
struct ScheduleLine {
  long long total, begin, end, first_base;
  unsigned long long key;
  int first_seq, whole;
};
static_assert(sizeof(ScheduleLine) == ATTNCC_SCHEDULE_LINE_BYTES, "abi.h's line size");

// splitmix64's finalizer: a key term per (sequence, tiles), so that moved tiles change the sum.
__host__ __device__ __forceinline__ unsigned long long mix64(unsigned long long x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
struct TileKey {
  long long total;
  unsigned long long key;
};
// The line's length and the key of its tile counts, the sequences, the parts and the plan, by one warp.
template <class Cfg>
__device__ __forceinline__ TileKey tiles_key(const AttnccArgs& a, int lane) {
  using W = CtaWork<Cfg>;
  const int num_seqs = W::num_seqs(a);
  long long total = 0;
  unsigned long long key = 0;
  for (int s = lane; s < num_seqs; s += 32) {
    const int n = W::seq_tiles(a, s);
    total += line_length(n, Cfg::kPieceCostTiles);
    key += mix64(static_cast<unsigned long long>(s) << 32 | static_cast<unsigned>(n));
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    total += __shfl_xor_sync(0xffffffffu, total, d);
    key += __shfl_xor_sync(0xffffffffu, key, d);
  }
  key ^= mix64(static_cast<unsigned long long>(num_seqs) << 32 | static_cast<unsigned>(a.num_parts));
  return {total, key ^ mix64(Cfg::kScheduleKey)};  // and the plan's: another plan's kernels cut otherwise
}

// Part `part`'s line: from the step's schedule where it holds these tiles, else cut here.
template <class Cfg>
__device__ PartLine part_line_of(const AttnccArgs& a, int part, int lane) {
  ScheduleLine s{};
  if (a.schedule != nullptr) s = static_cast<const ScheduleLine*>(a.schedule)[part];  // in flight during the sum
  const TileKey k = tiles_key<Cfg>(a, lane);  // the line's length either way (one part_line inlined)
  if (a.schedule != nullptr) {
    if (s.key == k.key && s.total == k.total)
      return PartLine{s.total, s.begin, s.end, s.whole != 0, s.first_seq, s.first_base};
    if (lane == 0 && a.flags) atomicOr(a.flags, ATTNCC_FLAG_SCHEDULE);
  }
  return part_line<Cfg>(a, k.total, part, lane);
}

// The walk's steps with this plan's sequences: whether the current sequence is a piece of the
// part, its piece, the next sequence (schedule.cuh PartWalk, with the plan's piece cost).
template <class Cfg>
__device__ __forceinline__ bool walk_has_piece(const AttnccArgs& a, const PartWalk& w) {
  return w.seq < w.num_seqs && w.has_piece(CtaWork<Cfg>::seq_tiles(a, w.seq), Cfg::kPieceCostTiles);
}
template <class Cfg>
__device__ __forceinline__ Piece walk_piece(const AttnccArgs& a, const PartWalk& w) {
  return w.piece(CtaWork<Cfg>::seq_tiles(a, w.seq), Cfg::kPieceCostTiles);
}
template <class Cfg>
__device__ __forceinline__ void walk_next(const AttnccArgs& a, PartWalk& w) {
  w.next(CtaWork<Cfg>::seq_tiles(a, w.seq), Cfg::kPieceCostTiles);
}

// The start of part `part`'s walk, by warp 0 of the CTA; whole: whether the parts hold whole
// sequences (for the combine: core/ready.cuh publish_whole_parts).
template <class Cfg>
__device__ PartWalk start_part_walk(const AttnccArgs& a, int part, int lane, bool& whole) {
  const PartLine line = part_line_of<Cfg>(a, part, lane);
  whole = line.whole;
  return PartWalk::start(part, a.num_parts, CtaWork<Cfg>::num_seqs(a), line.total, line.begin, line.end, line.first_seq,
                         line.first_base);
}


// Values through shared memory, field by field (no address of a local is taken, so nothing goes
// to the stack). Read back with volatile loads, so that they need not stay in registers
// through the main loop.
template <class... Ints>
__device__ __forceinline__ void stash_ints(unsigned char* dst, Ints... v) {
  int i = 0;
  ((reinterpret_cast<volatile int*>(dst)[i++] = v), ...);
}
__device__ __forceinline__ int unstash_int(const unsigned char* src, int i) {
  return reinterpret_cast<const volatile int*>(src)[i];
}
template <class Cfg>
__device__ __forceinline__ void stash(unsigned char* dst, const CtaWork<Cfg>& w) {
  stash_ints(dst, w.mb, w.head, w.seq, w.b, w.t_fixed, w.rows_total, w.tile_begin, w.tile_end, w.slot);
}
template <class Cfg>
__device__ __forceinline__ CtaWork<Cfg> unstash_work(const unsigned char* src) {
  CtaWork<Cfg> w;
  w.mb = unstash_int(src, 0), w.head = unstash_int(src, 1), w.seq = unstash_int(src, 2);
  w.b = unstash_int(src, 3), w.t_fixed = unstash_int(src, 4), w.rows_total = unstash_int(src, 5);
  w.tile_begin = unstash_int(src, 6), w.tile_end = unstash_int(src, 7), w.slot = unstash_int(src, 8);
  return w;
}
// The part walk: 64-bit positions as two words each.
__device__ __forceinline__ void stash(unsigned char* dst, const PartWalk& p) {
  auto lo = [](long long x) { return static_cast<int>(x & 0xffffffffLL); };
  auto hi = [](long long x) { return static_cast<int>(x >> 32); };
  stash_ints(dst, p.part, p.parts, p.num_seqs, p.seq, lo(p.total), hi(p.total), lo(p.begin), hi(p.begin),
             lo(p.end), hi(p.end), lo(p.base), hi(p.base));
}
__device__ __forceinline__ PartWalk unstash_walk(const unsigned char* src) {
  auto pair = [&](int i) {
    return static_cast<long long>(static_cast<unsigned>(unstash_int(src, i))) | (static_cast<long long>(unstash_int(src, i + 1)) << 32);
  };
  PartWalk p;
  p.part = unstash_int(src, 0), p.parts = unstash_int(src, 1), p.num_seqs = unstash_int(src, 2), p.seq = unstash_int(src, 3);
  p.total = pair(4), p.begin = pair(6), p.end = pair(8), p.base = pair(10);
  return p;
}

}  // namespace attncc
