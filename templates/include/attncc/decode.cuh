// attncc/decode.cuh: the split-KV decode kernel.
//
// ## What one CTA computes
// The rows of a CTA are query rows that read the same kv head j: row R packs (query token t,
// query head in the group hh) as R = t * group + hh (FlashMLA's packing; sparse: each query
// token is its own sequence and R = hh). A CTA takes tile_m consecutive rows of one kv head
// (its lane: row block x kv head), for one sequence and a range of its KV tiles, and streams
// them, tile_n tokens at a time. The range is one of num_splits equal splits of the sequence
// (split mode), or each piece in turn of a balanced part of all sequences' tiles (part mode,
// schedule.cuh: the CTA walks the sequences its part crosses, one decode_tiles per piece):
//
//     for each KV tile:                             (cp.async pipeline, `stages` tiles deep)
//         S  = Q K^T              mma.sync, Q and K from shared memory (ldmatrix); qk_split: two
//                                 warps each take half the k-steps and add their partial blocks
//         S  = masked(S)          causal limit, past the sequence, -1 index (tiles that need it)
//         m' = rowmax(S c, m); P = exp2(S c - m'); l = l 2^(m-m') + rowsum(P); O *= 2^(m-m')
//                                 c = scale log2(e); m moves only by more than 8 (softmax.cuh)
//         O += P V                P through shared memory, V by ldmatrix.trans
//     out = O / l, lse = (m + log2 l) ln 2          -> out/lse (1 split) or partials (combine.cuh)
//
// K and V are views over the same staged tile: the record's runs are copied (and fp8
// dequantized) once into a 16-bit row of staged_width elements per token, and the key (value)
// is the concatenation of the staged column runs key_runs (value_runs). MLA's latent is loaded
// once and used by both products.
//
// ## Warp layout (all constexpr, from the plan)
// warps = WM x WN. Warp (wm, wn) owns rows [wm*WR, wm*WR + WR) (WR = warp_rows, 16 or 32) in
// both products. In S = Q K^T it computes tokens [wn*TN, wn*TN + TN) of the tile (TN =
// tile_n / WN): no product is computed twice. The row max is completed across the WN warps
// of a row group through shared memory; each warp writes its P block to shared memory, and in
// O += P V it owns value columns [wn*VN, wn*VN + VN) (VN = d_v / WN) against all tile_n tokens.
// The per-warp l sums only its own tokens; the WN partial sums are added at the end.
// qk_split (the default where it pays, see the knob): the warps wn = 2 wt + wk, wk = 0, 1, of a
// pair both compute S for the pair's 2 TN tokens, over the even (wk = 0) or odd (wk = 1)
// k-steps, and each adds the partner's partial of its own TN tokens (through the row group's P
// rows, free until P is stored): the Q fragment of a k-step then serves 2 TN tokens, so
// S = Q K^T reads half the Q bytes, for tile_m tile_n fp32 stored and loaded. The layout
// after the sum is the one above.
// warp_rows = 0 in the plan picks, among the legal WR in {16, 32}, the one that reads the
// fewest shared-memory bytes per KV tile:
//     WN*tile_m*d_k + WM*tile_n*d_k   (Q and K reads of S = Q K^T)
//   + WN*tile_m*tile_n + WM*tile_n*d_v (P and V reads of O += P V).
//
// ## Pipeline and barriers, per KV step i
//   A  wait for tile i, __syncthreads            tile i visible; step i-1 fully consumed
//      store the slots of tile i + stages; prefetch the page number of tile i + stages + 1
//      [raw mode: dequantize tile i into the staged tile, __syncthreads]
//      S = Q K^T, with the copies of tile i + stages - 1 (into the stage of step i - 1) issued
//      between its k-steps (copy_interleave = 1) or before it (0)
//      [qk_split: the pair's partial S summed in two rounds, each behind a pair barrier]
//      mask, row max -> shared;  B  row-group barrier
//      m, P, l, O rescale (skipped when no row max moved), P -> shared;  C  row-group barrier
//      O += P V
// ping_pong (two row groups): A is CTA-wide only at step 0. Row group 1 alone copies tiles and
// keeps the slots; the groups hand tiles over through named barriers instead of A:
//   row group 0, step i:  sync FULL(i); arrive EMPTY(i - 1)     (done with tile i - 1)
//   row group 1, step i:  sync EMPTY(i - 1); copy tile i + 1 into tile i - 1's stage; S = Q K^T;
//                         wait for its copies, arrive FULL(i + 1); softmax; O += P V
// so row group 0 may run up to about half a step ahead, and one group's softmax (no tensor
// work, two barriers) overlaps the other group's products instead of both idling the tensor
// pipe at once (H200, MLA h_q 128 s_q 2, same run: 334 TFLOP/s without, 351 with).
//
// ## Plan knobs read here beyond the brief's schema (all optional)
//   warp_rows        0 (default: the legal one reading the fewest shared bytes, without
//                    qk_split), 16 or 32
//   copy_interleave  -1 (default: 1 when compute-bound: 2 tile_m (d_k + d_v) >= 64 record bytes
//                    per kv head), 0 or 1
//   qk_split         -1 (default: 1 when legal and either compute-bound or the O accumulator is
//                    <= 64 registers), 0 or 1 (1 must be legal: WN even, a partial S of
//                    2 WR TN / 32 <= 32 registers, key runs on multiples of 32 columns).
//                    Shared memory is the same either way.
//   ping_pong        -1 (default: 1 when legal and compute-bound), 0 or 1 (1 must be legal: two
//                    row groups, two stages, 16-bit staging, tile_n <= 32 WN). With it,
//                    copy_interleave 1 spreads the copies over the first half of the k-steps.
//                    Shared memory is the same either way.
//
// ## Shared memory and constraints, for the lowering (Python; mirrors the static_asserts)
//
//   SMEM_LIMIT = 232448  # 227 KB
//   fp8 = lambda dt: dt in ("e4m3", "e5m2")
//   def pitch(w):        # bytes of a staged 16-bit row: XOR swizzle (w/8 % 8 == 0), odd, or +1 chunk
//       c = w // 8; return 16 * (c if c % 8 == 0 or c % 2 == 1 else c + 1)
//   pad16 = lambda x: (x + 15) // 16 * 16
//   def num_scales(s):
//       g = s["scale"]["group"] if s["scale"] else 0
//       return (s["seg_lo"] + s["width"] - 1) // g - s["seg_lo"] // g + 1 if g else 0
//   def layout_ok(wr, p):
//       m, n, w, dv = p["tile_m"], p["tile_n"], p["warps"], p["d_v"]
//       if m % wr or w % (m // wr): return False
//       wn = w // (m // wr)
//       return (n % (8 * wn) == 0 and dv % (16 * wn) == 0
//               and wr * (dv // wn) // 32 <= 128      # O accumulator registers
//               and wr * (n // wn) // 32 <= 32)       # S registers
//   def warp_rows(p):
//       if p.get("warp_rows", 0): return p["warp_rows"]
//       m, n, w, dk, dv = p["tile_m"], p["tile_n"], p["warps"], p["d_k"], p["d_v"]
//       reads = lambda wr: (w // (m // wr)) * m * (dk + n) + (m // wr) * n * (dk + dv)
//       ok = [wr for wr in (16, 32) if layout_ok(wr, p)]
//       return (32 if reads(32) < reads(16) else 16) if len(ok) == 2 else (32 if ok == [32] else 16)
//   def smem_bytes(p):
//       m, n, st = p["tile_m"], p["tile_n"], p["stages"]
//       raw = any(fp8(s["dtype"]) for s in p["sources"])
//       raw_pitch = sum(pad16(s["width"] * (1 if fp8(s["dtype"]) else 2)) + pad16(4 * num_scales(s))
//                       for s in p["sources"])
//       wn = p["warps"] // (m // warp_rows(p))
//       return (m * pitch(p["d_k"]) + (1 if raw else st) * n * pitch(p["staged_width"])
//               + (st * n * raw_pitch if raw else 0) + m * pitch(n) + (st + 1) * n * 4 + wn * m * 4
//               + 128)           # the CTA's work and part walk (kWorkBytes)
//   def check(p):        # -> list of errors
//       e, stride = [], [t["token_stride_bytes"] for t in p["tensors"]]
//       if p["elem"] not in ("bf16", "fp16"): e.append("elem: bf16 or fp16")
//       if p["d_k"] % 16 or p["d_v"] % 16: e.append("d_k, d_v: multiples of 16")
//       if p["staged_width"] % 8 or any(w % 8 for _, w in p["key_runs"] + p["value_runs"]):
//           e.append("runs, staged_width: multiples of 8")
//       for s in p["sources"]:
//           nbytes = s["width"] * (1 if fp8(s["dtype"]) else 2)
//           if (s["smem_col"] % 8 or s["offset_bytes"] % 16 or s["head_stride_bytes"] % 16
//                   or nbytes % 16 or stride[s["tensor"]] % 16):
//               e.append(s["segment"] + ": 16-byte alignment of offset, head stride, bytes, token stride")
//           if not fp8(s["dtype"]) and s["dtype"] != p["elem"]: e.append(s["segment"] + ": dtype != elem")
//           if fp8(s["dtype"]):
//               sc = s["scale"]
//               if (not sc or s["seg_lo"] % 16 or sc["group"] % 16 or sc["offset_bytes"] % 4
//                       or sc["head_stride_bytes"] % 4 or stride[sc["tensor"]] % 4):
//                   e.append(s["segment"] + ": fp8 scale, seg_lo % 16, group % 16, 4-byte scale alignment")
//       if p["stages"] < 2: e.append("stages >= 2")
//       if p["warps"] not in (4, 8): e.append("warps: 4 or 8")
//       if p["tile_m"] % 16 or p["tile_n"] % 16 or p["tile_n"] > 32 * p["warps"]:
//           e.append("tile_m, tile_n: multiples of 16; tile_n <= 32 * warps")
//       if not layout_ok(warp_rows(p), p): e.append("no legal warp layout (see layout_ok)")
//       elif smem_bytes(p) > SMEM_LIMIT: e.append("shared memory > 227 KB")
//       return e
//
// Runtime (host) conditions: every tensor pointer 16-byte aligned; 1 <= s_q <= max_sq;
// num_splits >= 1 with the workspace when > 1; or num_parts > 0 (balanced, schedule.cuh),
// num_splits == 1 and the workspace of 2 num_parts slots; fewer than 2^31 CTAs.
// Registers: 255 at most with no spills for every example and tests/specs.py plan, both kernels,
// sm_90a and sm_80 (tests/test_build.py reads ptxas -v);
// the largest MLA plans sit at ~250, so a new shape should be compiled once and its report read.
#pragma once

