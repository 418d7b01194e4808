// attncc/hopper/traits.cuh: the Hopper family's view of its plan.
//
// Every number here was chosen by the lowering (attncc/families/hopper.py) and arrives as a
// named constexpr of the generated Config; this header names what they define (the order a
// stage's boxes are loaded and read in, where each barrier lives) and static_asserts that the
// choices are legal for the kernel as written.
#pragma once

#include <cstdint>

#include "attncc/core/common.cuh"
#include "attncc/core/smem.cuh"

namespace attncc {
namespace hopper {

constexpr int kGroupThreads = 128;       // a warp group
constexpr int kBoxCols = 64;             // a 128B-swizzled box: 64 16-bit columns a row

// The source (run of the record) that fills staged box `box` (the lowering puts every source on
// whole boxes), -1 if none.
template <class Cfg>
__host__ __device__ constexpr int box_source(int box) {
  for (int i = 0; i < Cfg::kNumSources; ++i)
    if (Cfg::kSources[i].smem_col <= box * kBoxCols && box * kBoxCols < Cfg::kSources[i].smem_col + Cfg::kSources[i].width) return i;
  return -1;
}

template <class Cfg>
__host__ __device__ constexpr bool boxes_filled() {
  for (int b = 0; b < Cfg::kBoxes; ++b)
    if (box_source<Cfg>(b) < 0) return false;
  for (int i = 0; i < Cfg::kNumSources; ++i) {
    const Source& s = Cfg::kSources[i];
    if (s.smem_col % kBoxCols != 0 || s.width % kBoxCols != 0 || (s.dtype != Cfg::kElem && !is_fp8(s.dtype)) || !s.copies_fit() ||
        Cfg::kTokenStride[s.tensor] % 16 != 0)
      return false;
    // fp8 (produce.cuh: dequant_pair): pairs of boxes, a 16-value chunk in one scale group
    if (is_fp8(s.dtype) && (s.width % (2 * kBoxCols) != 0 || s.scale_group % 16 != 0 || (s.seg_lo % 16) != 0 || !s.has_scale()))
      return false;
  }
  return true;
}

// Whether some run of the record is fp8 (the producer dequantizes it).
template <class Cfg>
__host__ __device__ constexpr bool has_fp8() {
  for (int i = 0; i < Cfg::kNumSources; ++i)
    if (is_fp8(Cfg::kSources[i].dtype)) return true;
  return false;
}

// Whether no pair of fp8 boxes straddles the boundary of a stage's early and late groups
// (kEarly): the producer fills a pair at once.
template <class Cfg>
__host__ __device__ constexpr bool fp8_pairs_in_groups(int early) {
  for (int i = 0; i < Cfg::kNumSources; ++i) {
    const Source& s = Cfg::kSources[i];
    if (is_fp8(s.dtype) && s.smem_col < early * kBoxCols && early * kBoxCols < s.smem_col + s.width &&
        (early * kBoxCols - s.smem_col) % (2 * kBoxCols) != 0)
      return false;
  }
  return true;
}

// Whether the consumers fence box `box` to the async proxy after its FULL wait (tile.cuh: scores):
// only where its writer could not. An fp8 box is stored converted by the producer, which fences
// before it arrives (produce.cuh: convert_pair); a TMA plan's boxes land through the async proxy
// or, its rare cp.async tiles, are fenced by the producer (the plan's producer_fences, as a
// group-fenced fp8 plan's 16-bit boxes are: produce.cuh, TileTokens::lands_16bit); any other
// 16-bit box of a cp.async plan is counted on FULL when its copies land, with no thread of the
// producer between them and the consumers' wgmma.
// Crossover: none; the producer fences what it landed before it shares it (produce.cuh:
// share_group), and the peer's st.async bytes complete FULL's transactions (FlashMLA's consumers
// read them so; fencing every box measured 1.014 of this, bench/RESULTS.md session 33).
template <class Cfg>
__host__ __device__ constexpr bool consumer_fences(int box) {
  if (Cfg::kCrossover) return false;
  if (is_fp8(Cfg::kSources[box_source<Cfg>(box)].dtype)) return false;
  return !Cfg::kProducerFences;
}

// Whether box `box` is one the consumers fence whose FULL counts its group's copies: where every
// copy of the plan is a cp.async (no TMA box completing on its own), only the last fenced box of
// its group (early [0, kEarly), late [kEarly, kBoxes)), since the consumers wait for a group's
// fenced boxes together before their one fence (tile.cuh: scores_issue) and a producer thread's
// cp.async.mbarrier.arrive after the group's copies counts every copy it issued before: 128
// arrivals a group, not 128 a box (H100, same-process A/B, outputs bitwise equal: MLA page 1
// 0.988 s_q 1 / 0.991 s_q 2, page 8 0.982, GLA-2 page 1 1.002 / 0.990, MQA-256 page 1 0.994;
// bench/RESULTS.md, session 47). The producer arrives on, and the consumers wait for, these FULLs.
template <class Cfg>
__host__ __device__ constexpr bool fenced_full(int box) {
  if (!consumer_fences<Cfg>(box)) return false;
  if (Cfg::kTmaRows > 0) return true;
  const int end = box < Cfg::kEarlyBoxes ? Cfg::kEarlyBoxes : Cfg::kBoxes;
  for (int b = box + 1; b < end; ++b)
    if (consumer_fences<Cfg>(b)) return false;
  return true;
}

// Where a role is in its stream of tiles, across the pieces it walks: per stage the parity of
// the tiles it has held (bit s: the phase its barriers are in; a bit mask, not an array, which a
// runtime stage index would put on the stack) and the pairs so far (seesaw: pair i is in the
// stages of set i % kSets; the handoffs between the consumer warp groups complete once a pair)
// or the tiles so far (stacked: tile k in stage k % kStages).
template <int kStages>
struct Progress {
  static_assert(kStages <= 32, "a bit per stage");
  uint32_t phases = 0;
  int pairs = 0;  // seesaw: pairs of tiles so far
  int tiles = 0;  // stacked: tiles so far (tile k in stage k % kStages) ...
  int stage = 0;  // ... and the next tile's stage (kept, not divided out: the producer's registers)
  int pieces = 0;  // pieces so far (producer_q: Q_FULL's and Q_EMPTY's phases)
  __device__ __forceinline__ void next_tile() {
    ++tiles;
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  __device__ __forceinline__ int parity(int stage) const { return static_cast<int>(phases >> stage) & 1; }
  __device__ __forceinline__ void used(int stage) { phases ^= 1u << stage; }
};

// The plan as the schedules read it: the seesaw and the relay (seesaw.cuh, relay.cuh: 64 rows,
// each consumer warp group half of the output) and the stacked schedule (stacked.cuh: 128 rows, each group 64 of them, or
// 64 rows and alternate tiles, and the whole output).
template <class Cfg>
struct HopperTraits {
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr bool kSeesaw = Cfg::kSeesaw;
  static constexpr int kM = Cfg::kTileM, kN = Cfg::kTileN, kStages = Cfg::kStages;
  static constexpr int kGroupRows = 64;                 // a consumer warp group's wgmma M
  static constexpr int kSets = kStages / 2;  // seesaw: pair i of tiles is in stages 2 (i % kSets) and 2 (i % kSets) + 1
  static constexpr int kBoxes = Cfg::kBoxes;            // of a staged row
  static constexpr int kKeyBoxes = Cfg::kKeyBoxes;      // the key's (its runs', Cfg::kKeyRuns: a Q row's boxes)
  static constexpr int kValueBox = Cfg::kValueBox;      // the value's: boxes [kValueBox, kValueBox + kValueBoxes)
  static constexpr int kValueBoxes = Cfg::kValueBoxes;
  static constexpr int kOut = Cfg::kOutBoxes;           // of a consumer warp group's output
  static constexpr int kEarly = Cfg::kEarlyBoxes;       // of a stage's early group
  static constexpr int kPBox = Cfg::kPBox;              // seesaw: the key-only box that holds the stage's P
  // Box b of a stage: its first column in a Q row where it is the key's (the key's runs in order,
  // each of whole boxes), else -1; S = Q K^T reads the key's boxes in the stage's order, from
  // the first of them.
  __host__ __device__ static constexpr int q_col_of_box(int b) {
    int at = 0;
    for (int i = 0; i < Cfg::kNumKeyRuns; ++i) {
      if (b * kBoxCols >= Cfg::kKeyRuns[i].col && b * kBoxCols < Cfg::kKeyRuns[i].col + Cfg::kKeyRuns[i].width)
        return at + b * kBoxCols - Cfg::kKeyRuns[i].col;
      at += Cfg::kKeyRuns[i].width;
    }
    return -1;
  }
  __host__ __device__ static constexpr int first_key_box() {
    for (int b = 0; b < kBoxes; ++b)
      if (q_col_of_box(b) >= 0) return b;
    return -1;
  }
  __host__ __device__ static constexpr bool key_runs_on_boxes() {
    int width = 0;
    for (int i = 0; i < Cfg::kNumKeyRuns; ++i) {
      if (Cfg::kKeyRuns[i].col % kBoxCols || Cfg::kKeyRuns[i].width % kBoxCols || Cfg::kKeyRuns[i].col + Cfg::kKeyRuns[i].width > kBoxes * kBoxCols)
        return false;
      width += Cfg::kKeyRuns[i].width;
    }
    return width == Cfg::kDK;
  }
  static constexpr int kBoxBytes = Cfg::kBoxBytes;      // a box of a KV tile (kN rows)
  static constexpr int kQBoxBytes = Cfg::kQBoxBytes;    // a box of the Q tile (kM rows)
  static constexpr int kKVTileBytes = Cfg::kKVTileBytes;
  static constexpr int kOutCols = kOut * kBoxCols;      // output columns per consumer warp group
  static constexpr int kAcc = kOutCols / 2;             // its accumulator registers (64 x N fp32 / 128)

