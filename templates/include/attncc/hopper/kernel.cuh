// attncc/hopper/kernel.cuh: the Hopper family's split-KV decode kernels (sm_90a).
//
// A CTA of three warp groups takes tile_m rows of one kv head (core/work.cuh: CtaWork; seesaw
// 64, stacked 128) for one range of one sequence's KV tiles (split mode) or each piece in turn
// of a balanced part (part mode, core/schedule.cuh):
//   warp group 2, the producer (produce.cuh; setmaxnreg down to kProducerRegisters): each tile
//     into its stage box by box, by TMA (a page-64 tile inside the view) or cp.async;
//   warp groups 0 and 1, the consumers (setmaxnreg up; relay: WG0 up, WG1 down, each its own
//     copy of the code, as_consumers): Q into shared memory (producer_q: a later piece's by the
//     producer, produce_q), then the plan's schedule over the tiles and the epilogue: the seesaw
//     (seesaw.cuh), the relay (relay.cuh) or stacked (stacked.cuh).
// The roles walk the same pieces independently, the producer up to kStages tiles ahead; their
// only contact is the barriers of the stages (FULL per box, FLAGS, EMPTY early/late), whose
// phases both count per stage across pieces (traits.cuh: Progress).
//
// A stage's release, per tile. Seesaw (and relay): its early boxes (the value's left half) when
// WG0 has read them last, the rest when both groups have; a pair's stage a in its middle, stage b at
// its end; the producer copies in that order: per pair, stage a early and late, then stage b.
// Stacked: the whole stage (one early group) when both groups (or the tile's one) are past its
// O += P V; the producer fills stage k % kStages with tile k of its stream.
//
// crossover (kCrossover): the CTAs run in clusters of two, row blocks 2i and 2i + 1 of a kv head
// (consecutive blocks: the lane's fastest index), both walking the same pieces; their producers
// share the dequantized tiles (produce.cuh), and the cluster meets after the barriers' inits and
// before it exits.
//
// Runtime conditions as the mma_sync family's (host-checked in launch.cuh); registers: 168 a
// thread at launch (384 threads, 1 CTA an SM), then kConsumerRegisters (relay: WG0's, WG1
// kWg1Registers) / kProducerRegisters.
#pragma once

#include <type_traits>

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/core/paging.cuh"
#include "attncc/core/ptx.cuh"
#include "attncc/core/ready.cuh"
#include "attncc/core/work.cuh"
#include "attncc/hopper/barrier.cuh"
#include "attncc/hopper/cluster.cuh"
#include "attncc/hopper/produce.cuh"
#include "attncc/hopper/relay.cuh"
#include "attncc/hopper/seesaw.cuh"
#include "attncc/hopper/stacked.cuh"
#include "attncc/hopper/traits.cuh"

namespace attncc {
namespace hopper {

// The warp group of this thread, as a value the compiler knows is the same across the warp
// (wgmma under a branch it cannot prove warp-uniform is serialized: ptxas C7520).
__device__ __forceinline__ int warp_group() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kGroupThreads, 0); }

// A consumer warp group's index (as_consumers): a constant (the relay's copies of the code), or
// asked of the thread where it is used (warp_group(): the one copy both groups run).
struct AskedGroup {};
__device__ __forceinline__ int group_index(AskedGroup) { return warp_group(); }
template <int kWg>
__device__ __forceinline__ constexpr int group_index(std::integral_constant<int, kWg>) { return kWg; }

// CTA row R's query row in q ([b, s_q, h_q, d_k], 16-bit), as a byte offset.
template <class Cfg>
__device__ __forceinline__ long long q_row_bytes(const AttnccArgs& a, const CtaWork<Cfg>& w, int R) {
  return w.query_row(a.s_q, R) * Cfg::kDK * 2;
}