#include "attncc/abi.h"
#include "attncc/common.cuh"
#include "attncc/dequant.cuh"
#include "attncc/load.cuh"
#include "attncc/mma.cuh"
#include "attncc/schedule.cuh"
#include "attncc/softmax.cuh"

namespace attncc {

constexpr int kSmemLimitBytes = 232448;  // 227 KB: the largest dynamic shared memory of a CTA on sm_90

// ------------------------------------------------------------------------------------------
// Warp layout

__host__ __device__ constexpr bool warp_rows_legal(int wr, int tile_m, int tile_n, int warps, int d_v) {
  if (tile_m % wr != 0) return false;
  const int wm = tile_m / wr;
  if (warps % wm != 0) return false;
  const int wn = warps / wm;
  return tile_n % (8 * wn) == 0 && d_v % (16 * wn) == 0 && wr * (d_v / wn) / 32 <= 128 &&
         wr * (tile_n / wn) / 32 <= 32;
}

__host__ __device__ constexpr long long smem_reads_per_tile(int wr, int tile_m, int tile_n, int warps, int d_k, int d_v) {
  const int wm = tile_m / wr, wn = warps / wm;
  return 1LL * wn * tile_m * d_k + 1LL * wm * tile_n * d_k + 1LL * wn * tile_m * tile_n + 1LL * wm * tile_n * d_v;
}

__host__ __device__ constexpr int pick_warp_rows(int requested, int tile_m, int tile_n, int warps, int d_k, int d_v) {
  if (requested != 0) return requested;
  const bool ok16 = warp_rows_legal(16, tile_m, tile_n, warps, d_v);
  const bool ok32 = warp_rows_legal(32, tile_m, tile_n, warps, d_v);
  if (ok16 && ok32)
    return smem_reads_per_tile(32, tile_m, tile_n, warps, d_k, d_v) < smem_reads_per_tile(16, tile_m, tile_n, warps, d_k, d_v) ? 32 : 16;
  return ok32 ? 32 : 16;
}

// ------------------------------------------------------------------------------------------
// Everything derived from the plan

template <class Cfg>
struct DecodeTraits {
  static constexpr Dtype kElem = Cfg::kElem;
  using E = Elem16<kElem>;
  static constexpr int kThreads = Cfg::kWarps * 32;
  static constexpr int kTileM = Cfg::kTileM;
  static constexpr int kTileN = Cfg::kTileN;
  static constexpr int kStages = Cfg::kStages;

  static constexpr int kWarpRows = pick_warp_rows(Cfg::kWarpRows, kTileM, kTileN, Cfg::kWarps, Cfg::kDK, Cfg::kDV);
  static constexpr int kWarpsM = kTileM / kWarpRows;
  static constexpr int kWarpsN = Cfg::kWarps / kWarpsM;
  static constexpr int kMT = kWarpRows / 16;          // m16 tiles per warp
  static constexpr int kTokPerWarp = kTileN / kWarpsN;  // S = Q K^T: tokens per warp
  static constexpr int kNTS = kTokPerWarp / 8;         // ... in n8 tiles
  static constexpr int kColsPerWarp = Cfg::kDV / kWarpsN;  // O += P V: value columns per warp
  static constexpr int kNTO = kColsPerWarp / 8;        // ... in n8 tiles

  __host__ __device__ static constexpr bool any_fp8() {
    bool r = false;
    for (int i = 0; i < Cfg::kNumSources; ++i) r = r || is_fp8(Cfg::kSources[i].dtype);
    return r;
  }
  static constexpr bool kRaw = any_fp8();
  // A tile's math per byte of cache, 2 tile_m (d_k + d_v) / record bytes per kv head, >= 64:
  // shared memory and the tensor pipe, not the copies, bound the KV step. The lowering decides
  // (its host also picks the balanced schedule by it); the formula is checked here.
  static constexpr int kRecordBytesPerHead = RawLayout<Cfg>::kPitchBytes;
  static constexpr bool kComputeBound = Cfg::kComputeBound;
  static_assert(kComputeBound == (2 * kTileM * (Cfg::kDK + Cfg::kDV) >= 64 * kRecordBytesPerHead), "compute_bound: the lowering's formula");

