// attncc/core/schedule.cuh: the balanced split-KV schedule ("parts"), as plain integer arithmetic
// shared by the decode kernel, the combine kernel and a host-side test.
//
// Split mode gives every sequence the same number of splits: with more CTAs than the SMs hold,
// the last wave runs partly empty, and a long sequence among short ones leaves a long tail.
// Balanced mode (FlashMLA's tile scheduler) lays the KV tiles of all sequences end to end,
//     sequence s owns tiles [base(s), base(s) + n(s)) of T = sum n(s),   base(s) = sum_{r<s} n(r)
// and cuts that line into P equal parts, part p = [begin(p), begin(p + 1)), begin(p) = p T / P.
// The CTAs of one part (one per lane: row block x kv head, which read the same KV tiles at
// about the same time and so share them in L2) walk the sequences the part crosses; each
// sequence's stretch inside the part is a piece. A sequence inside one part is written directly;
// the pieces of a sequence that crosses parts leave partials (combine.cuh merges them). Only a
// part's first and last pieces can be partial, so 2 P partial slots serve any batch:
//     slot = 2 p      the piece starts at begin(p) (it continues a sequence, or begins one there)
//     slot = 2 p + 1  the piece starts later (it runs to the part's end)
// A sequence of no tiles is a piece of the part where its base falls (the last part when its
// base is T), written directly: out = 0, lse = -inf.
//
// Whole-sequence parts: where the sequences are even enough, each cut moves back to the start of
// the sequence it falls in,
//     begin'(p) = base(s) for the sequence s with base(s) <= begin(p) < base(s) + n(s),
// so that no sequence crosses parts: no partials, nothing for the combine to merge. Taken where
// the longest part so cut is at most (1 + 1 / kWholeSlack) T / P: equal sequences, b = 128 on 66
// parts, cut into parts of one and two sequences (2 / 1.94 = 1.03), where cutting them costs more
// (the partials and their merge: unsplit took 0.92 of the cut parts' time, bench/RESULTS.md,
// session 40). Where the launch is compute-bound (its rows a sequence reach the plan's
// kWholeTightRows, the chip's ridge: work.cuh whole_slack_tiles), the longest part is also at most
// kWholeSlackTiles over T / P: there each extra tile costs its time, where at or under the ridge
// the SMs that whole parts leave idle give their share of HBM to the rest (MLA b = 128 s_k 32768:
// s_q 1, 31 tiles over, whole 0.981 of cut; s_q 2, 62 over, 1.016; bench/RESULTS.md, session 42).
// The decode kernels decide it from the lengths (work.cuh part_line); the combine learns it from
// the arguments (sparse: equal_whole_parts) or a word they write (core/ready.cuh).
//
// A piece costs more than its tiles: Q's load, the pipeline's fill and drain, the epilogue's
// stores (~9.6 us at MLA b = 8, where the parts that hold two pieces end that much after the rest,
// bench/RESULTS.md session 43). So the line charges each sequence of some tiles a piece's cost
// c (the plan's kPieceCostTiles, in tiles) before its tiles: it spans
//     [base(s), base(s) + c + n(s)),  its tiles at [base(s) + c, base(s) + c + n(s)),
// T = sum (c + n(s)) over the sequences of some tiles (line_length), and a part that holds a
// sequence's start holds c fewer of its tiles (FlashMLA's metadata charges 5 blocks a request).
// A part whose stretch of a sequence is cost only has no piece of it. Every position below
// (begin(p), base(s), the parts' bounds) is on this line; pieces are in the sequence's tiles.
#pragma once