// The piece's Q rows -> the boxes of the Q tile (zero past the CTA's rows), 16-byte chunk i of
// the tile by thread i (mod threads) of `threads`, by cp.async.
template <class Cfg>
__device__ __forceinline__ void copy_q(const AttnccArgs& a, const CtaWork<Cfg>& w, uint32_t sbase, int i0, int threads) {
  const char* q_any = static_cast<const char*>(a.q);
  constexpr int kChunks = Cfg::kKeyBoxes * 8;  // 16-byte chunks of a Q row
  for (int i = i0; i < Cfg::kTileM * kChunks; i += threads) {
    const int r = i / kChunks, ch = i % kChunks;
    const int R = w.mb * Cfg::kTileM + r;
    const char* src = R < w.rows_total ? q_any + q_row_bytes<Cfg>(a, w, R) + ch * 16 : q_any;
    cp_async_16(sbase + Cfg::kQOff + (ch / 8) * Cfg::kQBoxBytes + sw128(r, ch % 8), src, R < w.rows_total);
  }
}

// q_tma (the plan's kQTma): the piece's Q tile by TMA, a copy a 64-column box of the CTA's rows
// (tma.cuh: q's map, a box of kQTmaHeads heads of the group x kQTmaTokens query tokens, rows past
// s_q or the group zero-filled), issued by one thread and counted on Q_FULL (one arrival with
// the tile's bytes), instead of 4,608 cp.async of 16 bytes a 64-row MLA tile: at the CTA's start
// those queued the producer's loads of the piece's length and page numbers behind them (H100
// clock trace, bench/RESULTS.md session 54), and at a part's transition the producer's next
// copies behind its own Q copies. Q_FULL then completes once a piece, whoever issues it (the
// consumers' first thread, or with producer_q the producer's for pieces n >= 1).
// (Measured, session 56: ~1 % slower where the cache tiles go by TMA, ~1 % faster at MLA b = 1, page 1
// and sparse fp8; the lowering leaves it off, hopper.py.)
template <class Cfg>
__device__ __forceinline__ void tma_q(const MapsOf<Cfg>& maps, const CtaWork<Cfg>& w, uint32_t sbase) {
  static_assert(Cfg::kQTma, "q_tma: the plan's maps hold q's");
  const int row0 = w.mb * Cfg::kTileM;  // the CTA's first row: (query token, head of the group)
  const uint32_t full = HopperTraits<Cfg>::q_full(sbase);
  mbarrier_arrive_expect_tx(full, Cfg::kKeyBoxes * Cfg::kQBoxBytes);
#pragma unroll 1
  for (int box = 0; box < Cfg::kKeyBoxes; ++box)
    tma_load_5d(sbase + Cfg::kQOff + box * Cfg::kQBoxBytes, &maps.q, box * kBoxCols, w.row_head(row0), w.head, w.row_token(row0), w.b, full);
}

// producer_q (the plan's kProducerQ): a CTA's later pieces' Q rows by the producer. The consumers
// copy their first piece's Q themselves (at the CTA's start the producer's own start, its
// setmaxnreg and first slots, would stand before it: b = 1 1.065 of the time when the producer
// copied it too, H100, bench/RESULTS.md session 47). For piece n >= 1 the producer copies the rows
// once both consumer groups are past piece n - 1's last S = Q K^T (Q_EMPTY, each group's arrival
// right after its own last S, seesaw.cuh), its copies counted on Q_FULL as they land (the
// consumers wait on it at the piece's start): Q lands under the piece before's last products and
// epilogue instead of after them (the consumers' own Q load at a transition waited ~6.9 K cycles,
// H100 clock trace, session 53). produce() calls it before the piece's first pair where the plan
// has one set of stages (those copies wait for the stages of the piece before's last pair, which
// are released after its last S), after that pair's copies with two sets (the producer may be a
// pair ahead); either order waits only for what the piece before releases, so it cannot deadlock.
// Phases: Q_FULL completes once a piece n >= 1 (completion n - 1; q_tma: once every piece, n),
// Q_EMPTY once a piece.
template <class Cfg>
__device__ __forceinline__ void produce_q(const AttnccArgs& a, const MapsOf<Cfg>& maps, const CtaWork<Cfg>& w, uint32_t sbase, int p,
                                          int piece) {
  using T = HopperTraits<Cfg>;
  mbarrier_wait(T::q_empty(sbase), (piece - 1) & 1);  // the consumers past piece - 1's last S
  if constexpr (Cfg::kQTma) {
    if (p == 0) tma_q<Cfg>(maps, w, sbase);
  } else {
    copy_q<Cfg>(a, w, sbase, p, kGroupThreads);
    cp_async_arrive(T::q_full(sbase));
  }
}