  // A stage's boxes are loaded and read in order; boxes [0, kEarly) are its early group (EMPTY
  // early; seesaw: the value's left half, which WG0 reads last; stacked: all), the rest its late
  // group (EMPTY late). Box b of stage s, in shared memory:
  __device__ static uint32_t stage_box(uint32_t base, int s, int b) { return base + Cfg::kKVOff + s * kKVTileBytes + b * kBoxBytes; }
  // Stage s's flags (produce.cuh: a byte per token, then a word per producer warp), in bytes
  // from the base of shared memory.
  __device__ static int stage_flags(int s) { return Cfg::kFlagsOff + s * Cfg::kFlagsPitch; }

  // mbarriers (8 bytes each) from kBarOff: FULL[stage][box], EMPTY early[stage], EMPTY
  // late[stage], FLAGS[stage], then the consumer warp groups' handoffs (seesaw.cuh; the relay
  // uses P_A and P_B), each
  // completing once per pair of tiles when the 128 threads of the handing group have arrived.
  static constexpr int kBarOff = Cfg::kBarOff;
  __device__ static uint32_t full(uint32_t base, int stage, int box) { return base + kBarOff + 8 * (stage * kBoxes + box); }
  __device__ static uint32_t empty_early(uint32_t base, int stage) { return base + kBarOff + 8 * (kStages * kBoxes + stage); }
  __device__ static uint32_t empty_late(uint32_t base, int stage) { return base + kBarOff + 8 * (kStages * kBoxes + kStages + stage); }
  __device__ static uint32_t flags_bar(uint32_t base, int stage) { return base + kBarOff + 8 * (kStages * kBoxes + 2 * kStages + stage); }
  static constexpr int kHandoffs = kStages * kBoxes + 3 * kStages;  // the first of them
  __device__ static uint32_t max_a(uint32_t base) { return base + kBarOff + 8 * kHandoffs; }
  __device__ static uint32_t p_b(uint32_t base) { return base + kBarOff + 8 * (kHandoffs + 1); }
  __device__ static uint32_t p_a(uint32_t base) { return base + kBarOff + 8 * (kHandoffs + 2); }
  // producer_q (kernel.cuh): a piece's Q rows landed (the producer's 128 threads' cp.async), and
  // the consumers past the last S = Q K^T of the piece before (both groups' 256 threads)
  __device__ static uint32_t q_full(uint32_t base) { return base + kBarOff + 8 * (kHandoffs + 3); }
  __device__ static uint32_t q_empty(uint32_t base) { return base + kBarOff + 8 * (kHandoffs + 4); }
  // crossover (a 2-CTA cluster, produce.cuh): no barrier of its own (EMPTY counts both CTAs' consumers)
  static constexpr bool kCrossover = Cfg::kCrossover;
  static constexpr int kClusterCtas = kCrossover ? 2 : 1;  // a cluster: the pair of row blocks
  static constexpr int kNumBarriers = kHandoffs + 5;