namespace attncc {

// A sequence's length on the line: its n tiles and, where it has some, a piece's cost.
__host__ __device__ __forceinline__ long long line_length(int n, int piece_cost) { return n > 0 ? n + piece_cost : 0; }
// The cost before its first tile.
__host__ __device__ __forceinline__ int line_lead(int n, int piece_cost) { return n > 0 ? piece_cost : 0; }

// First tile of part p of `parts` over `total` tiles.
__host__ __device__ __forceinline__ long long part_begin(int p, long long total, int parts) {
  return p * total / parts;
}

// Whole-sequence parts where the longest is at most 1 + 1 / kWholeSlack times the even length
// and, with slack_tiles >= 0 (a compute-bound launch), at most slack_tiles tiles over it (a line
// of no tiles is cut: either way its sequences are the last part's). Never with fewer than
// kWholeSlack / (kWholeSlack + 1) P sequences: some part holds T / num_seqs or more.
constexpr int kWholeSlack = 16;
__host__ __device__ __forceinline__ bool whole_parts_fit(long long longest, long long total, int parts, int slack_tiles) {
  return total > 0 && longest * parts * kWholeSlack <= total * (kWholeSlack + 1) &&
         (slack_tiles < 0 || longest * parts <= total + 1LL * slack_tiles * parts);
}
__host__ __device__ __forceinline__ bool whole_parts_possible(int num_seqs, int parts) {
  return 1LL * num_seqs * (kWholeSlack + 1) >= 1LL * parts * kWholeSlack;
}

// The cuts begin(p) of a line of total > 0 tiles without a 64-bit division each (the scans ask
// for one per sequence): begin(p) = p per_part + p rest / P (p rest < P^2: 32 bits).
struct LineCuts {
  long long per_part;
  int parts, rest;
  float parts_per_tile;

  __host__ __device__ static LineCuts of(long long total, int parts) {
    LineCuts c;
    c.per_part = total / parts;
    c.rest = static_cast<int>(total % parts);
    c.parts = parts;
    c.parts_per_tile = static_cast<float>(parts) / static_cast<float>(total);
    return c;
  }
  __host__ __device__ long long begin(int p) const { return p * per_part + p * rest / parts; }
  // The first p with begin(p) >= b (0 <= b <= T; P where none): b P / T in float, within one
  // of it, then exact.
  __host__ __device__ int first_at(long long b) const {
    const int guess = static_cast<int>(static_cast<float>(b) * parts_per_tile);
    int p = guess < parts ? guess : parts;
    while (p > 0 && begin(p - 1) >= b) --p;
    while (p < parts && begin(p) < b) ++p;
    return p;
  }
  // Whether a sequence of tiles [b, e) (e > b) holds a cut: some begin(p) of parts p < P in it.
  __host__ __device__ bool held_by(long long b, long long e) const {
    const int p = first_at(b);
    return p < parts && begin(p) < e;
  }
};

// Whether S sequences of line length n each (sparse queries: top-k's tiles and a piece's cost) take
// whole-sequence parts (slack_tiles: whole_parts_fit's): the sequence holding cut p is floor(p S / P),
// so the parts hold floor((p + 1) S / P) - floor(p S / P) sequences, at most ceil(S / P).
__host__ __device__ __forceinline__ bool equal_whole_parts(int num_seqs, int n, int parts, int slack_tiles) {
  const long long most = (num_seqs + parts - 1) / parts;
  return whole_parts_possible(num_seqs, parts) && whole_parts_fit(most * n, 1LL * num_seqs * n, parts, slack_tiles);
}

// The part holding tile x (0 <= x < total): the last p with part_begin(p) <= x, so empty parts
// (part_begin(p) == part_begin(p + 1)) are never chosen.
__host__ __device__ __forceinline__ int part_of(long long x, long long total, int parts) {
  return static_cast<int>(((x + 1) * parts - 1) / total);
}

// One sequence's stretch inside one part, in the sequence's own tiles [tile_begin, tile_end).
struct Piece {
  int seq, tile_begin, tile_end;
  int slot;  // partial slot, or -1: the whole sequence (write out and lse)
};

// The pieces of part p, in order. The first sequence of the part and its base come from a scan
// of the line lengths (work.cuh does it with a warp; first_seq_sequential below is the
// reference); then has_piece, piece and next take the tile count n of the current sequence and
// the plan's piece cost c.
struct PartWalk {
  int part, parts, num_seqs;
  long long total, begin, end;  // the part's tiles [begin, end)
  int seq;                      // the current sequence
  long long base;               // its first tile on the line