  // qk_split: S = Q K^T is split over d_k between the two warps wn = 2 wt + wk (wk = 0, 1) of a
  // pair. Both compute the pair's 2 TN tokens, warp wk over the k-steps 2 j + wk, and each adds
  // the partner's partial block of its own TN tokens (pair_sum): a warp reads a Q fragment for
  // 2 TN tokens instead of TN, which halves the Q reads, for tile_m tile_n fp32 stored and loaded.
  // Legal with an even WN, at most 32 registers of partial S, and key runs on multiples of 32
  // columns (the odd k-steps' chunks are then the even ones' + 2, see LaneRow). By default on
  // where it pays and fits: compute-bound plans (H200: +9% on MLA h_q 128, at ~250 registers)
  // and plans with an O accumulator of <= 64 registers (+5% on memory-bound MLA h_q 16); off for
  // the others (a 32-row warp of 128 accumulators in a memory-bound plan spilled).
  __host__ __device__ static constexpr bool key_runs_split() {
    bool r = true;
    for (int i = 0; i < Cfg::kNumKeyRuns; ++i) r = r && Cfg::kKeyRuns[i].col % 32 == 0 && Cfg::kKeyRuns[i].width % 32 == 0;
    return r;
  }
  static constexpr bool kQKSplitLegal = kWarpsN % 2 == 0 && kWarpRows * 2 * kTokPerWarp / 32 <= 32 && key_runs_split();
  static constexpr int kAccRegs = kMT * kNTO * 4;  // O accumulator registers per thread
  static constexpr bool kQKSplit =
      Cfg::kQKSplit >= 0 ? Cfg::kQKSplit != 0 : kQKSplitLegal && (kComputeBound || kAccRegs <= 64);
  static constexpr int kNTQK = kQKSplit ? 2 * kNTS : kNTS;                    // n8 tiles of S = Q K^T per warp
  static constexpr int kQKSteps = kQKSplit ? Cfg::kDK / 32 : Cfg::kDK / 16;  // k-steps per warp
  // Independent accumulator chains in S = Q K^T: with fewer than 4 (m16, n8) tiles per warp, the
  // k-steps alternate between kQKChains copies of s, summed at the end, so consecutive mma do not
  // wait on each other's result.
  static constexpr int kQKChains = kMT * kNTQK >= 4 ? 1 : 4 / (kMT * kNTQK);
  // pair_sum's slot: a round's half of the MT x NTS fragments a warp hands its partner, in the
  // row group's rows of the P tile (free from barrier A until P is stored).
  static constexpr int kPairSlotBytes = kMT * kNTS * 4 / 2 * 4 * 32;

  // ping_pong (see the header): the two row groups drift up to half a KV step apart, so that
  // one group's softmax overlaps the other's products. Row group 1 alone copies the tiles (the
  // producer); named barriers replace the CTA-wide barrier A:
  //   FULL(i):  the producer, after waiting for its copies of tile i (after S = Q K^T of step
  //             i - 1), arrives; row group 0 syncs at the top of step i.
  //   EMPTY(i): row group 0 arrives at the top of step i + 1, right after FULL(i + 1) (it is
  //             done with tile i); the producer syncs before copying tile i + 2 into tile i's
  //             stage. (Arriving later, after row group 0's S = Q K^T, to enforce a lag: -3%.)
  // Both alternate between two barrier ids by parity: a barrier is reused only after the other
  // group has passed the previous use of it. Legal with two row groups, two stages, direct
  // (16-bit) staging and tile_n <= 32 WN; by default on when the plan is compute-bound (H200:
  // +5% on MLA h_q 128; GLA-2 h_q 128 within 1%).
  static constexpr bool kPingPongLegal = kWarpsM == 2 && kStages == 2 && !kRaw && kTileN <= kWarpsN * 32;
  static constexpr bool kPingPong = Cfg::kPingPong >= 0 ? Cfg::kPingPong != 0 : kPingPongLegal && kComputeBound;
  static constexpr int kCopyThreads = kPingPong ? kWarpsN * 32 : kThreads;  // threads that copy tiles

  using QRows = SmemRows<Cfg::kDK>;
  using KVRows = SmemRows<Cfg::kStagedWidth>;
  using PRows = SmemRows<kTileN>;
  // copy_interleave: 1 spreads the copies of the next KV tile over the k-steps of S = Q K^T (their
  // issue then hides behind ldmatrix latency), 0 issues them all at the top of the step (more
  // bytes in flight sooner: better when memory-bound). -1: 1 when compute-bound without
  // ping_pong (H200: fp8 MLA h_q 128 202 vs 191 TFLOP/s). With ping_pong the producer waits for
  // its copies right after S = Q K^T, so they go at the top (0, the default: MLA h_q 128 351 vs
  // 322 TFLOP/s) or over the first half of its k-steps (1).
  static constexpr bool kInterleaveCopies =
      Cfg::kCopyInterleave >= 0 ? Cfg::kCopyInterleave != 0 : kComputeBound && !kPingPong;
  static constexpr int kCopySteps = kPingPong ? kQKSteps / 2 : kQKSteps;  // k-steps the copies spread over
  // Token-major copies (load.cuh) keep their Cursor's pointers live from the top of the step:
  // fine for copies at the top, at most 2 through interleaved S = Q K^T (4 spilled).
  static constexpr bool kTokenMajorCopies =
      !kInterleaveCopies || TileCopy<Cfg, KVRows, kRaw, kCopyThreads>::kCursorPointers <= 2;
  using Copy = TileCopy<Cfg, KVRows, kRaw, kCopyThreads, kTokenMajorCopies>;
  static constexpr int kKVBuffers = kRaw ? 1 : kStages;
  static constexpr int kKVTileBytes = KVRows::bytes(kTileN);
  static constexpr int kRawTileBytes = RawLayout<Cfg>::bytes(kTileN);

  static constexpr int kQOff = 0;
  static constexpr int kKVOff = kQOff + QRows::bytes(kTileM);
  static constexpr int kRawOff = kKVOff + kKVBuffers * kKVTileBytes;
  static constexpr int kPOff = kRawOff + (kRaw ? kStages * kRawTileBytes : 0);
  static constexpr int kSlotOff = kPOff + PRows::bytes(kTileM);
  static constexpr int kRedOff = kSlotOff + (kStages + 1) * kTileN * 4;
  static constexpr int kWorkOff = kRedOff + kWarpsN * kTileM * 4;  // CtaWork, then PartWalk
  static constexpr int kWalkOffset = 64;
  static constexpr int kWorkBytes = 128;  // the lowering adds these bytes too
  static constexpr int kSmemBytes = kWorkOff + kWorkBytes;