// The KV tiles a CTA reads of its range: the causal cut by its last row.
template <class Cfg>
struct PieceTiles {
  int kv_len, cta_limit, n_iter;
  __device__ __forceinline__ PieceTiles(const AttnccArgs& a, const CtaWork<Cfg>& w, bool& bad_len) {
    kv_len = CtaWork<Cfg>::kv_len(a, w.b, bad_len);
    const int last_row = min(w.rows_total, (w.mb + 1) * Cfg::kTileM) - 1;
    cta_limit = w.token_limit(w.row_token(last_row), kv_len, a.s_q);
    const int tile_end = min(w.tile_end, ceil_div(cta_limit, Cfg::kTileN));
    n_iter = max(tile_end - w.tile_begin, 0);
  }
};

// The raw slots of a cp.async plan's tiles a tile ahead (the plan's kSlotsAhead): the producer's
// stream of tiles is consecutive within a piece, so while it fills tile t the loads of tile
// t + 1's page numbers or indices are in flight (they were a round trip before each tile's
// copies: ~1,100 cycles a tile of the sparse fp8 example's ~7,000, bench/RESULTS.md session
// 21). Past the CTA's limit a slot is not loaded (paging.cuh: kPastEnd); below it, the slots of
// the tile after the piece's last are loaded and not used.
template <class Cfg>
struct SlotsAhead {
  static constexpr bool kOn = Cfg::kSlotsAhead;
  static_assert(!kOn || Cfg::kTmaRows == 0, "slots ahead: every tile by cp.async");
  int raw[kOn ? TileTokens<Cfg>::kTok : 1];
  __device__ __forceinline__ void start(const SlotSource& ss, int tile, int p) {
    if constexpr (kOn) TileTokens<Cfg>::fetch_raw(ss, tile, p, raw);
  }
  // Tile `tile`'s slots into tt (its raw slots held since the last call), the next tile's fetched.
  __device__ __forceinline__ void take(TileTokens<Cfg>& tt, const AttnccArgs& a, const SlotSource& ss, int tile, int p, int head,
                                       uint32_t sbase) {
    if constexpr (kOn) {
      int next[TileTokens<Cfg>::kTok];
      TileTokens<Cfg>::fetch_raw(ss, tile + 1, p, next);
      tt.resolve(a, raw, tile, p, head, sbase);
#pragma unroll
      for (int k = 0; k < TileTokens<Cfg>::kTok; ++k) raw[k] = next[k];
    } else {
      tt.load(a, ss, tile, p, head, sbase);
    }
  }
};

// A tile's copies into stage `stage`: by TMA when the plan and the tile allow it (tm, its page
// read ahead: tma_tile below), else by cp.async (its slots from `ahead`); trace_slot: its place
// in the CTA's stream.
template <class Cfg>
__device__ __forceinline__ void produce_tile(const AttnccArgs& a, const MapsOf<Cfg>& maps, const SlotSource& ss, int tile,
                                             const TmaTile<Cfg>& tm, int head, uint32_t sbase, unsigned char* smem, int stage, int p,
                                             int parity, int trace_slot, SlotsAhead<Cfg>& ahead) {
  if constexpr (Cfg::kTmaRows > 0) {
    if (tm.whole()) return fill_stage<Cfg>(tm, maps, sbase, smem, stage, head, p, parity, trace_slot);
  }
  TileTokens<Cfg> tt;
  ahead.take(tt, a, ss, tile, p, head, sbase);
  fill_stage<Cfg>(tt, a, sbase, smem, stage, head, p, parity, trace_slot);
}

// Tile `tile` as a TMA tile, its page number read (whole: false where the plan has no TMA, or
// there is no such tile).
template <class Cfg>
__device__ __forceinline__ TmaTile<Cfg> tma_tile(const AttnccArgs& a, const SlotSource& ss, int tile, bool exists) {
  TmaTile<Cfg> tm;
  tm.set_none();
  if constexpr (Cfg::kTmaRows > 0) {
    if (exists) tm.load(a, ss, tile);
  }
  return tm;
}