  // begin, end: the part's bounds (part_begin, or whole-sequence parts' begin')
  __host__ __device__ static PartWalk start(int p, int P, int num_seqs, long long total, long long begin, long long end,
                                            int first_seq, long long first_base) {
    PartWalk w;
    w.part = p;
    w.parts = P;
    w.num_seqs = num_seqs;
    w.total = total;
    w.begin = begin;
    w.end = end;
    w.seq = first_seq;
    w.base = first_base;
    return w;
  }
  // Whether sequence `seq` (of n tiles) is a piece of this part: its tiles start before the
  // part's end. An empty part (begin == end) has none, except the last, which takes the
  // sequences of no tiles at the end of the line.
  __host__ __device__ bool has_piece(int n, int cost) const {
    if (seq >= num_seqs) return false;
    if (part == parts - 1) return true;
    return begin < end && base + line_lead(n, cost) < end;
  }
  // The current sequence's piece (n: its tile count).
  __host__ __device__ Piece piece(int n, int cost) const {
    const long long first = base + line_lead(n, cost);  // its first tile on the line
    const long long lo = first > begin ? first : begin;
    const long long hi = first + n < end ? first + n : end;
    Piece pc;
    pc.seq = seq;
    pc.tile_begin = static_cast<int>(lo - first);
    pc.tile_end = static_cast<int>(hi > lo ? hi - first : lo - first);
    const bool whole = first >= begin && first + n <= end;
    pc.slot = whole ? -1 : (lo == begin ? 2 * part : 2 * part + 1);
    return pc;
  }
  __host__ __device__ void next(int n, int cost) {
    base += line_length(n, cost);
    ++seq;
  }
};

// The first sequence with a piece in a part starting at tile `begin`: the first s with
// base(s) >= begin (it starts in the part) or base(s + 1) > begin (it crosses begin). Sets
// *first_base = base(s); returns num_seqs when there is none.
template <class Tiles>
__host__ __device__ int first_seq_sequential(const Tiles& tiles, int num_seqs, long long begin, long long* first_base) {
  long long base = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const long long next = base + tiles(s);
    if (base >= begin || next > begin) {
      *first_base = base;
      return s;
    }
    base = next;
  }
  *first_base = base;
  return num_seqs;
}

// Whole-sequence parts, sequentially (the reference of work.cuh's part_line): whether the launch
// takes them (slack_tiles: whole_parts_fit's), and begin'(p) (p = P: T).
template <class Tiles>
__host__ __device__ bool whole_parts_sequential(const Tiles& tiles, int num_seqs, long long total, int parts, int slack_tiles) {
  if (total == 0) return false;
  const LineCuts cuts = LineCuts::of(total, parts);
  long long base = 0, last = 0, longest = 0;  // last: the start of the last sequence holding a cut
  for (int s = 0; s < num_seqs; ++s) {
    const long long n = tiles(s);
    if (n > 0 && cuts.held_by(base, base + n)) {
      longest = base - last > longest ? base - last : longest;
      last = base;
    }
    base += n;
  }
  longest = total - last > longest ? total - last : longest;
  return whole_parts_fit(longest, total, parts, slack_tiles);
}
template <class Tiles>
__host__ __device__ long long whole_begin_sequential(const Tiles& tiles, int num_seqs, long long total, int parts, int p) {
  if (p >= parts) return total;
  const long long cut = part_begin(p, total, parts);
  long long base = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const long long n = tiles(s);
    if (base <= cut && cut < base + n) return base;
    base += n;
  }
  return total;  // no tiles at all
}

// The pieces of one sequence as the combine sees them: parts first..last (those of its first and
// last tiles), skipping empty ones. Valid for a sequence with n > 0 tiles that crosses parts
// (first < last). base: where the sequence starts on the line; cost: a piece's (its tiles start
// after it).
struct SeqPieces {
  long long base, total;  // base: the sequence's first tile on the line
  int n, parts, first, last;
  LineCuts cuts;  // part_begin without a 64-bit division

  __host__ __device__ static SeqPieces of(long long start, int n, long long total, int parts, int cost) {
    SeqPieces s;
    s.base = start + line_lead(n, cost);
    s.n = n;
    s.total = total;
    s.parts = parts;
    s.first = n > 0 ? part_of(s.base, total, parts) : -1;
    s.last = n > 0 ? part_of(s.base + n - 1, total, parts) : -1;
    s.cuts = LineCuts::of(total, parts);
    return s;
  }
  __host__ __device__ bool whole() const { return first == last; }  // written directly (or n == 0)
  __host__ __device__ long long begin(int p) const { return cuts.begin(p); }
  // The partial slot of the piece in part p (first <= p <= last), or -1 when part p is empty.
  __host__ __device__ int slot(int p) const {
    const long long b = begin(p);
    if (b == begin(p + 1)) return -1;
    const long long lo = base > b ? base : b;
    return lo == b ? 2 * p : 2 * p + 1;
  }
};

}  // namespace attncc