  // Checks the lowering also makes (see the header comment).
  static_assert(kElem == Dtype::kBF16 || kElem == Dtype::kFP16, "elem is bf16 or fp16");
  static_assert(Cfg::kDK % 16 == 0 && Cfg::kDV % 16 == 0, "d_k and d_v are multiples of 16");
  static_assert(runs_width(Cfg::kKeyRuns) == Cfg::kDK, "key runs add up to d_k");
  static_assert(runs_width(Cfg::kValueRuns) == Cfg::kDV, "value runs add up to d_v");
  static_assert(kStages >= 2, "stages >= 2");
  static_assert(Cfg::kNumSMs > 0, "num_sms: the host's split heuristic uses it; the kernel does not");
  static_assert(Cfg::kPageSize >= 1, "page size >= 1 (sparse plans address slots directly)");
  static_assert(Cfg::kWarps == 4 || Cfg::kWarps == 8, "warps in {4, 8}");
  static_assert(kTileM % 16 == 0 && kTileN % 16 == 0, "tile_m and tile_n are multiples of 16");
  static_assert(kTileN <= kThreads, "one thread per token computes the slots");
  static_assert(kWarpRows == 16 || kWarpRows == 32, "warp_rows in {16, 32}");
  static_assert(warp_rows_legal(kWarpRows, kTileM, kTileN, Cfg::kWarps, Cfg::kDV),
                "warp layout: tile_m % warp_rows, warps % (tile_m / warp_rows), tile_n % (8 WN), d_v % (16 WN), "
                "accumulator <= 128 and scores <= 32 registers");
  static_assert(!kQKSplit || kQKSplitLegal, "qk_split: WN even, partial S <= 32 registers, key runs on multiples of 32 columns");
  // Named barriers: 0 (__syncthreads), 1 .. WM (row groups), then one per qk_split pair.
  static constexpr int kPairBarrier0 = kWarpsM + 1;
  static constexpr int kFullBarrier0 = kPairBarrier0 + (kQKSplit ? Cfg::kWarps / 2 : 0);  // ping_pong: 2 each
  static constexpr int kEmptyBarrier0 = kFullBarrier0 + 2;
  static_assert(kEmptyBarrier0 + (kPingPong ? 2 : 0) <= 16, "16 named barriers");
  static_assert(!kPingPong || kPingPongLegal, "ping_pong: two row groups, two stages, 16-bit staging, tile_n <= 32 WN");
  static_assert(!kQKSplit || kWarpsN * kPairSlotBytes <= PRows::bytes(kWarpRows), "pair_sum slots fit the row group's P rows");
  static_assert(kRedOff % 16 == 0, "red: 16-byte aligned rows of WN floats");
  static_assert(kSmemBytes <= kSmemLimitBytes, "shared memory exceeds 227 KB: smaller tile_n, tile_m or stages");
};

template <class Cfg>
__host__ __device__ constexpr bool check_sources() {
  for (int i = 0; i < Cfg::kNumSources; ++i) {
    const Source s = Cfg::kSources[i];
    if (s.smem_col % 8 != 0 || s.offset_bytes % 16 != 0 || s.head_stride_bytes % 16 != 0) return false;
    if (s.data_bytes() % 16 != 0 || Cfg::kTokenStride[s.tensor] % 16 != 0) return false;
    if (s.smem_col + s.width > Cfg::kStagedWidth) return false;
    if (is_fp8(s.dtype) != s.has_scale()) return false;
    if (!is_fp8(s.dtype) && s.dtype != Cfg::kElem) return false;  // 16-bit runs have the elem dtype
    if (s.has_scale() && (s.seg_lo % 16 != 0 || s.scale_group % 16 != 0 || s.scale_offset_bytes % 4 != 0 ||
                          s.scale_head_stride_bytes % 4 != 0 || Cfg::kTokenStride[s.scale_tensor] % 4 != 0))
      return false;
  }
  return true;
}

// ------------------------------------------------------------------------------------------
// Value columns

// Staged chunk of value chunk v (runtime): a walk over the (few) value runs.
template <class Cfg>
__device__ __forceinline__ int value_chunk(int v) {
  int out = 0, base = 0;
  static_for<Cfg::kNumValueRuns>([&](auto ri) {
    constexpr Run r = Cfg::kValueRuns[decltype(ri)::value];
    if (v >= base / 8 && v < (base + r.width) / 8) out = r.col / 8 + (v - base / 8);
    base += r.width;
  });
  return out;
}

// ------------------------------------------------------------------------------------------
// S = Q K^T for this warp's rows and tokens: s[mt][nt] += Q[rows mt] . K[tokens nt]^T over the
// warp's k-steps: all of d_k, or with qk_split the k-steps 2 j + wk over the pair's 2 TN tokens,
// the warp's own TN first (n-tiles [0, NTS) own, [NTS, 2 NTS) the partner's).
// on_step(Index<j>) runs after the warp's j-th k-step (the caller's chance to issue copies).
template <class Cfg, class OnStep>
__device__ __forceinline__ void qk_tile(float (&s)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTQK][4], uint32_t q_tile,
                                        uint32_t kv_tile, int wm, int wn, int lane, OnStep&& on_step) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, NT = T::kNTQK, C = T::kQKChains, TN = T::kTokPerWarp;
  constexpr int kStride = T::kQKSplit ? 2 : 1;  // the warp's j-th k-step is kStride * j + wk
  const int wk = T::kQKSplit ? (wn & 1) : 0;
  const int koff = 2 * wk;  // chunk offset of k-step kStride * j + wk from k-step kStride * j
  float chain[C > 1 ? C - 1 : 1][MT][NT][4];  // chains 1..C-1 (chain 0 is s)
#pragma unroll
  for (int c = 0; c < (C > 1 ? C - 1 : 1); ++c)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) chain[c][mt][n][j] = 0.f;
  auto acc = [&](auto kc, int mt, int n) -> float(&)[4] {
    if constexpr (decltype(kc)::value == 0) {
      return s[mt][n];
    } else {
      return chain[decltype(kc)::value - 1][mt][n];
    }
  };
  LaneRow<typename T::QRows> qrow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    qrow[mt] = LaneRow<typename T::QRows>(q_tile, wm * T::kWarpRows + mt * 16 + a_ldm_row(lane), a_ldm_khalf(lane), koff);
  // Token of the warp's i-th column of s.
  auto token = [&](int i) {
    if constexpr (T::kQKSplit) {
      return (wn >> 1) * 2 * TN + (wk * TN + i) % (2 * TN);
    } else {
      return wn * TN + i;
    }
  };
  // Rows of K: pairs of n-tiles via x4, a last odd n-tile via x2.
  constexpr int NP = NT / 2;
  LaneRow<typename T::KVRows> krow[NP > 0 ? NP : 1];
#pragma unroll
  for (int np = 0; np < NP; ++np)
    krow[np] = LaneRow<typename T::KVRows>(kv_tile, token(np * 16 + b_ldm_row(lane)), b_ldm_khalf(lane), koff);
  const LaneRow<typename T::KVRows> krow_odd(kv_tile, token(NP * 16 + (lane & 7)), (lane >> 3) & 1);
  const int kx = T::KVRows::kSwizzle ? (lane & 7) : 0;  // for non-adjacent key halves
  const int khalf = b_ldm_khalf(lane);

  static_for<T::kQKSteps>([&](auto jj) {
    constexpr int k = kStride * decltype(jj)::value;  // (+ wk, folded into the addresses)
    const Index<decltype(jj)::value % C> kc;
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], qrow[mt].at(2 * k));
    // Staged chunks of key columns 16k..16k+7 and 16k+8..16k+15.
    constexpr int c0 = run_to_staged(Cfg::kKeyRuns, 16 * k) / 8;
    constexpr int c1 = run_to_staged(Cfg::kKeyRuns, 16 * k + 8) / 8;
    constexpr bool kAdjacent = c0 % 2 == 0 && c1 == c0 + 1;
    static_assert(!T::kQKSplit || (kAdjacent && c0 % 4 == 0), "qk_split: key runs on multiples of 32 columns");