// The producer's part of a piece, in the order the consumers release the stages. Seesaw: its
// tiles in pairs, each pair's a then b (seesaw.cuh: a's stage is free after the pair's first
// products), up to kSets pairs ahead of the consumers. Stacked: tile k of the stream into stage
// k % kStages, up to kStages tiles ahead. The page numbers of TMA tiles are read a step ahead (a
// pair, or a tile), so that their load is in flight while the producer waits for the stage.
template <class Cfg>
__device__ __forceinline__ void produce(const AttnccArgs& a, const MapsOf<Cfg>& maps, const CtaWork<Cfg>& w, uint32_t sbase,
                                        unsigned char* smem, int p, Progress<Cfg::kStages>& pr) {
  using T = HopperTraits<Cfg>;
  static_assert(!Cfg::kProducerQ || T::kSeesaw, "producer_q: the seesaw's producer");
  // producer_q: a later piece's Q before its first pair (one set of stages) or after it (two)
  const bool q_later = Cfg::kProducerQ && pr.pieces > 0, q_before = q_later && T::kSets == 1, q_after = q_later && !q_before;
  if (q_before) produce_q<Cfg>(a, maps, w, sbase, p, pr.pieces);
  bool bad;
  const PieceTiles<Cfg> pt(a, w, bad);
  // trace (the CTA's first piece): the piece's length read (the condition waits for it: opaque,
  // so that the compiler cannot fold a comparison it knows the outcome of)
  ATTNCC_TRACE(p == 0 && pr.pieces == 0 && opaque(pt.kv_len) >= 0, kTraceStart, 0, 5);
  SlotSource ss;
  ss.row = slot_row<Cfg>(a, w.seq, w.b);
  ss.limit = pt.cta_limit;
  SlotsAhead<Cfg> ahead;
  ahead.start(ss, w.tile_begin, p);
  if constexpr (T::kSeesaw) {
    TmaTile<Cfg> ta = tma_tile<Cfg>(a, ss, w.tile_begin, pt.n_iter > 0), tb = tma_tile<Cfg>(a, ss, w.tile_begin + 1, pt.n_iter > 1);
    for (int it = 0; it < pt.n_iter; it += 2, ++pr.pairs) {
      const bool has_b = it + 1 < pt.n_iter;
      const int sa = 2 * (pr.pairs % T::kSets), sb = sa + 1;
      const TmaTile<Cfg> na = tma_tile<Cfg>(a, ss, w.tile_begin + it + 2, it + 2 < pt.n_iter),
                         nb = tma_tile<Cfg>(a, ss, w.tile_begin + it + 3, it + 3 < pt.n_iter);
      // trace: the CTA's first tile's page numbers read (TMA plans: its `whole` waits for them),
      // the next pair's loads issued before
      ATTNCC_TRACE(p == 0 && pr.pieces == 0 && it == 0 && opaque(ta.token) != -2, kTraceStart, 0, 6);
      produce_tile<Cfg>(a, maps, ss, w.tile_begin + it, ta, w.head, sbase, smem, sa, p, pr.parity(sa) ^ 1, 2 * pr.pairs, ahead);
      if (has_b) produce_tile<Cfg>(a, maps, ss, w.tile_begin + it + 1, tb, w.head, sbase, smem, sb, p, pr.parity(sb) ^ 1, 2 * pr.pairs + 1, ahead);
      if (q_after && it == 0) produce_q<Cfg>(a, maps, w, sbase, p, pr.pieces);  // two sets: after the first pair
      pr.used(sa);
      if (has_b) pr.used(sb);
      ta = na, tb = nb;
    }
    if (q_after && pt.n_iter == 0) produce_q<Cfg>(a, maps, w, sbase, p, pr.pieces);  // a piece of no tile
  } else {
    TmaTile<Cfg> next = tma_tile<Cfg>(a, ss, w.tile_begin, pt.n_iter > 0);
    for (int it = 0; it < pt.n_iter; ++it, pr.next_tile()) {
      const int st = pr.stage;
      const TmaTile<Cfg> tm = next;
      next = tma_tile<Cfg>(a, ss, w.tile_begin + it + 1, it + 1 < pt.n_iter);
      ATTNCC_TRACE(p == 0 && pr.pieces == 0 && it == 0 && opaque(tm.token) != -2, kTraceStart, 0, 6);  // (as the seesaw's)
      produce_tile<Cfg>(a, maps, ss, w.tile_begin + it, tm, w.head, sbase, smem, st, p, pr.parity(st) ^ 1, pr.tiles, ahead);
      pr.used(st);
    }
  }
  ++pr.pieces;
}