  static_assert(Cfg::kElem == Dtype::kBF16, "bf16 records (wgmma .bf16)");
  static_assert(Cfg::kTmaRows == 0 ||
                    (!Cfg::kSparse && ((Cfg::kTmaRows == kN && Cfg::kPageSize % kN == 0) ||
                                       (Cfg::kTmaRows == Cfg::kPageSize && kN % Cfg::kPageSize == 0 && Cfg::kPageSize % 8 == 0))),
                "a TMA copy of a box: a tile of one page, or of whole pages of a multiple of 8 tokens (dense)");
  static_assert(!Cfg::kSpreadCopies || Cfg::kTmaRows == kN, "spread_copies: a one-page TMA tile's copies");
  static_assert(kStages >= 2 && (!kSeesaw || kStages % 2 == 0), "the seesaw: pairs of tiles, a pair in two stages");
  static_assert(!Cfg::kRelay || (kSeesaw && kSets == 1 && !Cfg::kCrossover && !Cfg::kValueFirst),
                "relay: the seesaw's tiles and halves, one set of stages, no crossover (hopper.py; crossover with "
                "the relay measured 1.02 of crossover alone, bench/RESULTS.md session 33)");
  static_assert(!Cfg::kSkipUnmoved || (kSeesaw && !Cfg::kRelay), "skip_unmoved: the seesaw's consumers (seesaw.cuh)");
  static_assert(kM == (kSeesaw ? 1 : 2) * kGroupRows && kN == 64,
                "seesaw 64 rows (one wgmma M), stacked 128 (one per consumer warp group) x 64 tokens (a P tile is one box)");
  static_assert(kThreads == 3 * kGroupThreads, "two consumer warp groups and a producer");
  static_assert(Cfg::kDK == kKeyBoxes * kBoxCols && Cfg::kDV == kValueBoxes * kBoxCols && kValueBoxes == (kSeesaw ? 2 : 1) * kOut &&
                    kValueBox + kValueBoxes <= kBoxes && Cfg::kStagedWidth == kBoxes * kBoxCols &&
                    (kOutCols == 64 || kOutCols == 128 || kOutCols == 256),
                "key and value of whole staged boxes; a warp group's output (seesaw: half the value; stacked: all) of 64, 128 "
                "or 256 columns (a wgmma N)");
  static_assert(kEarly == (kSeesaw ? kOut : kBoxes), "EMPTY early: seesaw the value's left half, stacked the whole stage");
  static_assert(key_runs_on_boxes() && Cfg::kNumValueRuns == 1 && Cfg::kValueRuns[0].col == kValueBox * kBoxCols &&
                    Cfg::kValueRuns[0].width == Cfg::kDV,
                "the key: runs of whole staged boxes; the value: one run of them");
  static_assert(!kSeesaw || (Cfg::kNumKeyRuns == 1 && Cfg::kKeyRuns[0].col == 0 && kValueBox == 0 && kKeyBoxes == kBoxes &&
                             kPBox >= kValueBoxes && kPBox < kBoxes),
                "the seesaw: key = all staged columns, value = the first d_v, P in a key-only box");
  static_assert(boxes_filled<Cfg>(), "every box filled by one source (16-bit, or fp8 in pairs of boxes), 16-byte aligned");
  static_assert(fp8_pairs_in_groups<Cfg>(kEarly), "an fp8 box pair in one group of a stage's boxes");
  static_assert(kBoxBytes == kN * 128 && kQBoxBytes == kM * 128 && kKVTileBytes == kBoxes * kBoxBytes, "boxes of 128-byte rows");
  static_assert(!kSeesaw || kBoxBytes == kQBoxBytes, "seesaw: a P tile (64 rows) is a box of the stage");
  static_assert(Cfg::kQOff % 1024 == 0 && Cfg::kKVOff % 1024 == 0 && kBoxBytes % 1024 == 0, "swizzle atoms 1024-aligned");
  static_assert(Cfg::kQBytes >= kKeyBoxes * kQBoxBytes && Cfg::kKVOff >= Cfg::kQOff + Cfg::kQBytes && kBarOff >= Cfg::kKVOff + kStages * kKVTileBytes && kBarOff % 8 == 0 &&
                    Cfg::kFlagsOff >= kBarOff + 8 * kNumBarriers && Cfg::kFlagsOff % 16 == 0 && Cfg::kFlagsPitch >= kN + 16 && Cfg::kFlagsPitch % 16 == 0 &&
                    Cfg::kRowsOff >= Cfg::kFlagsOff + kStages * Cfg::kFlagsPitch && Cfg::kRowsOff % 16 == 0 &&
                    Cfg::kWorkOff >= Cfg::kRowsOff + 5 * kGroupRows * 4 && Cfg::kWalkCOff >= Cfg::kWorkOff + 9 * 4 &&
                    Cfg::kWholeOff >= Cfg::kWalkCOff + 12 * 4 && Cfg::kWalkPOff >= Cfg::kWholeOff + 4 && Cfg::kScalesOff >= Cfg::kWalkPOff + 12 * 4 && Cfg::kScalesOff % 16 == 0 &&
                    Cfg::kSmemBytes >= Cfg::kScalesOff + kStages * kN * Cfg::kScaleRecordBytes,
                "shared-memory plan: disjoint regions in order");
  static_assert(!Cfg::kProducerFences || !Cfg::kCrossover, "crossover: the producer fences what it shares, the consumers nothing");
  static_assert(Cfg::kScaleRecordBytes == 0 || Cfg::kScaleRecordBytes == 16, "scale records: 4 fp32 a token (hopper.py)");
  static_assert(Cfg::kSmemBytes <= kSmemLimitBytes, "shared memory exceeds 227 KB");
  // setmaxnreg trades within the registers the CTA was launched with: an increase past them waits forever
  static_assert(kGroupThreads * (Cfg::kConsumerRegisters + Cfg::kWg1Registers + Cfg::kProducerRegisters) <= Cfg::kRegisters * kThreads &&
                    Cfg::kConsumerRegisters % 8 == 0 && Cfg::kWg1Registers % 8 == 0 && Cfg::kProducerRegisters % 8 == 0 &&
                    Cfg::kProducerRegisters >= 24 && Cfg::kConsumerRegisters <= 256 && Cfg::kRegisters * kThreads <= 65536 &&
                    (Cfg::kRelay || Cfg::kWg1Registers == Cfg::kConsumerRegisters),
                "setmaxnreg budgets fit the register file");
  // crossover: the CTAs of a cluster are row blocks 2i and 2i + 1 of one kv head (the lane's
  // fastest index, core/work.cuh), which read the same tokens: the pair's rows are one query
  // token's (rows_total, a multiple of the group, splits into whole pairs), so the two see the
  // same causal limit, tiles and slots. Each dequantizes half of every tile's fp8 tokens.
  static_assert(!kCrossover || (has_fp8<Cfg>() && Cfg::kTmaRows == 0 && Cfg::kGroup % (2 * kM) == 0 && kN % 32 == 0 && kSeesaw &&
                                 !is_fp8(Cfg::kSources[box_source<Cfg>(kPBox)].dtype)),
                "crossover: fp8 runs by the producer (no TMA), a group of whole pairs of row blocks, the seesaw with a "
                "16-bit P box");
  static_assert(Cfg::kBarriers <= 16 && Cfg::kConsumerBarrier >= 1 && Cfg::kProducerBarrier >= 1 &&
                    Cfg::kConsumerBarrier < Cfg::kBarriers && Cfg::kProducerBarrier < Cfg::kBarriers,
                "named barriers: 1 .. 15");
};

}  // namespace hopper
}  // namespace attncc