#pragma unroll
    for (int np = 0; np < NP; ++np) {
      uint32_t b[4];
      uint32_t addr;
      if constexpr (kAdjacent) {
        addr = krow[np].at(c0);
      } else {
        const int c = khalf ? c1 : c0;
        addr = krow[np].row_addr + ((T::KVRows::kSwizzle ? (c ^ kx) : c) << 4);
      }
      ldmatrix_x4(b, addr);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<Cfg::kElem>(acc(kc, mt, 2 * np), a[mt], b[0], b[1]);
        mma_16816<Cfg::kElem>(acc(kc, mt, 2 * np + 1), a[mt], b[2], b[3]);
      }
    }
    if constexpr (NT % 2 == 1) {
      uint32_t b[2];
      uint32_t addr;
      if constexpr (kAdjacent) {
        addr = krow_odd.at(c0);
      } else {
        const int c = ((lane >> 3) & 1) ? c1 : c0;
        addr = krow_odd.row_addr + ((T::KVRows::kSwizzle ? (c ^ kx) : c) << 4);
      }
      ldmatrix_x2(b, addr);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mma_16816<Cfg::kElem>(acc(kc, mt, NT - 1), a[mt], b[0], b[1]);
    }
    on_step(jj);
  });
  if constexpr (C > 1) {
#pragma unroll
    for (int c = 0; c < C - 1; ++c)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j) s[mt][n][j] += chain[c][mt][n][j];
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&x)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) x[mt][n][j] = 0.f;
}

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive at named barrier `id` without waiting: releases this thread's prior writes (and, after
// cp.async.wait_group, its completed copies) to the threads that then bar.sync on it.
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void sts64(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y));
}

__device__ __forceinline__ void lds64(uint32_t addr, float& x, float& y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(addr));
}

// qk_split: s (this warp's TN tokens) = its partial sp[.][0, NTS) + the partner's partial of the
// same tokens. Each warp hands the partner sp[.][NTS, 2 NTS) in two rounds of half (float2
// units u, lane-major: conflict-free) through two slots, each round a store, a pair barrier and
// an add:
//   round 0: store into my slot, barrier, add from the partner's slot;
//   round 1: store into the partner's slot, barrier, add from my slot.
// A thread only stores to addresses it was the last to read (round 1) or that nobody reads until
// the next barrier, so two barriers are enough.
template <class Cfg>
__device__ __forceinline__ void pair_sum(float (&s)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTS][4],
                                         const float (&sp)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTQK][4],
                                         uint32_t my_slot, uint32_t partner_slot, int pair_barrier, int lane) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, NTS = T::kNTS;
  constexpr int kUnits = MT * NTS;  // float2 units per round: half of MT x NTS fragments of 4
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NTS; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[mt][n][j] = sp[mt][n][j];
#pragma unroll
  for (int round = 0; round < 2; ++round) {
    const uint32_t to = round == 0 ? my_slot : partner_slot;
    const uint32_t from = round == 0 ? partner_slot : my_slot;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int f = (round * kUnits + u) * 2;  // first float of the unit in [mt][n][j] order
      const int mt = f / (4 * NTS), n = f / 4 % NTS, j = f % 4;
      sts64(to + (u * 32 + lane) * 8, sp[mt][NTS + n][j], sp[mt][NTS + n][j + 1]);
    }
    bar_sync(pair_barrier, 64);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int f = (round * kUnits + u) * 2;
      const int mt = f / (4 * NTS), n = f / 4 % NTS, j = f % 4;
      float x, y;
      lds64(from + (u * 32 + lane) * 8, x, y);
      s[mt][n][j] += x;
      s[mt][n][j + 1] += y;
    }
  }
}

// O += P V for this warp's rows and value columns, over all tile_n tokens.
template <class Cfg>
__device__ __forceinline__ void pv_tile(float (&o)[DecodeTraits<Cfg>::kMT][DecodeTraits<Cfg>::kNTO][4], uint32_t p_tile,
                                        uint32_t kv_tile, int wm, int wn, int lane) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, NTO = T::kNTO;
  LaneRow<typename T::PRows> prow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    prow[mt] = LaneRow<typename T::PRows>(p_tile, wm * T::kWarpRows + mt * 16 + a_ldm_row(lane), a_ldm_khalf(lane));
  // V rows (tokens) of this lane: kt*16 + bt_ldm_row(lane); its 8-column half: bt_ldm_nhalf.
  const int vrow = bt_ldm_row(lane);
  const int nhalf = bt_ldm_nhalf(lane);
  const int vx = T::KVRows::kSwizzle ? (lane & 7) : 0;
  const int vchunk0 = wn * (T::kColsPerWarp / 8);  // first value chunk of this warp
  static_assert(NTO % 2 == 0, "value columns per warp are a multiple of 16");

#pragma unroll
  for (int kt = 0; kt < T::kTileN / 16; ++kt) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], prow[mt].at(2 * kt));
    const uint32_t vbase = kv_tile + (kt * 16 + vrow) * T::KVRows::kPitchBytes;