// The consumers' Q tile of piece `piece` (the CTA's count), landed in shared memory for this
// thread (the caller fences and meets the other consumers): by TMA (q_tma: the consumers' first
// thread issues it, or the producer for a later piece with producer_q), from the producer's
// copies (producer_q, a later piece), or copied here by cp.async.
template <class Cfg>
__device__ __forceinline__ void take_q(const AttnccArgs& a, const MapsOf<Cfg>& maps, const CtaWork<Cfg>& w, uint32_t sbase, int ct,
                                       int piece) {
  if constexpr (Cfg::kQTma) {
    if (!Cfg::kProducerQ || piece == 0) {  // else the producer's (produce_q)
      if (piece > 0) {  // every consumer past the piece before's reads of the Q region, before the copies overwrite it
        fence_async_shared();
        bar_sync(Cfg::kConsumerBarrier, 2 * kGroupThreads);
      }
      if (ct == 0) tma_q<Cfg>(maps, w, sbase);
    }
    mbarrier_wait(HopperTraits<Cfg>::q_full(sbase), piece & 1);  // Q_FULL: once a piece
  } else if (Cfg::kProducerQ && piece > 0) {
    mbarrier_wait(HopperTraits<Cfg>::q_full(sbase), (piece - 1) & 1);  // the producer's copies (produce_q)
  } else {
    copy_q<Cfg>(a, w, sbase, ct, 2 * kGroupThreads);
    cp_async_commit();
    cp_async_wait<0>();
  }
}

// The consumers' part of a piece: Q, then the seesaw (seesaw.cuh), the relay (relay.cuh) or the
// stacked schedule (stacked.cuh); wg: the warp group (a constant in the relay's copies).
template <class Cfg, class Wg>
__device__ __forceinline__ void consume_piece(const AttnccArgs& a, const MapsOf<Cfg>& maps, const CtaWork<Cfg>& w, uint32_t sbase,
                                              unsigned char* smem, int ct, Progress<Cfg::kStages>& pr, Wg wg) {
  bool bad_len;
  const PieceTiles<Cfg> pt(a, w, bad_len);
  if (bad_len && ct == 0 && a.flags) atomicOr(a.flags, ATTNCC_FLAG_SEQLEN);
  const int first_pair = pr.pairs;  // the piece's trace slot (role 3)
  ATTNCC_TRACE(ct == 0, 3, first_pair, 0);
  if (ct == 0) stash(smem + Cfg::kWorkOff, w);
  take_q<Cfg>(a, maps, w, sbase, ct, pr.pieces);
  fence_async_shared();
  bar_sync(Cfg::kConsumerBarrier, 2 * kGroupThreads);  // Q and the work stash visible
  ATTNCC_TRACE(ct == 0, 3, first_pair, 1);
  if constexpr (Cfg::kRelay) {
    consume_relay<Cfg>(a, w, pt.n_iter, pt.kv_len, sbase, smem, group_index(wg), ct % kGroupThreads, pr);
  } else if constexpr (Cfg::kSeesaw) {
    consume<Cfg>(a, w, pt.n_iter, pt.kv_len, sbase, smem, group_index(wg), ct % kGroupThreads, pr);
  } else {
    consume_stacked<Cfg>(a, w, pt.n_iter, pt.kv_len, sbase, smem, group_index(wg), ct % kGroupThreads, pr);
  }
  ATTNCC_TRACE(ct == 0, 3, first_pair, 2);
  ++pr.pieces;
}

// The consumer warp groups' code after their setmaxnreg: body(wg). Relay: each group its own
// budget (WG0 kConsumerRegisters, WG1 kWg1Registers) and its own copy of the code, the group a
// constant in it (code reachable after two setmaxnregs would run within the smaller); else both
// groups kConsumerRegisters, one copy, the group asked where it is used.
template <class Cfg, class Body>
__device__ __forceinline__ void as_consumers(Body&& body) {
  if constexpr (Cfg::kRelay) {
    if (warp_group() == 0) {
      setmaxnreg_inc<Cfg::kConsumerRegisters>();
      body(std::integral_constant<int, 0>{});
    } else {
      setmaxnreg_dec<Cfg::kWg1Registers>();
      body(std::integral_constant<int, 1>{});
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegisters>();
    body(AskedGroup{});
  }
}

template <class Cfg>
__device__ __forceinline__ void init_barriers(uint32_t sbase) {
  using T = HopperTraits<Cfg>;
  for (int s = 0; s < T::kStages; ++s) {
    for (int b = 0; b < T::kBoxes; ++b) mbarrier_init(T::full(sbase, s, b), kGroupThreads);
    constexpr int kCtas = T::kClusterCtas;  // crossover: the peer's consumers release here too (tile.cuh: release_stage)
    mbarrier_init(T::empty_early(sbase, s), kCtas * (T::kSeesaw ? 1 : 2) * kGroupThreads);  // seesaw: WG0; stacked: both
    mbarrier_init(T::empty_late(sbase, s), kCtas * 2 * kGroupThreads);
    mbarrier_init(T::flags_bar(sbase, s), kGroupThreads);
  }
  for (uint32_t bar : {T::max_a(sbase), T::p_b(sbase), T::p_a(sbase)}) mbarrier_init(bar, kGroupThreads);
  mbarrier_init(T::q_full(sbase), Cfg::kQTma ? 1 : kGroupThreads);  // q_tma: one arrival with the tile's bytes
  mbarrier_init(T::q_empty(sbase), 2 * kGroupThreads);
  fence_mbarrier_init();
}

// Every thread of the CTA (crossover: of the cluster) meets here: after the barriers' inits (the
// peer arrives on and stores into this CTA's), and, crossover, before any thread exits (the peer
// may still be arriving or storing).
template <class Cfg>
__device__ __forceinline__ void cta_sync() {
  if constexpr (Cfg::kCrossover) {
    cluster_sync();
  } else {
    __syncthreads();
  }
}
template <class Cfg>
__device__ __forceinline__ void before_exit() {
  ATTNCC_TRACE_SPAN(1);
  if constexpr (Cfg::kCrossover) cluster_sync();
}

// Split mode: one piece, the CTA's split.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_kernel(const __grid_constant__ AttnccArgs args,
                                                                  const __grid_constant__ MapsOf<Cfg> maps) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sbase = smem_addr(smem);
  ATTNCC_TRACE_SPAN(0);
  if (threadIdx.x == 0) init_barriers<Cfg>(sbase);
  ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 0);
  cta_sync<Cfg>();
  ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 2);
  if (warp_group() == 2) {
    setmaxnreg_dec<Cfg::kProducerRegisters>();
    ATTNCC_TRACE(threadIdx.x == 2 * kGroupThreads, kTraceStart, 0, 3);
    Progress<Cfg::kStages> pr;
    produce<Cfg>(args, maps, CtaWork<Cfg>::of_split(args, blockIdx.x), sbase, smem, threadIdx.x - 2 * kGroupThreads, pr);
    cp_async_commit();
    cp_async_wait<0>();  // no copy in flight when the producer exits
  } else {
    as_consumers<Cfg>([&](auto wg) {
      ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 4);
      Progress<Cfg::kStages> pr;
      consume_piece<Cfg>(args, maps, CtaWork<Cfg>::of_split(args, blockIdx.x), sbase, smem, threadIdx.x, pr, wg);
    });
  }
  before_exit<Cfg>();
}