#pragma unroll
    for (int np = 0; np < NTO / 2; ++np) {
      int c;
      if constexpr (Cfg::kNumValueRuns == 1) {
        c = Cfg::kValueRuns[0].col / 8 + vchunk0 + 2 * np + nhalf;
      } else {
        c = value_chunk<Cfg>(vchunk0 + 2 * np + nhalf);
      }
      uint32_t b[4];
      ldmatrix_x4_trans(b, vbase + ((c ^ vx) << 4));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<Cfg::kElem>(o[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<Cfg::kElem>(o[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

__device__ __forceinline__ void row_group_sync(int group, int threads) { bar_sync(group + 1, threads); }

// The WN values of one row of `red` (row-major [tile_m][WN], 16-byte aligned): in 16- or 8-byte loads.
template <int WN>
__device__ __forceinline__ void load_row(const float* row, float (&v)[WN]) {
  if constexpr (WN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < WN / 4; ++i) {
      const float4 x = reinterpret_cast<const float4*>(row)[i];
      v[4 * i] = x.x, v[4 * i + 1] = x.y, v[4 * i + 2] = x.z, v[4 * i + 3] = x.w;
    }
  } else if constexpr (WN % 2 == 0) {
#pragma unroll
    for (int i = 0; i < WN / 2; ++i) {
      const float2 x = reinterpret_cast<const float2*>(row)[i];
      v[2 * i] = x.x, v[2 * i + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < WN; ++i) v[i] = row[i];
  }
}

// x[mt][h], one value per row of this warp (the same in the 4 lanes of a quad), combined with
// `op` over the WN warps of the row group, through `red` ([tile_m][WN]) and one row-group
// barrier. The caller orders the write after every earlier read of `red`.
template <class Cfg, class Op>
__device__ __forceinline__ void row_group_reduce(float (&x)[DecodeTraits<Cfg>::kMT][2], float* red, int wm, int wn,
                                                 int lane, Op op) {
  using T = DecodeTraits<Cfg>;
  constexpr int MT = T::kMT, WN = T::kWarpsN;
  auto row = [&](int mt, int h) { return red + (wm * T::kWarpRows + mt * 16 + (lane >> 2) + 8 * h) * WN; };
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) row(mt, h)[wn] = x[mt][h];
  }
  row_group_sync(wm, WN * 32);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[WN];
      load_row(row(mt, h), v);
      float r = v[0];
#pragma unroll
      for (int w = 1; w < WN; ++w) r = op(r, v[w]);
      x[mt][h] = r;
    }
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v));
}

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
    return ceil_div(rows, DecodeTraits<Cfg>::kTileM) * Cfg::kHeadsKV;
  }
  __host__ __device__ __forceinline__ static int num_seqs(const AttnccArgs& a) { return Cfg::kSparse ? a.batch * a.s_q : a.batch; }
  // Query rows of one sequence, contiguous in [b, s_q, h_q]: dense s_q h_q, sparse h_q.
  __host__ __device__ __forceinline__ static int seq_rows(int s_q) { return Cfg::kSparse ? Cfg::kHeadsQ : s_q * Cfg::kHeadsQ; }
  __device__ __forceinline__ static int seq_tiles(const AttnccArgs& a, int seq) {
    constexpr int N = DecodeTraits<Cfg>::kTileN;
    return ceil_div(Cfg::kSparse ? Cfg::kTopK : __ldg(a.seqlens + seq), N);
  }

  __device__ __forceinline__ static CtaWork make(const AttnccArgs& a, int lane, int seq) {
    CtaWork w;
    w.rows_total = Cfg::kSparse ? Cfg::kGroup : a.s_q * Cfg::kGroup;
    const int n_mblocks = ceil_div(w.rows_total, DecodeTraits<Cfg>::kTileM);
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
  // Row of the partial workspace: split mode [split, b, s_q, h_q], part mode [slot, s_q, h_q].
  __device__ __forceinline__ long long partial_row(const AttnccArgs& a, int t, int hq) const {
    const long long slot_row = a.num_parts > 0 ? slot : static_cast<long long>(slot) * a.batch + b;
    return (slot_row * a.s_q + t) * Cfg::kHeadsQ + hq;
  }
  // Query token and query head (within the group) of CTA row R.
  __device__ __forceinline__ int row_token(int R) const { return Cfg::kSparse ? t_fixed : R / Cfg::kGroup; }
  __device__ __forceinline__ int row_head(int R) const { return Cfg::kSparse ? R : R % Cfg::kGroup; }
  // Query token t sees cache positions < token_limit (bottom-right aligned causal mask).
  __device__ __forceinline__ static int token_limit(int t, int kv_len, int s_q) {
    if constexpr (Cfg::kCausal) {
      return min(max(kv_len - s_q + t + 1, 0), kv_len);
    } else {
      return kv_len;
    }
  }
};

// The tiles of all sequences and of the sequences before `seq`, summed by one warp, 32
// sequences at a time: where sequence `seq` starts on the line of schedule.cuh.
struct TilePrefix {
  long long total, before;
};
template <class Cfg>
__device__ __forceinline__ TilePrefix tiles_before(const AttnccArgs& a, int seq, int lane) {
  using W = CtaWork<Cfg>;
  const int num_seqs = W::num_seqs(a);
  long long all = 0, before = 0;
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int s = s0 + lane;
    int n = s < num_seqs ? W::seq_tiles(a, s) : 0, b = s < seq ? n : 0;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      n += __shfl_xor_sync(0xffffffffu, n, d);
      b += __shfl_xor_sync(0xffffffffu, b, d);
    }
    all += n;
    before += b;
  }
  return {all, before};
}

// The start of part `part`'s walk, by warp 0 of the CTA: the total tile count and the first
// sequence with a piece in the part (schedule.cuh's first_seq_sequential, 32 sequences at a
// time with warp scans).
template <class Cfg>
__device__ PartWalk start_part_walk(const AttnccArgs& a, int part, int lane) {
  using W = CtaWork<Cfg>;
  const int num_seqs = W::num_seqs(a);
  const long long total = tiles_before<Cfg>(a, 0, lane).total;
  const long long begin = part_begin(part, total, a.num_parts);
  long long base = 0;
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int n = s0 + lane < num_seqs ? W::seq_tiles(a, s0 + lane) : 0;
    int incl = n;  // inclusive prefix within these 32 sequences
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += x;
    }
    const int excl = incl - n;
    const bool hit = s0 + lane < num_seqs && (base + excl >= begin || base + incl > begin);
    const unsigned found = __ballot_sync(0xffffffffu, hit);
    if (found) {
      const int l = __ffs(found) - 1;
      return PartWalk::start(part, a.num_parts, num_seqs, total, s0 + l, base + __shfl_sync(0xffffffffu, excl, l));
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  return PartWalk::start(part, a.num_parts, num_seqs, total, num_seqs, total);
}

// The block and thread index, read so that the compiler cannot keep them (or values derived
// from them) in registers from an earlier read, e.g. hoisted out of a part walk and kept live
// through every main loop.
__device__ __forceinline__ int fresh_ctaid() {
  int x;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(x));
  return x;
}
__device__ __forceinline__ int fresh_tid() {
  int x;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(x));
  return x;
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

// ------------------------------------------------------------------------------------------
// One CTA's work on one range of one sequence's KV tiles: the main loop and its epilogue.

template <class Cfg>
__device__ __forceinline__ void decode_tiles(const AttnccArgs& args, const CtaWork<Cfg>& w) {
  using T = DecodeTraits<Cfg>;
  static_assert(check_sources<Cfg>(), "source layout: see the constraints in decode.cuh");
  constexpr int M = T::kTileM, N = T::kTileN, S = T::kStages, MT = T::kMT, WR = T::kWarpRows;
  constexpr int kRowGroupThreads = T::kWarpsN * 32;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sbase = smem_addr(smem);
  const uint32_t q_tile = sbase + T::kQOff;
  const uint32_t kv_base = sbase + T::kKVOff;
  const uint32_t raw_base = sbase + T::kRawOff;
  const uint32_t p_tile = sbase + T::kPOff;
  int* const slot_ring = reinterpret_cast<int*>(smem + T::kSlotOff);
  float* const red = reinterpret_cast<float*>(smem + T::kRedOff);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  // The threads that copy KV tiles and keep their slots: all, or (ping_pong) row group 1.
  constexpr bool PP = T::kPingPong;
  const bool producer = !PP || wm == 1;
  const int ptid = PP ? tid - kRowGroupThreads : tid;  // index among the producers
  const int slot_tid = producer ? ptid : N;            // SlotPrefetch: tokens < N have a thread

  // ---- the work of this CTA (kept in shared memory for the epilogue)
  if (tid == 0) stash(smem + T::kWorkOff, w);
  const int s_q = args.s_q;
  const int kv_len = Cfg::kSparse ? Cfg::kTopK : __ldg(args.seqlens + w.b);
  const int last_row = min(w.rows_total, (w.mb + 1) * M) - 1;
  const int cta_limit = w.token_limit(w.row_token(last_row), kv_len, s_q);
  const int tile_begin = w.tile_begin;
  const int tile_end = min(w.tile_end, ceil_div(cta_limit, N));
  const int n_iter = max(tile_end - tile_begin, 0);
  const int head = w.head;

  SlotSource ss;
  ss.row = Cfg::kSparse ? args.indices + static_cast<long long>(w.seq) * Cfg::kTopK
                        : args.block_table + static_cast<long long>(w.b) * args.block_table_stride;
  ss.limit = cta_limit;

  // ---- prologue: slots of the first S tiles, Q, the first S-1 tiles
  SlotPrefetch<Cfg> pf;
#pragma unroll
  for (int i = 0; i < S; ++i) {
    pf.load(ss, tile_begin + i, slot_tid);
    pf.store(slot_ring + i * N, tile_begin + i, slot_tid);
  }
  pf.load(ss, tile_begin + S, slot_tid);
  __syncthreads();

  // Where the copies of relative tile i land: its stage of the staged tile (direct mode) or of
  // the raw rows (raw mode).
  auto copy_dst = [&](int i) {
    return T::kRaw ? raw_base + (i % S) * T::kRawTileBytes : kv_base + (i % S) * T::kKVTileBytes;
  };
  const char* q_any = static_cast<const char*>(args.q);
  issue_q<Cfg, typename T::QRows, T::kThreads>(
      q_tile,
      [&](int r) -> const char* {
        const int R = w.mb * M + r;
        if (R >= w.rows_total) return nullptr;
        const long long row = (static_cast<long long>(w.b) * s_q + w.row_token(R)) * Cfg::kHeadsQ + head * Cfg::kGroup + w.row_head(R);
        return q_any + row * Cfg::kDK * 2;
      },
      q_any, fresh_tid());  // a fresh read: its offsets are not hoisted out of a part walk
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < n_iter && producer) T::Copy::issue_all(args, copy_dst(i), slot_ring + i * N, head, ptid);
    cp_async_commit();
  }

  // ---- per-thread row state
  float o[MT][T::kNTO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < T::kNTO; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[mt][n][j] = 0.f;
  OnlineSoftmax<MT> sm;
  sm.init();
  int row_limit[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = w.mb * M + wm * WR + mt * 16 + (lane >> 2) + 8 * h;
      row_limit[mt][h] = R < w.rows_total ? w.token_limit(w.row_token(R), kv_len, s_q) : 0;
    }
  const float scale_log2 = args.softmax_scale * kLog2e;  // > 0 (the host checks)
  // Positions below full_limit are visible to every row of the CTA (the first row has the
  // smallest query token): tiles below it skip the mask.
  const int full_limit = w.token_limit(w.row_token(w.mb * M), kv_len, s_q);

  // ---- main loop over the split's KV tiles
  for (int it = 0; it < n_iter; ++it) {
    const int nx = it + S - 1;  // the tile copied in this step, into the stage step it - 1 used
    const bool copy_next = nx < n_iter;
    if (!PP || it == 0) {
      cp_async_wait<S - 2>();
      __syncthreads();  // A: tile it visible (ping_pong: tile 0 and Q); step it - 1 done
    } else if (!producer) {
      bar_sync(T::kFullBarrier0 + (it & 1), T::kThreads);  // FULL(it)
      if (copy_next) bar_arrive(T::kEmptyBarrier0 + ((it - 1) & 1), T::kThreads);  // EMPTY(it - 1)
    } else if (copy_next) {
      bar_sync(T::kEmptyBarrier0 + ((it - 1) & 1), T::kThreads);  // EMPTY(it - 1)
    }

    // the copies of tile nx and the slots of tile it + S (ping_pong: only while tiles are
    // copied, after EMPTY(it - 1) has ordered them after every reader of the slots overwritten)
    const uint32_t nx_dst = copy_dst(nx);
    const int* nx_slots = slot_ring + (nx % (S + 1)) * N;
    if (producer) {
      if constexpr (!T::kInterleaveCopies) {
        if (copy_next) T::Copy::issue_all(args, nx_dst, nx_slots, head, ptid);
        cp_async_commit();
      }
      if (!PP || it == 0 || copy_next) {
        pf.store(slot_ring + ((it + S) % (S + 1)) * N, tile_begin + it + S, slot_tid);
        pf.load(ss, tile_begin + it + S + 1, slot_tid);
      }
    }

    uint32_t kv_tile;
    if constexpr (T::kRaw) {
      dequant_tile<Cfg, typename T::KVRows, T::kThreads>(raw_base + (it % S) * T::kRawTileBytes, kv_base, tid);
      __syncthreads();
      kv_tile = kv_base;
    } else {
      kv_tile = kv_base + (it % S) * T::kKVTileBytes;
    }
    const int* slots = slot_ring + (it % (S + 1)) * N;
    const int pos0 = (tile_begin + it) * N;

    // S = Q K^T (qk_split: the pair's partial blocks, summed by pair_sum)
    typename T::Copy::Cursor nx_cursor;
    if constexpr (T::kInterleaveCopies) {
      if (producer) nx_cursor = T::Copy::cursor(args, nx_slots, head, ptid);
    }
    auto copy_part = [&](auto j) {
      if constexpr (T::kInterleaveCopies && decltype(j)::value < T::kCopySteps) {
        if (copy_next && producer) T::Copy::template issue<decltype(j)::value, T::kCopySteps>(args, nx_dst, nx_cursor, ptid);
      }
    };
    // ping_pong: the producer hands over tile it + 1 (FULL), once its copies have landed
    auto signal_full = [&] {
      if constexpr (PP) {
        if (producer && it + 1 < n_iter) {
          cp_async_wait<0>();  // tile it + 1, copied at the top of this step
          bar_arrive(T::kFullBarrier0 + ((it + 1) & 1), T::kThreads);  // FULL(it + 1); row group 1 sees it after B
        }
      }
    };
    float s[MT][T::kNTS][4];
    if constexpr (T::kQKSplit) {
      float sp[MT][T::kNTQK][4];
      zero(sp);
      qk_tile<Cfg>(sp, q_tile, kv_tile, wm, wn, lane, copy_part);
      const uint32_t xchg = p_tile + T::PRows::bytes(wm * WR);  // the row group's P rows
      pair_sum<Cfg>(s, sp, xchg + wn * T::kPairSlotBytes, xchg + (wn ^ 1) * T::kPairSlotBytes,
                    T::kPairBarrier0 + warp / 2, lane);
    } else {
      zero(s);
      qk_tile<Cfg>(s, q_tile, kv_tile, wm, wn, lane, copy_part);
    }
    if constexpr (T::kInterleaveCopies) cp_async_commit();
    signal_full();

    // mask (raw scores: the scale is folded into the softmax)
    const int col0 = wn * T::kTokPerWarp + 2 * (lane & 3);
    if (Cfg::kSparse || pos0 + N > full_limit) {  // warp-uniform: the CTA's last tiles, or sparse
      mask(s, [&](int mt, int h, int nt, int j) {
        const int col = col0 + nt * 8 + j;
        bool vis = pos0 + col < row_limit[mt][h];
        if constexpr (Cfg::kSparse) vis = vis && slots[col] >= 0;
        return vis;
      });
    }

    // row max across the row group
    float mx[MT][2];
    warp_row_max(s, mx);
    if constexpr (T::kWarpsN > 1) row_group_reduce<Cfg>(mx, red, wm, wn, lane, [](float a, float b) { return fmaxf(a, b); });  // B

    // P = exp2(S - m'), l, O rescale; P -> shared
    float alpha[MT][2];
    sm.update(s, mx, scale_log2, alpha);
    {
      // Once the running max settles, alpha is 1 for every row: skip the rescale of O.
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) moved = moved || alpha[mt][0] != 1.f || alpha[mt][1] != 1.f;
      if (__any_sync(0xffffffffu, moved)) rescale_rows(o, alpha);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNTS; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm * WR + mt * 16 + (lane >> 2) + 8 * h;
          sts32(p_tile + T::PRows::elem_offset(r, col0 + nt * 8), T::E::pack(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        }
    if constexpr (T::kWarpsN > 1) {
      row_group_sync(wm, kRowGroupThreads);  // C
    } else {
      __syncwarp();
    }

    // O += P V
    pv_tile<Cfg>(o, p_tile, kv_tile, wm, wn, lane);
  }
  cp_async_wait<0>();

  // ---- epilogue: total l across the row group, normalise, write
  float l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) l[mt][h] = quad_sum(sm.l[mt][h]);
  if constexpr (T::kWarpsN > 1) {
    __syncthreads();  // every warp is past its last read of `red`
    row_group_reduce<Cfg>(l, red, wm, wn, lane, [](float a, float b) { return a + b; });
  }

  // The CTA's work again, from shared memory (stashed before barrier A of step 0).
  const CtaWork<Cfg> we = unstash_work<Cfg>(smem + T::kWorkOff);
  const bool direct = we.slot < 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = we.mb * M + wm * WR + mt * 16 + (lane >> 2) + 8 * h;
      if (R >= we.rows_total) continue;
      const int t = we.row_token(R);
      const int hq = we.head * Cfg::kGroup + we.row_head(R);
      const float inv = l[mt][h] > 0.f ? 1.f / l[mt][h] : 0.f;
      const float lse = row_lse(sm.m[mt][h], l[mt][h]);
      const long long qrow = (static_cast<long long>(we.b) * s_q + t) * Cfg::kHeadsQ + hq;
      const int c0 = wn * T::kColsPerWarp + 2 * (lane & 3);
      if (direct) {
        auto* out = static_cast<typename T::E::T*>(args.out) + qrow * Cfg::kDV;
#pragma unroll
        for (int n = 0; n < T::kNTO; ++n)
          *reinterpret_cast<uint32_t*>(out + c0 + n * 8) = T::E::pack(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        if (wn == 0 && (lane & 3) == 0) args.lse[(static_cast<long long>(we.b) * Cfg::kHeadsQ + hq) * s_q + t] = lse;
      } else {
        const long long prow = we.partial_row(args, t, hq);
        float* out = args.partial_out + prow * Cfg::kDV;
#pragma unroll
        for (int n = 0; n < T::kNTO; ++n)
          *reinterpret_cast<float2*>(out + c0 + n * 8) = make_float2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        if (wn == 0 && (lane & 3) == 0) args.partial_lse[prow] = lse;
      }
    }
}