// Part mode: each role walks the part's pieces (its own copy of the walk in shared memory,
// advanced by its first thread between the role's barriers; done(slot): what that thread does
// first, the piece's partial slot or -1 in hand). Each role has its own loop: code
// reachable after a setmaxnreg runs within that budget, so a loop shared by both roles would
// hold the consumers to the producer's registers.
template <class Cfg, class F, class Done>
__device__ __forceinline__ void walk_pieces(const AttnccArgs& args, unsigned char* walk, int barrier, int threads, int rt, F&& piece,
                                            Done&& done) {
  using W = CtaWork<Cfg>;
  for (;;) {
    const PartWalk pw = unstash_walk(walk);
    if (!walk_has_piece<Cfg>(args, pw)) break;
    // with the overlap, s_q (and the lanes it gives) read afresh in each role: else ptxas computes
    // them once before the roles part and keeps them live across setmaxnreg (GLA-2: a spill)
    const int s_q = Cfg::kOverlap ? opaque(args.s_q) : args.s_q;
    piece(W::of_piece(args, fresh_ctaid() % W::lanes(s_q), walk_piece<Cfg>(args, pw)));
    bar_sync(barrier, threads);  // the role is past the piece (and the walk's reads)
    if (rt == 0) {
      PartWalk next = unstash_walk(walk);
      done(walk_piece<Cfg>(args, next).slot);  // the role's first thread, once the role is past the piece
      walk_next<Cfg>(args, next);
      stash(walk, next);
    }
    bar_sync(barrier, threads);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_parts_kernel(const __grid_constant__ AttnccArgs args,
                                                                        const __grid_constant__ MapsOf<Cfg> maps) {
  using W = CtaWork<Cfg>;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sbase = smem_addr(smem);
  ATTNCC_TRACE_SPAN(0);
  if (threadIdx.x == 0) init_barriers<Cfg>(sbase);
  ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 0);
  if (threadIdx.x < 32) {
    bool whole;
    const PartWalk pw = start_part_walk<Cfg>(args, blockIdx.x / W::lanes(args.s_q), threadIdx.x, whole);
    if (threadIdx.x == 0) stash(smem + Cfg::kWalkCOff, pw), stash(smem + Cfg::kWalkPOff, pw), stash_ints(smem + Cfg::kWholeOff, whole ? 1 : 0);
  }
  ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 1);
  cta_sync<Cfg>();
  ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 2);
  Progress<Cfg::kStages> pr;
  if (warp_group() == 2) {
    setmaxnreg_dec<Cfg::kProducerRegisters>();
    const int p = threadIdx.x - 2 * kGroupThreads;
    ATTNCC_TRACE(p == 0, kTraceStart, 0, 3);
    walk_pieces<Cfg>(
        args, smem + Cfg::kWalkPOff, Cfg::kProducerBarrier, kGroupThreads, p,
        [&](const CtaWork<Cfg>& w) { produce<Cfg>(args, maps, w, sbase, smem, p, pr); }, [](int) {});
    cp_async_commit();
    cp_async_wait<0>();
  } else {
    as_consumers<Cfg>([&](auto wg) {
    // With ready words (core/ready.cuh), the consumers' first thread clears the CTA's and lets the
    // combine launch at once: its blocks merge each sequence once its words are set. (Here, not
    // before the roles part, where GLA-2's part kernels spilled 76-88 bytes, nor in the
    // producer, where sparse_bf16_h128's spilled 92.)
    ATTNCC_TRACE(threadIdx.x == 0, kTraceStart, 0, 4);
    if (threadIdx.x == 0) open_ready<Cfg>(args);
    walk_pieces<Cfg>(
        args, smem + Cfg::kWalkCOff, Cfg::kConsumerBarrier, 2 * kGroupThreads, threadIdx.x,
        [&](const CtaWork<Cfg>& w) {
          consume_piece<Cfg>(args, maps, w, sbase, smem, threadIdx.x, pr, wg);
          fence_partials<Cfg>(args);
        },
        [&](int slot) { mark_ready<Cfg>(args, slot); });
    // whether the parts hold whole sequences, for the combine (core/ready.cuh), before any thread
    // lets it launch (here, not in the prologue or at the consumers' start: GLA-2's and gla_g96's
    // part kernels spilled 36-64 bytes there)
    if (threadIdx.x == 0) publish_whole_parts<Cfg>(args, unstash_int(smem + Cfg::kWholeOff, 0) != 0);
    bar_sync(Cfg::kConsumerBarrier, 2 * kGroupThreads);
    close_parts<Cfg>(args);
    });
  }
  before_exit<Cfg>();
}

}  // namespace hopper
}  // namespace attncc