// ------------------------------------------------------------------------------------------
// The kernels. Split mode: one CTA per (lane, split, sequence), lane fastest, so the CTAs that
// share a sequence's KV tiles run together and share them in L2. Part mode (num_parts > 0): one
// CTA per (lane, part), the lanes of a part walking its pieces together (schedule.cuh). Two
// kernels, not one with a loop that split mode leaves after one pass: inside such a loop the
// main loop recomputed its copy offsets every step (MLA h_q 128: 991 -> 1066 instructions per
// KV step, H200: -5%; as its own kernel the part walk's main loop is 1002).

template <class Cfg>
__global__ void __launch_bounds__(DecodeTraits<Cfg>::kThreads, 1) decode_kernel(const __grid_constant__ AttnccArgs args) {
  decode_tiles<Cfg>(args, CtaWork<Cfg>::of_split(args, blockIdx.x));
}

template <class Cfg>
__global__ void __launch_bounds__(DecodeTraits<Cfg>::kThreads, 1) decode_parts_kernel(const __grid_constant__ AttnccArgs args) {
  using T = DecodeTraits<Cfg>;
  using W = CtaWork<Cfg>;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const walk = smem + T::kWorkOff + T::kWalkOffset;
  static_assert(9 * 4 <= T::kWalkOffset && 12 * 4 <= T::kWorkBytes - T::kWalkOffset, "work stash: 9 and 12 words");
  if (threadIdx.x < 32) {
    const PartWalk pw = start_part_walk<Cfg>(args, blockIdx.x / W::lanes(args.s_q), threadIdx.x);
    if (threadIdx.x == 0) stash(walk, pw);
  }
  __syncthreads();
  // Nothing is carried in registers from one piece to the next: the walk is in shared memory
  // and the block index is read afresh.
  for (;;) {
    const PartWalk pw = unstash_walk(walk);
    if (!pw.has_piece()) break;
    decode_tiles<Cfg>(args, W::of_piece(args, fresh_ctaid() % W::lanes(args.s_q), pw.piece(W::seq_tiles(args, pw.seq))));
    __syncthreads();  // every thread is past the piece's epilogue and its last shared read
    if (threadIdx.x == 0) {
      PartWalk next = unstash_walk(walk);
      next.next(W::seq_tiles(args, next.seq));
      stash(walk, next);
    }
    __syncthreads();
  }
}

// ------------------------------------------------------------------------------------------
// Host-side helpers for the launch (used by the generated attncc_launch).

template <class Cfg>
struct DecodeLaunch {
  using T = DecodeTraits<Cfg>;
  static constexpr int kThreads = T::kThreads;
  static constexpr int kSmemBytes = T::kSmemBytes;

  // Decode CTAs per (batch entry, split); the split-mode grid is batch * num_splits * this.
  static int ctas_per_split(int s_q) { return lanes(s_q) * (Cfg::kSparse ? s_q : 1); }
  static int lanes(int s_q) { return CtaWork<Cfg>::lanes(s_q); }
  static long long ctas(const AttnccArgs& a) {
    return a.num_parts > 0 ? 1LL * a.num_parts * lanes(a.s_q) : 1LL * a.batch * a.num_splits * ctas_per_split(a.s_q);
  }

  // cudaSuccess when the launch may go ahead (batch 0: nothing to do, pointers unchecked).
  static cudaError_t check(const AttnccArgs& a) {
    if (a.s_q < 1 || a.s_q > Cfg::kMaxSq || a.batch < 0 || a.num_splits < 1 || a.num_parts < 0) return cudaErrorInvalidValue;
    if (a.num_parts > 0 && a.num_splits != 1) return cudaErrorInvalidValue;
    if (a.batch == 0) return cudaSuccess;
    if (!a.q || !a.out || !a.lse) return cudaErrorInvalidValue;
    if (Cfg::kSparse ? !a.indices : (!a.block_table || !a.seqlens)) return cudaErrorInvalidValue;
    if ((a.num_splits > 1 || a.num_parts > 0) && (!a.partial_out || !a.partial_lse)) return cudaErrorInvalidValue;
    if (ctas(a) > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    return cudaSuccess;
  }
};

}  // namespace attncc
