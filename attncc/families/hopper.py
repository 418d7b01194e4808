"""The Hopper family (sm_90a): warp-specialized wgmma with the seesaw schedule
(templates/include/attncc/hopper/). Its kernel, per CTA of 64 query rows of one kv head:

    producer warp group (setmaxnreg down): per KV tile, by TMA where a tile is one run of a
        page (page % 64 == 0), else by cp.async with its tokens' slots (page table) and
        validity, the staged record into 64-column 128B-swizzled boxes, one mbarrier per box
        (FULL), so that S = Q K^T starts on the first box while the others land
    consumer warp groups 0 and 1 (setmaxnreg up), tiles in pairs (a and b, in the two stages of
    a set; two sets where shared memory holds them, so the next pair lands while one is read):
        WG0: S_a = Q K_a^T; max -> m_a; P_a -> shared; O_L = O_L c_a + P_a V_a[:, :256] (SS, RS)
        WG1: S_b = Q K_b^T; max with m_a -> m_b; P_b -> shared; O_R = O_R c_a + P_a V_a[:, 256:]
        WG0: O_L = O_L c_b + P_b V_b[:, :256]                                       (wgmma SS)
        WG1: O_R = O_R c_b + P_b V_b[:, 256:]                                       (wgmma RS)

so each warp group owns half of the output (MLA's 512: 64 x 256 fp32, 128 registers a thread),
no product is computed twice and one group's softmax overlaps the other's products.
Where the producer's fp8 conversion sets the pace, the relay (relay.cuh, FlashMLA's sparse fp8
division of the work) takes the seesaw's place: the same halves, but WG0 alone computes S, the
softmax and O_L and hands P (and its rescale) to WG1 through the stage's P box, so WG1 holds
only O_R and the producer gets 152 registers (192 / 160 / 152 by per-group setmaxnreg). Stage a is
free in the middle of a pair (both groups read tile a first), so it refills while stage b is
read; each stage is released in two halves (EMPTY early/late) as its readers finish. P of each
tile goes to the first key-only box of its own stage (the rope columns, read only by S = Q K^T).

This module makes every choice of that kernel and says why; the C++ only static_asserts them.
A value of at most 256 columns (GLA's latent) fits one warp group's accumulators whole (64 x 256
fp32: 128 registers a thread), and the seesaw's point, one output split over two groups, goes:
there the family runs the stacked schedule instead (stacked.cuh), FA3's for such values: a CTA
of 128 rows, each consumer warp group S, softmax and O += P V (P from registers) for its own 64
over every tile, so each token is read once for 128 rows (GLA-2 at s_q 2: both query tokens of
a kv head's 64 heads). Where a CTA holds 64 rows or fewer (s_q 1), the groups take the same rows
and alternate tiles, and merge (O, m, l) at the end; `seesaw` keeps the seesaw. In rows mode
where the producer copies one-page TMA tiles of 16-bit records (40 registers are enough), the
groups take 232 and overlap each its own softmax with its products (`overlap`, FA3's order:
S_{i+1} = Q K_{i+1}^T and O += P_i V_i issued together, the softmax of i + 1 under P_i V_i).

Sparse top-k plans read each tile's slots from the query token's indices; fp8 runs are
dequantized by the producer warp group itself (the raw bytes and scales of a group of box pairs
by cp.async into the stage, then core/dequant.cuh's exact conversion in place, into the
swizzled boxes; both groups of a stage in flight before either is converted, one round trip
to memory a stage); both go by cp.async, not TMA.
`crossover` runs the CTAs in clusters of two, row blocks 2i and 2i + 1 of a kv head, which read
the same tokens: each producer converts half of every tile's fp8 tokens and stores each chunk
it converts (or copies) into the peer's stage too (distributed shared memory, st.async), so each
value is converted once per cluster (hopper/cluster.cuh, produce.cuh). Applied where written,
never chosen: on the H200 it has measured slower than each CTA converting its own tiles (1.11-
1.18x the time, bench/RESULTS.md sessions 19 and 22: the remote stores cost about what the
halved conversion saves, and with a stage pair each producer then also waits for the other
CTA's consumers). It needs fp8
runs, the seesaw's 64-row CTAs and a group of a multiple of 128 query heads (a pair of row
blocks is then one query token's: the same causal limit); a knob it cannot apply is a
positioned error. What the family does not
(yet) run it refuses, and the lowering falls back to mma_sync."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import DTYPES, Spec
from ..layout import Layout
from ..target import Target
from .base import (DEPENDENT_LAUNCH_WHY, WALK_OFFSET, WHOLE_OFFSET, WHOLE_PARTS_WHY, Family, KernelConfig, Refusal,
                   combine_blocks, misaligned, piece_cost, ready_words, whole_slack)

BOX_COLS = 64          # a 128B-swizzled box: 64 16-bit columns (128 bytes) a row
TILE_M = 64            # query rows of a CTA (seesaw): one wgmma M, shared by both consumer warp groups
STACKED_TILE_M = 128   # ... (stacked): one wgmma M per consumer warp group
STACKED_MAX_COLS = 256  # the widest value one warp group holds (64 x 256 fp32: 128 registers a thread)
TILE_N = 64            # tokens of a KV tile (a P tile is then one box)
VALUE_FIRST_ROWS = 2 * TILE_M  # the 16-bit cp.async seesaw: calls of at most two row blocks a kv head take
                               # the value-first form (two CTAs read each token: the producer sets the pace)
TMA_MAX_PAGES = 4      # pages of a TMA tile (page 16 or 32): the seesaw's producer holds the page numbers of
                       # four tiles (at page 8, eight a tile, the part kernels spilled 8-32 bytes, ptxas)
PAIR_STAGES = 2        # a pair of tiles, the seesaw's unit, in two stages
MAX_SETS = 2           # sets of a pair's stages in flight where shared memory holds them
MAX_STACKED_STAGES = 4  # stacked: tiles in flight where shared memory holds them
HALF_COLS = (64, 128, 256)  # output columns a consumer warp group may own (a wgmma N of whole boxes)
GROUP_THREADS = 128    # a warp group
# setmaxnreg moves registers between the roles inside what the CTA was launched with (168 x 384 =
# 64,512: an increase past that waits forever), so 2 x 128 x consumer + 128 x producer <= 64,512
CONSUMER_REGISTERS = 216  # seesaw: 2 x 128 x 216 + 128 x 72 = 64,512
PRODUCER_REGISTERS = 72
RELAY_REGISTERS = (192, 160, 152)  # relay: WG0 (O_L, S, softmax), WG1 (O_R), producer: 128 x 504 = 64,512
STACKED_CONSUMER_REGISTERS = 224  # stacked: 2 x 128 x 224 + 128 x 56 = 64,512 (at 216 its part-mode
STACKED_PRODUCER_REGISTERS = 56   # kernels spill 4-8 bytes; its producer, one stage a tile, fits 56)
STACKED_OVERLAP_REGISTERS = (232, 232, 40)  # stacked with the overlap: 2 x 128 x 232 + 128 x 40 = 64,512 (its
                                            # parts kernels spilled 28 bytes at 224; a producer of one-page TMA
                                            # tiles fits 40)
NARROW_OVERLAP_REGISTERS = (216, 216, 72)   # ... where the value is at most NARROW_VALUE_COLS wide (O 64 registers a
                                            # thread): the producer of cp.async tiles from two per-head runs at page 5
                                            # spilled 8 bytes at 40 (ptxas, gqa_g64_page5)
NARROW_VALUE_COLS = 128
WORK_BYTES = 256       # the work stash (base.py: CtaWork, the consumers' walk, the whole word), then the
PRODUCER_WALK_OFFSET = 128  # producer's part walk (12 ints) here
BARRIER_BYTES = 8      # an mbarrier
HANDOFFS = 5           # MAX_A, P_B, P_A: the seesaw's exchanges between its warp groups; Q_FULL, Q_EMPTY (producer_q)
SCALE_RECORD_BYTES = 16  # a token's scales of its fp8 run (4 fp32), one copy a tile into the stage's records


def fences_groups(fp8: bool, *, crossover: bool, relay: bool, seesaw: bool) -> bool:
    """The plan's group_fence: the producer converts a group's fp8 pairs, then fences once. Not
    for crossover (a pair's FULLs count its peer stores), nor the seesaw's producer (72
    registers: it spilled holding a group). Also what a plan forced into another schedule
    (tests/test_gpu.py) takes."""
    return fp8 and not crossover and (relay or not seesaw)


def skips_unmoved(*, seesaw: bool, relay: bool) -> bool:
    """The plan's skip_unmoved: the seesaw's consumers skip a warp's unmoved rescales of O (the
    relay's spilled with the vote; the stacked groups' measured slower where they fit it). Also what
    a forced schedule takes."""
    return seesaw and not relay


def fences_in_producer(*, tma_rows: int, group_fence: bool, crossover: bool) -> bool:
    """The plan's producer_fences: a TMA plan's rare cp.async tiles, and a group-fenced fp8 plan's
    16-bit boxes (they ride the group's fence); not crossover (its producer fences what it
    shares). Also what a forced schedule takes."""
    return (tma_rows > 0 or group_fence) and not crossover


@dataclass(frozen=True, kw_only=True)
class HopperConfig(KernelConfig):
    seesaw: bool              # two consumer warp groups split the output's columns (else stacked:
                              # each owns 64 rows, or alternate tiles of the same rows)
    crossover: bool           # clusters of two CTAs (row blocks 2i, 2i + 1) sharing the fp8 conversion
    value_first: bool         # seesaw: WG1 takes O_R += P_a V_a before S_b (stage a free before b lands)
    value_first_rows: int     # seesaw, value_first off: the kernels' value-first form too, which a call takes
                              # where a kv head has at most this many query rows (s_q x group); 0: none
    relay: bool               # the seesaw's halves, but WG0 alone computes S and hands P to WG1 (relay.cuh)
    skip_unmoved: bool        # seesaw (not relay): a warp skips a rescale of O where none of its rows moved its
                              # max (every c = 1, so the same bits), by a vote
    slots_ahead: bool         # the producer loads the next tile's page numbers / indices a tile ahead
    group_fence: bool         # fp8 conversion: a group's pairs fenced once, then their FULLs (else a pair at a time)
    consumer_registers: int   # setmaxnreg of the consumer warp groups (relay: of WG0) ...
    wg1_registers: int        # ... relay: of WG1 (else consumer_registers)
    producer_registers: int   # ... and of the producer
    tma_rows: int             # tokens of one TMA copy of a box (tile_n: a tile of one page); 0: cp.async
    producer_fences: bool     # the producer waits for its cp.async 16-bit boxes, fences them and arrives on their
                              # FULLs (else cp.async.mbarrier.arrive, and the consumers fence after FULL)
    spread_copies: bool       # a one-page TMA tile's box copies issued by the producer's four warps in turn (box b
                              # by lane 0 of warp b % 4), not all by thread 0
    overlap: bool             # stacked, rows mode: a group issues tile i + 1's S = Q K^T before tile i's softmax
    producer_q: bool          # seesaw: the producer copies a part's later pieces' Q rows (Q_FULL) once the consumers
                              # are past the piece before's last S (Q_EMPTY), under its last products and epilogue
    q_tma: bool               # the Q tile by TMA (one thread, a copy a 64-column box, counted on Q_FULL), not cp.async
    q_tma_heads: int          # ... a box of the CTA's rows: this many heads of the group (0: its rows are not one
    q_tma_tokens: int         # ... box of q) by this many query tokens
    boxes: int                # 64-column boxes of a staged token row
    key_boxes: int            # ... the key's, of its runs in order (= the boxes of a Q row; the seesaw: all)
    value_box: int            # ... the value's first (the seesaw: 0), and
    value_boxes: int          # ... how many
    out_boxes: int            # ... of a consumer warp group's output (seesaw: half the value; stacked: all)
    early_boxes: int          # a stage's first boxes, released by EMPTY early (seesaw: WG0's half of
                              # the value; stacked: all), the rest by EMPTY late
    p_box: int                # the key-only box of a stage that holds that tile's P (seesaw; stacked -1)
    box_bytes: int            # one box of a tile: tile_n rows x 128 bytes
    q_box_bytes: int          # one box of the Q tile: tile_m rows x 128 bytes
    q_bytes: int              # the Q tile's region (stacked: or the split mode's exchange, where larger)
    kv_tile_bytes: int
    q_off: int                # shared-memory regions, bytes from the base (1024-aligned tiles)
    kv_off: int
    bar_off: int              # mbarriers: FULL[stage][box], EMPTY early/late[stage], FLAGS[stage],
                              # then the consumers' handoffs MAX_A, P_B, P_A
    flags_off: int            # per stage: tile_n bytes (token without a slot), then 4 words (any)
    flags_pitch: int
    rows_off: int             # row state: m, c_a, c_b, l of each warp group (floats per row)
    work_off: int             # the consumers' CtaWork, then the part walks
    walk_c_off: int
    whole_off: int            # after the consumers' walk: whether the parts hold whole sequences
    walk_p_off: int
    scale_record_bytes: int   # a token's scales of the fp8 run, one 16-byte copy a tile (0: a
                              # 4-byte copy a token and box pair, into the pair's first box)
    scales_off: int           # ... the records: per stage, tile_n of them
    consumer_barrier: int     # named barriers: both consumer warp groups
    producer_barrier: int     # ... the producer warp group
    barriers: int


class HopperFamily(Family):
    name = "hopper"
    summary = "sm_90a warp-specialized wgmma, seesaw, relay or stacked schedule"
    targets = ("sm90a",)
    honours = frozenset({"tile", "stages", "seesaw", "crossover"})
    tolerates = frozenset()
    limits = ("value 64, 128 or 256 wide (stacked) or 128, 256 or 512 (the seesaw's two halves), one run of "
              "64-column boxes; key runs of whole boxes (the seesaw: key = value ++ more)", "bf16 queries; 16-bit runs, or fp8 runs of whole 128-value box pairs with scale groups of multiples of 16, from one packed record tensor",
              f"a group of >= {TILE_M} query heads (one 64-row wgmma tile at s_q 1)",
              f"tile q = {TILE_M} (seesaw) or {STACKED_TILE_M} (stacked), kv = {TILE_N}; the seesaw's stages a "
              f"multiple of {PAIR_STAGES} (pairs of tiles)")

    def _check(self, spec: Spec, layout: Layout) -> None:
        sched = spec.schedule
        if spec.elem.name != "bf16":
            raise Refusal(f"runs bf16 records; this one is {spec.elem.name}", spec.span_of("cache"))
        if self._seesaw(spec) and (spec.d_v % 2 or spec.d_v // 2 not in HALF_COLS):
            raise Refusal(f"the seesaw splits the value into two halves of {', '.join(map(str, HALF_COLS))} "
                          f"columns (a wgmma N of whole boxes); this value is {spec.d_v} wide",
                          spec.span_of("value"))
        if not self._seesaw(spec) and spec.d_v not in HALF_COLS:
            raise Refusal(f"the stacked schedule holds a value of {', '.join(map(str, HALF_COLS))} columns "
                          f"(a wgmma N of whole boxes) in one warp group; this value is {spec.d_v} wide",
                          spec.span_of("value"))
        if len(layout.value_runs) != 1:
            raise Refusal(f"needs the value to be one run of staged columns (the B operand of O += P V); this one is "
                          f"{len(layout.value_runs)} runs", spec.span_of("value"))
        if off := [f"{w} from staged column {c}" for c, w in layout.key_runs if c % BOX_COLS or w % BOX_COLS]:
            raise Refusal(f"needs a key of whole {BOX_COLS}-column boxes; it has a run of {off[0]}", spec.span_of("key"))
        (key_col, _), (value_col, _) = layout.key_runs[0], layout.value_runs[0]
        if value_col % BOX_COLS:
            raise Refusal(f"needs a value of whole {BOX_COLS}-column boxes; it starts at staged column {value_col}",
                          spec.span_of("value"))
        if self._seesaw(spec) and (len(layout.key_runs), key_col, value_col) != (1, 0, 0):
            raise Refusal("the seesaw needs the value to be the first staged columns and the key all of "
                          "them (key = value ++ more: P goes in a key-only box); the stacked schedule "
                          f"(a value of at most {STACKED_MAX_COLS} columns) takes separate ones", spec.span_of("key"))
        if self._seesaw(spec) and spec.d_k <= spec.d_v:
            raise Refusal(f"the seesaw needs a key of whole {BOX_COLS}-column boxes wider than the value "
                          f"(P goes in a key-only box); it is {spec.d_k}", spec.span_of("key"))
        for src in layout.sources:
            if src.smem_col % BOX_COLS or src.width % BOX_COLS:
                raise Refusal(f"segment `{src.segment}`: every piece of the staged row must "
                              f"fill whole {BOX_COLS}-column boxes", spec.segment(src.segment).span)
            if off := misaligned(spec, layout, src):
                raise Refusal(off, spec.segment(src.segment).span)
            if DTYPES[src.dtype].is_fp8 and src.width % (2 * BOX_COLS):
                raise Refusal(f"segment `{src.segment}`: the producer dequantizes fp8 in pairs of "
                              f"{BOX_COLS}-column boxes (128 values a token); this run is {src.width} wide",
                              spec.segment(src.segment).span)
            if DTYPES[src.dtype].is_fp8 and (src.scale is None or src.scale.group % 16 or src.seg_lo % 16):
                raise Refusal(f"segment `{src.segment}`: fp8 needs a scale group of a multiple of 16 "
                              "values (a thread's 16-byte chunk in one group)", spec.segment(src.segment).span)
        for t in layout.tensors:
            if t.token_stride_bytes % 16:
                raise Refusal(f"cache tensor `{t.name}`: {t.token_stride_bytes} bytes per token, "
                              "not a multiple of 16", spec.span_of("cache"))
        if spec.group < TILE_M:
            raise Refusal(f"a group of {spec.group} query heads would fill {spec.group} of the "
                          f"{TILE_M} rows of a wgmma tile at s_q 1: memory-bound, the mma_sync "
                          "family's narrower tiles stream it as fast", spec.span_of("heads"))
        if layout.fp8 and len(layout.tensors) > 1:
            # (the producer keeps a 64-bit offset a token and tensor: with the fp8 conversion a
            # separate cache of latent, scales and rope spilled 80-232 bytes, ptxas, sm_90a)
            raise Refusal(f"its producer dequantizes fp8 from one packed record tensor; this cache is "
                          f"{len(layout.tensors)} tensors ({', '.join(t.name for t in layout.tensors)}): "
                          "its token offsets leave the producer too few registers", spec.span_of("cache"))
        if spec.sparse and len(layout.tensors) > 1 and spec.group == TILE_M and spec.page_size > 1:
            # (ptxas, sm_90a: the any-stride part kernel of sparse bf16 MLA from a separate latent
            # and rope spilled 16 bytes at h_q 64, pages 3 and 64, s_q 1 to 3, in every
            # arrangement of the roles' registers tried (208 / 88: 84 bytes; 224 / 56: 64), though
            # neither role spills alone; groups of 96 to 256 and page 1 build)
            raise Refusal(f"sparse top-k from {len(layout.tensors)} cache tensors at page {spec.page_size} "
                          f"with a group of {TILE_M} query heads: its part kernels spill (ptxas)",
                          spec.span_of("cache"))
        if sched.tile_q is not None and (sched.tile_q, sched.tile_kv) != (self._tile_m(spec), TILE_N):
            raise Refusal(f"`tile q = {sched.tile_q}, kv = {sched.tile_kv}`: the "
                          f"{'seesaw' if self._seesaw(spec) else 'stacked schedule'} runs "
                          f"{self._tile_m(spec)} x {TILE_N}", sched.span_of("tile"), "tile")
        if sched.crossover:
            self._check_crossover(spec, layout)
        if self._seesaw(spec) and sched.stages is not None and sched.stages % PAIR_STAGES:
            raise Refusal(f"`stages {sched.stages}`: the seesaw keeps pairs of tiles in sets of "
                          f"{PAIR_STAGES} stages", sched.span_of("stages"), "stages")

    @classmethod
    def _check_crossover(cls, spec: Spec, layout: Layout) -> None:
        """`crossover` where the kernel can apply it, else a refusal at the knob."""
        at = spec.schedule.span_of("crossover")
        if not layout.fp8:
            raise Refusal("`crossover` shares the fp8 conversion between a cluster's two CTAs; "
                          "this cache has no fp8 run", at, "crossover")
        if not cls._seesaw(spec):
            raise Refusal(f"`crossover` pairs the seesaw's {TILE_M}-row CTAs; this plan is stacked "
                          f"({STACKED_TILE_M} rows a CTA already share each tile)", at, "crossover")
        p_src = next(s for s in layout.sources if s.smem_col <= spec.d_v < s.smem_col + s.width)
        if DTYPES[p_src.dtype].is_fp8:
            raise Refusal(f"`crossover` copies each box's half to the peer before P overwrites the "
                          f"first key-only box; that box is fp8 (segment `{p_src.segment}`), "
                          "converted in place", at, "crossover")
        if spec.group % (2 * TILE_M):
            raise Refusal(f"`crossover` needs an even number of {TILE_M}-row blocks per kv head, each "
                          f"pair one query token's rows: a group of a multiple of {2 * TILE_M} query "
                          f"heads; this one is {spec.group}", at, "crossover")

    @staticmethod
    def _seesaw(spec: Spec) -> bool:
        """The seesaw where asked for or where one warp group cannot hold the value (d_v 512);
        else the stacked schedule."""
        return spec.schedule.seesaw or spec.d_v > STACKED_MAX_COLS

    @classmethod
    def _tile_m(cls, spec: Spec) -> int:
        return TILE_M if cls._seesaw(spec) else STACKED_TILE_M

    @staticmethod
    def _tma_rows(spec: Spec, layout: Layout) -> tuple[int, str]:
        """Tokens per TMA copy of a box (0: the producer copies by cp.async), and why. Where a
        tile's 64 tokens are one run of a page (P a multiple of 64) a box is one TMA copy; where
        they are 2 or 4 whole pages (P 32 or 16) a box is a copy a page, each page's copies
        issued by a producer warp of its own (produce.cuh: TmaTile); tiles a copy cannot take
        whole (a token past the CTA's view, a bad page number) go by cp.async, which zero-fills
        and flags those tokens. Other pages stay on cp.async."""
        if spec.sparse:
            return 0, "cp.async: sparse top-k, a tile's tokens are wherever its indices say"
        if layout.fp8:
            return 0, ("cp.async: fp8 runs are dequantized by the producer (raw bytes and scales "
                       "copied into the stage, converted in place), 16-bit runs copied beside them")
        page = spec.page_size
        if page % TILE_N and TILE_N % page:
            return 0, f"cp.async: page {page} splits a tile's {TILE_N} tokens over pages unevenly"
        if page % TILE_N and TILE_N // page > TMA_MAX_PAGES:
            return 0, (f"cp.async: page {page} splits a tile's {TILE_N} tokens over more than {TMA_MAX_PAGES} pages "
                       f"(a TMA tile holds at most {TMA_MAX_PAGES}: the seesaw's producer keeps four tiles' page "
                       "numbers in registers)")
        if any(t.head_axis for t in layout.tensors):
            return 0, "cp.async: a cache tensor with a head axis (its stride is the call's)"
        if page < TILE_N:
            return page, (f"TMA: a tile's {TILE_N} tokens are {TILE_N // page} whole pages, a copy a page and box, "
                          f"each page's by a producer warp of its own; a tile with a token outside the view by "
                          f"cp.async (same-process A/B, H200, b=128 h_q 128 s_k 8192, against cp.async: MLA page 16 "
                          f"s_q 1 0.843, s_q 2 0.859, page 32 0.867 / 0.874, GLA-2 page 16 0.928 / 0.954)")
        return TILE_N, (f"TMA: a tile's {TILE_N} tokens are one run of a page (page "
                        f"{spec.page_size}), a copy per box; a tile with a token outside the view "
                        "by cp.async")

    @staticmethod
    def _q_box(spec: Spec, tile_m: int) -> tuple[int, int]:
        """q_tma's box of a CTA's Q rows, (heads of the group, query tokens), or (0, 0) where the
        rows are not one box of q [b, s_q, h_q, d_k] seen as (column, head of the group, kv head,
        query token, batch): a CTA's tile_m rows are (query token, head of the group) in that order
        (sparse: heads of one query token), so a box is tile_m heads of one token where the group
        is a multiple of tile_m, or whole groups of tile_m / group tokens where tile_m is a multiple
        of the group (rows past s_q fall outside the tensor: TMA zero-fills them)."""
        if spec.group % tile_m == 0:
            return tile_m, 1
        if tile_m % spec.group == 0 and not spec.sparse:
            return spec.group, tile_m // spec.group
        return 0, 0

    @staticmethod
    def _scale_records(layout: Layout) -> tuple[int, str]:
        """Bytes of a token's scale record (0: none), and why. The producer copies a tile's fp8
        scales by cp.async: 4 bytes a token and box pair (into the pair's first box, which the
        conversion then overwrites), each such copy of a warp 16 shared-memory wavefronts (16
        tokens); with records, one 16-byte copy a token and tile of all the run's scales. (_check:
        fp8 comes from one packed tensor without a head axis, of 16-byte token rows.)"""
        fp8 = [s for s in layout.sources if s.scale]
        if not fp8:
            return 0, "no fp8 run"
        src = fp8[0]
        sc = src.scale
        if len(fp8) > 1:
            return 0, "off: more than one fp8 run"
        if sc.group % (2 * BOX_COLS) or src.seg_lo % (2 * BOX_COLS):
            return 0, f"off: scale groups of {sc.group} values: a scale a 16-value chunk, copied beside it"
        if sc.count * 4 != SCALE_RECORD_BYTES:
            return 0, f"off: {sc.count} scales a token, not {SCALE_RECORD_BYTES // 4}"
        if (sc.offset_bytes + sc.first_group * 4) % 16 or sc.head_stride_bytes % 16:
            return 0, "off: a token's scales are not 16-byte aligned in its record"
        return SCALE_RECORD_BYTES, (f"a token's {sc.count} scales by one {SCALE_RECORD_BYTES}-byte copy a tile into "
                                    "the stage's records, not a 4-byte copy a box pair")

    def lower(self, spec: Spec, layout: Layout, target: Target) -> HopperConfig:
        if not target.wgmma:
            raise Refusal(f"needs wgmma; {target.name} has none", spec.schedule.span_of("target"))
        if spec.schedule.crossover and not target.clusters:
            raise Refusal(f"`crossover` needs thread-block clusters; {target.name} has none",
                          spec.schedule.span_of("crossover"), "crossover")
        self._check(spec, layout)
        sched = spec.schedule
        seesaw, tile_m = self._seesaw(spec), self._tile_m(spec)
        crossover = sched.crossover
        boxes = layout.staged_width // BOX_COLS
        value_box = layout.value_runs[0][0] // BOX_COLS
        key_boxes = spec.d_k // BOX_COLS
        box_bytes = TILE_N * BOX_COLS * 2
        q_box_bytes = tile_m * BOX_COLS * 2
        kv_tile = boxes * box_bytes
        # the Q tile's region, which the stacked split mode's merge reuses for its exchange (stacked.cuh:
        # half of each group's O and its (m, l)): a key as narrow as the value (separate key and value)
        # needs more than the Q tile
        exchange = 0 if seesaw else 2 * (spec.d_v // 4) * GROUP_THREADS * 4 + 2 * GROUP_THREADS * 16
        q_bytes = -(-max(key_boxes * q_box_bytes, exchange) // 1024) * 1024
        records, records_why = self._scale_records(layout)

        # the CTA's start: the consumers' cp.async of a 64-row Q tile (4,608 16-byte copies a CTA,
        # every CTA at once) queued the producer's loads of the first piece's length and page numbers
        # behind it (H100 clock trace, MLA b=1 s_k 32768: tile 0's copies issued 13.4 K cycles from
        # the CTA's begin). Two answers were measured and removed (same-process A/B, H100, bitwise
        # equal): the consumers copying Q once the producer had issued its first tile's copies was
        # slower (MLA b=1 1.041, b=8 1.016, b=128 s_q 1 s_k 4096 1.009; GLA-2 b=1 1.068), and the
        # walk's warp prefetching the first two tiles' page numbers into L2 changed nothing (measured
        # on top of q_tma: MLA b=1 0.995, b=8 0.997, s_k 4096 0.996)
        # the Q tile by TMA (FlashMLA's way): 9 copies by one thread for MLA's 64-row tile in place of
        # 4,608 cp.async, so that neither the producer's first loads (above) nor, at a part's
        # transition, its next copies queue behind Q's. Measured (same-process A/B against cp.async,
        # H100, bitwise equal): slower where the cache tiles go by TMA at b = 128 (MLA s_k 4096 s_q 1
        # 1.016, s_q 2 1.010; s_k 8192 1.015 / 1.005; h_q 64 1.008; GLA-2 s_q 2 1.004) and GLA-2 b=1
        # (1.022), faster at MLA b=1 (0.986), page 1 (0.990) and sparse fp8 (0.995), about even at
        # b=8 (1.009): off. At b=1 the first S's boxes landed 1.4 K cycles sooner and CTA 7 ended
        # 4.3 K sooner (clock trace), the call 1.4 %.
        q_tma_heads, q_tma_tokens = self._q_box(spec, tile_m)
        q_tma = False

        def regions(stages: int) -> dict:
            q_off = 0
            kv_off = q_off + q_bytes
            bar_off = kv_off + stages * kv_tile
            # per stage: FULL per box, EMPTY early and late, FLAGS; then the three handoffs
            # between the consumer warp groups (mbarriers: an arrival releases, a wait acquires)
            n_bars = stages * boxes + 3 * stages + HANDOFFS
            flags_off = -(-(bar_off + n_bars * BARRIER_BYTES) // 16) * 16  # 16-byte loads of the words
            flags_pitch = TILE_N + 16
            rows_off = flags_off + stages * flags_pitch
            work_off = rows_off + 5 * TILE_M * 4
            scales_off = work_off + WORK_BYTES
            return dict(q_off=q_off, kv_off=kv_off, bar_off=bar_off, flags_off=flags_off,
                        flags_pitch=flags_pitch, rows_off=rows_off, work_off=work_off,
                        walk_c_off=work_off + WALK_OFFSET, whole_off=work_off + WHOLE_OFFSET,
                        walk_p_off=work_off + PRODUCER_WALK_OFFSET, scales_off=scales_off,
                        smem=scales_off + stages * TILE_N * records)

        def fits(stages: int) -> bool:
            return regions(stages)["smem"] <= target.smem_per_block

        if sched.stages is not None:
            stages = sched.stages
            stages_why = "`stages`"
        elif seesaw:
            # as many sets of a pair's two stages as fit, up to MAX_SETS: with one set the
            # seesaw waits on its copies (a stage refills only once read); a second let GLA-2
            # run 0.83 of one set's time (H200, h_q 128 s_k 8192, s_q 1 and 2, b 8 and 128,
            # bench/RESULTS.md session 13). MLA's 72 KB tiles leave room for one.
            sets = max([n for n in range(1, MAX_SETS + 1) if fits(n * PAIR_STAGES)] or [1])
            stages = sets * PAIR_STAGES
            stages_why = (f"{sets} set{'s' if sets > 1 else ''} of a pair's {PAIR_STAGES} stages: "
                          + ("the producer runs up to two pairs ahead" if sets > 1 else
                             f"a second set ({2 * PAIR_STAGES} x {kv_tile} B) does not fit"))
        else:
            # stacked: every tile is read by both groups (or one of them, alternately): as many
            # stages as fit beside the 128-row Q tile, up to MAX_STACKED_STAGES
            stages = max([n for n in range(2, MAX_STACKED_STAGES + 1) if fits(n)] or [2])
            stages_why = (f"as many tiles in flight as fit beside the {tile_m}-row Q tile "
                          f"({q_bytes} B), up to {MAX_STACKED_STAGES}")
        r = regions(stages)
        smem = r.pop("smem")
        if smem > target.smem_per_block:
            raise Refusal(f"{smem} B of shared memory (Q and {stages} stages of {kv_tile} B) > "
                          f"{target.smem_per_block}", sched.span_of("stages") if sched.stages else spec.span_of("key"),
                          "stages" if sched.stages else None)
        threads = 3 * GROUP_THREADS
        tma_rows, tma_why = self._tma_rows(spec, layout)
        one_page_tma = tma_rows == TILE_N  # a tile of one page: one copy a box (spread_copies)
        # overlap (stacked.cuh): it needs 232 registers a consumer (224 spilled), which the
        # producer of 16-bit records leaves where it holds at most two page numbers a tile
        # (one-page or two-page TMA tiles, or cp.async: 40 fit; four pages, page 16, spilled 8 bytes)
        overlap = not layout.fp8 and not seesaw and (tma_rows == 0 or TILE_N // tma_rows <= 2)
        narrow_overlap = overlap and spec.d_v <= NARROW_VALUE_COLS  # NARROW_OVERLAP_REGISTERS
        # at launch every thread gets the register file's share (setmaxnreg's unit, 8), then
        # the roles trade: the producer gives back what the consumers take
        registers = min(target.max_registers_per_thread, target.registers_per_sm // threads // 8 * 8)
        out_cols = spec.d_v // 2 if seesaw else spec.d_v
        # the seesaw's producer converting whole fp8 tiles by cp.async: it, not the products, sets
        # the pace (bench/RESULTS.md sessions 19-21). Both choices below measured together on
        # the H200 (session 21, same-process A/B, bitwise equal): sparse fp8 h_q 128 s_q 2 0.937
        # of the time, s_q 1 0.943, h_q 64 0.949, fp8 dense 0.934; slots ahead alone 0.972 and
        # 0.985; on MLA bf16 page 1 (a cp.async plan, products set the pace) 1.014 / 1.000
        converts = seesaw and layout.fp8 and tma_rows == 0
        # the seesaw's 16-bit cp.async producer (pages TMA cannot take: 1, 5, 8) sets the pace where
        # few rows read each token: at page 1 the consumers waited on FULL for a third of their
        # samples (ncu, bench/RESULTS.md session 48), WG1 at a pair's start on tile b, which the
        # producer refills only once both groups are done with the pair before. The value-first
        # form hands WG1 tile a's product first, so tile b has that much longer to land. Measured
        # against the plain seesaw (H100, same-process A/B, bitwise equal; session 50): MLA h_q 128
        # page 1 s_q 1 0.944 of the time, b=8 s_k 32768 0.953, but s_q 2 (four CTAs a token: the
        # products set the pace) 1.034, page 8 s_q 2 1.018; TMA pages 1.07-1.15. So the plan
        # carries it as a second form that a call takes where a kv head has at most
        # VALUE_FIRST_ROWS query rows (s_q x group), hopper/launch.cuh
        dense_16bit_seesaw = seesaw and not layout.fp8 and not spec.sparse
        paged_value_first_rows = VALUE_FIRST_ROWS if dense_16bit_seesaw and tma_rows == 0 else 0
        # relay (relay.cuh, FlashMLA's sparse fp8 division of the work): WG0 alone computes S and
        # hands P to WG1, whose registers are then O_R's. Where the producer sets the pace it
        # measured faster than the seesaw at b=128 (H200, same-process A/B, all ok against the
        # reference, bench/RESULTS.md session 29): sparse fp8 h_q 128 s_q 2 0.981, s_q 1 0.986,
        # h_q 64 0.996, fp8 dense h_q 128 0.985 (s_q 2) and 0.986 (s_q 1), h_q 64 page 1 0.987,
        # a scale per 32 page 16 0.969; at b=8 s_q 1 even (h_q 128: 1.003) or slower (h_q 64
        # page 1: 1.034), kept for the batches where fp8 decode's time goes. Where the products
        # set the pace it lost (bf16 MLA 1.073, b=1 1.047): WG0's softmax is not overlapped. Not with
        # crossover (not measured together; its seesaw's pairs are what the peers share stages by),
        # nor with two sets of stages (relay.cuh: a handoff's next arrival needs its stage
        # released); and the `seesaw` knob asks for the seesaw itself
        relay = converts and not crossover and stages == PAIR_STAGES and not sched.seesaw
        producer_q = seesaw and not relay and not crossover  # kernel.cuh: produce_q
        group_fence = fences_groups(layout.fp8, crossover=crossover, relay=relay, seesaw=seesaw)
        if seesaw:
            tile_m_why = f"one wgmma M ({TILE_M} rows), both consumer warp groups on the same rows"
            seesaw_why = ("`seesaw`" if sched.seesaw else
                          f"chosen: a {spec.d_v}-wide value splits into two {spec.d_v // 2}-column halves, "
                          "one per consumer warp group")
        else:
            tile_m_why = (f"stacked: one wgmma M ({TILE_M} rows) per consumer warp group, each token read "
                          f"once for {tile_m} rows; a CTA of {TILE_M} rows or fewer: the groups take "
                          "alternate tiles of the same rows and merge")
            seesaw_why = (f"not chosen: a {spec.d_v}-wide value fits one warp group's accumulators "
                          f"({spec.d_v // 2} registers a thread), so each group takes whole rows "
                          "(stacked); `seesaw` asks for it")
        why = (
            ("tile_m", tile_m_why),
            ("tile_n", "`tile kv`" if sched.tile_kv else f"{TILE_N} tokens: a P tile is one box"),
            ("stages", stages_why),
            ("threads", "a producer warp group and two consumer warp groups"),
            ("seesaw", seesaw_why),
            ("crossover", "`crossover`: clusters of two CTAs (row blocks 2i, 2i + 1 of a kv head, one "
             "query token's rows), each producer converting half of every tile's fp8 tokens and "
             "storing it into the peer's stage too (DSMEM)" if crossover else
             "not chosen: each CTA converts its tiles' fp8 runs itself (crossover measured 1.01-1.02x "
             "the relay's time, H100, before its consumers released both CTAs' stages: 0.955 of that)"
             if layout.fp8 else "no fp8 run to share"),
            ("relay", "chosen: the producer's fp8 conversion sets the pace; WG0 alone computes S and hands P "
             "to WG1 (measured against the seesaw, H200: 0.97-0.996 of its time at b=128; 1.00-1.03 "
             "at b=8)" if relay else
             "not chosen: `seesaw` asks for the seesaw (both groups compute scores)" if converts and sched.seesaw else
             "not chosen: `crossover` pairs the seesaw's stages with the peer's" if converts and crossover else
             "not chosen: two sets of stages (a handoff's next arrival would not wait for WG1)" if converts else
             "not chosen: both consumer warp groups compute scores (the products set the pace; "
             "relay measured 1.07 of the seesaw's time on bf16 MLA)" if seesaw else "seesaw only"),
            ("value_first", "relay: WG1 computes no S" if relay else
             "the producer's fp8 conversion sets the pace: WG1 takes O_R += P_a V_a "
             "before S_b, so stage a's late boxes are free before tile b lands" if converts else
             "not in the plan's form: WG1 computes S_b beside WG0's S_a (the products set the pace; "
             "value_first_rows: the calls that take a value-first form)" if paged_value_first_rows else
             "not chosen: WG1 computes S_b beside WG0's S_a (the products set the pace)" if seesaw else
             "seesaw only"),
            ("value_first_rows", f"a second form, value first, for calls of at most {paged_value_first_rows} "
             "query rows a kv head (s_q x group: two CTAs read each token): there the cp.async producer "
             "sets the pace, and WG1's product of tile a before S_b gives tile b longer to land "
             "(same-process A/B, H100, MLA h_q 128 page 1: s_q 1 0.944 of the time, b=8 0.953; s_q 2 "
             "1.034)" if paged_value_first_rows else
             "no second form: the value first measured slower where TMA copies the tiles (MLA page 64 "
             "1.04-1.14, page 16 1.07-1.15)" if dense_16bit_seesaw else
             "no second form"),
            ("skip_unmoved", "chosen: a warp skips a rescale of O where none of its 16 rows moved its max "
             "(the same bits; same-process A/B, H200, bf16 MLA b=128: s_q 2 0.973, s_q 1 0.962, h_q 64 0.964, "
             "b=8 0.988, b=1 1.000 of the time without)" if seesaw and not relay else
             "not with the relay (with the vote in both groups or in WG1 alone its part kernels "
             "spilled 36-48 bytes, ptxas)" if relay else
             "not chosen (stacked): where it fits (232 / 40 registers) slower (same-process A/B, H100, GLA-2 "
             "b=128 s_k 8192: s_q 2 1.020, s_q 1 1.001, b=8 s_k 32768 1.023); at 224 the groups spilled 4-20 "
             "bytes (48-64 with an fp8 run, ptxas)"),
            ("group_fence", "the producer converts a group's fp8 pairs, then fences once and arrives on "
             "their FULLs (a fence is a MEMBAR.ALL.CTA: one a group, not one a pair)" if group_fence else
             "not chosen: crossover fences each pair, whose peer stores count on its FULLs" if crossover else
             "not chosen: the seesaw's producer (72 registers) spilled 4 bytes holding a group "
             "(ptxas: mla_fp8_per32_page16, and mla_fp8_crossover without crossover, with `seesaw`)"
             if layout.fp8 else "no fp8 run"),
            ("slots_ahead", "the next tile's page numbers / indices loaded while the producer fills "
             "this one (a round trip before each tile's copies otherwise)" if converts else
             "not chosen: the producer does not set the pace" + ("" if seesaw else " (stacked)")),
            ("registers", f"launch bounds ({threads} threads, 1 CTA): {registers}, then setmaxnreg"),
            ("consumer_registers", "relay, WG0: O_L (128) + S (32) and the rest: 184 spilled (ptxas)" if relay else
             f"O ({out_cols // 2}) + S (32) + P (16) and the rest: no "
             "spills (ptxas)" + ("" if seesaw else "; 216 leaves the fp8 producer 72" if layout.fp8
                                 else f"; a value of at most {NARROW_VALUE_COLS} columns with the overlap: 216, "
                                 "which leaves the producer 72" if narrow_overlap
                                 else "; the overlap's parts kernels: 224 spilled 28 bytes" if overlap
                                 else "; the split mode's merge: 216 spilled")),
            ("wg1_registers", "relay, WG1: O_R (128) and the rest: at 152 ptxas ignores the setmaxnreg" if relay
             else "as WG0's (both groups run the same code)"),
            ("producer_registers", "what the relay's consumers leave of 168 x 384" if relay
             else "a tile's token offsets and the copy addresses: 40 and 56 spilled" if seesaw
             else "the fp8 conversion of a box pair (4 tokens): 56 spilled with its loads in registers (ptxas, session 18)" if layout.fp8
             else f"what consumers of a value of at most {NARROW_VALUE_COLS} columns leave of 168 x 384: 40 spilled "
             "8 bytes (cp.async tiles from two per-head runs at page 5, ptxas)" if narrow_overlap
             else "what the consumers leave of the launch's 168 x 384: a producer of one- or two-page TMA tiles "
             "(a tile's validity kept in its token, no bool of its own) or of cp.async tiles (a run's boxes on one "
             "base) fits 40 (ptxas)" if overlap
             else "what the consumers leave of the launch's 168 x 384; 56 does not spill (ptxas)"),
            ("tma_rows", tma_why),
            ("producer_fences", "crossover: the producer fences what it shares; the consumers fence nothing" if crossover else
             "a TMA plan's rare cp.async tiles (a partial last tile, a bad page number): landed, fenced, then FULL "
             "(the consumers need no fence)" if tma_rows else
             "chosen: the producer lands and fences each group of its fp8 boxes once (group_fence); the group's "
             "16-bit boxes (the rope) ride that fence, and the consumers fence nothing (same-process A/B, H200, "
             "sparse fp8 relay b=128: h_q 128 s_q 2 0.993, s_q 1 0.996, h_q 64 0.994)" if group_fence else
             "not chosen: each 16-bit box's FULL counts its copies as they land (cp.async.mbarrier.arrive) and the "
             "consumers fence a group after its FULLs; the producer waiting for its copies instead measured slower "
             "(same-process A/B, H200, b=128 page 1: MLA s_q 2 1.037, s_q 1 1.054, GLA-2 s_q 2 1.025)"),
            ("spread_copies", "no one-page TMA tile" if not one_page_tma else
             "chosen (stacked): box b's copy issued by warp b % 4, not all by thread 0 (same-process A/B, H100, "
             "b=128 s_k 8192: GLA-2 s_q 2 0.985 and 0.985 in the other order, s_q 1 1.001; b=8 s_k 32768 s_q 2 0.997)"
             if not seesaw else
             "not chosen: thread 0 issues a one-page tile's copies (spread over the four warps, same-process A/B, "
             "H100: MLA b=128 s_q 1 0.999, s_q 2 1.004, b=8 1.003, b=1 1.020)"),
            ("overlap", "seesaw: the groups hand the tile to each other" if seesaw else
             "chosen (rows mode; FA3's order): tile i + 1's S and O += P_i V_i issued together, tile i + 1's "
             "softmax under P_i V_i (bitwise the same; same-process A/B, H100, GLA-2 b=128 s_k 8192: s_q 2 0.980 of main's "
             "time and 0.982 in the other order, 0.978 of the same registers without it; b=8 s_k 32768 0.982; s_q 1, "
             "split mode, which keeps the order: 1.003-1.005)" + ("" if one_page_tma else
             "; with this producer, cp.async with a run's base once, GLA-2 page 1 s_q 2 0.997 of main's time "
             "(H100, session 41; 224 registers spilled its parts kernels)") if overlap else
             "not chosen: at 224 registers its parts kernels spilled 28 bytes, and this producer (four page numbers "
             "a tile, or fp8 conversion) needs more than 40 (ptxas)"),
            ("producer_q", "chosen: the producer copies a part's later pieces' Q rows as soon as the consumers are "
             "past the piece before's last S = Q K^T, so that they land under its last products and epilogue (a "
             "transition's Q load waited ~6.9 K cycles, H100 clock trace, session 53); the first piece's the "
             "consumers copy at once (by the producer, behind its start: b=1 1.065, session 47). Same-process "
             "A/B against producer_q=false, H100: MLA b=128 s_k 4096 0.987 (s_q 1) / 0.988 (s_q 2), s_k 8192 "
             "0.990 / 0.995, b=8 0.992, b=1 0.997"
             if producer_q else
             "not chosen: " + ("the stacked groups' split merge reuses the Q region" if not seesaw else
                               "the relay's producer sets the pace" if relay else
                               "a crossover CTA's producer stores into its peer")),
            ("q_tma", "not chosen: the Q tile would go by TMA, a copy a 64-column box of "
             f"{q_tma_heads} heads x {q_tma_tokens} query token{'s' if q_tma_tokens > 1 else ''} issued by one thread "
             f"({key_boxes} copies in place of {tile_m * key_boxes * 8:,} cp.async of 16 bytes), so that the producer's "
             "first loads and a transition's copies do not queue behind Q's; measured slower where the cache tiles "
             "go by TMA (same-process A/B, H100: MLA b=128 s_k 4096 1.016, s_k 8192 1.015; GLA-2 b=1 1.022), "
             "~1 % faster at MLA b=1 (0.986), page 1 (0.990), sparse fp8 (0.995) (`--config q_tma=true`)" if q_tma_heads else
             f"not applicable: a CTA's {tile_m} rows are not one box of q (a group of {spec.group} query heads"
             + (", sparse: one query token's heads" if spec.sparse else "") + ")"),
            ("q_tma_heads", f"q_tma's box: {q_tma_heads} heads of the group by {q_tma_tokens} query "
             f"token{'s' if q_tma_tokens > 1 else ''} (q_tma_tokens)" if q_tma_heads
             else "no box: q_tma not applicable"),
            ("scale_record_bytes", records_why),
            ("key_boxes", "the key is the staged row's boxes " + " ++ ".join(
                f"{c // BOX_COLS}" + (f"-{(c + w) // BOX_COLS - 1}" if w > BOX_COLS else "") for c, w in layout.key_runs)
             + ", read by S = Q K^T in the stage's order against the Q row's columns in the key's"),
            ("value_box", f"the value is the staged row's boxes {value_box}-{value_box + spec.d_v // BOX_COLS - 1} "
             "(O += P V's operand)" + ("" if seesaw else "; the stage's boxes are all waited for before S is "
                                       "done, so a value apart from the key has landed when O += P V reads it")),
            ("early_boxes", "the value's left half, read last by WG0, released apart" if seesaw else
             "every box: both groups (or the tile's one) release the stage after O += P V"),
            ("compute_bound", f"a {tile_m}-row tile reads each token once for {tile_m} rows"),
            ("smem_bytes", f"Q + {stages} stages of {boxes} boxes + barriers <= "
             f"{target.smem_per_block} B"),
            DEPENDENT_LAUNCH_WHY[target.dependent_launch],
        )
        ready, ready_why = ready_words(spec, target)
        blocks, blocks_why = combine_blocks(spec, ready)
        # whole-sequence parts: not on the seesaw's paged cp.async producer, where a part's whole
        # sequences ran ~5 % slower than the same sequences as CTAs of their own (H100, MLA page 1
        # b=128 s_q 2: 1.053 of cut parts' time; the pieces' transitions?)
        whole = not (seesaw and tma_rows == 0 and not spec.sparse)
        whole_why = WHOLE_PARTS_WHY if whole else (
            "whole_parts", "off: the seesaw's paged cp.async producer ran a part's whole sequences ~5 % slower than "
            "the same sequences as CTAs of their own (same-process A/B, H100, MLA page 1 b=128 s_k 8192: this "
            "plan 0.947 (s_q 2) and 0.983 (s_q 1) of the time with whole parts on)")
        tight_rows, slack_tiles, slack_why = whole_slack(spec, TILE_N)
        cost, cost_why = piece_cost(True)
        wg0_regs, wg1_regs, producer_regs = (
            RELAY_REGISTERS if relay else
            (CONSUMER_REGISTERS, CONSUMER_REGISTERS, PRODUCER_REGISTERS) if seesaw or layout.fp8 else
            NARROW_OVERLAP_REGISTERS if narrow_overlap else
            STACKED_OVERLAP_REGISTERS if overlap else
            (STACKED_CONSUMER_REGISTERS, STACKED_CONSUMER_REGISTERS, STACKED_PRODUCER_REGISTERS))
        return HopperConfig(
            tile_m=tile_m, tile_n=TILE_N, stages=stages, threads=threads, smem_bytes=smem,
            registers=registers, compute_bound=True,
            dependent_launch=target.dependent_launch, ready_words=ready, combine_blocks=blocks,
            whole_parts=whole, whole_tight_rows=tight_rows, whole_slack_tiles=slack_tiles, piece_cost_tiles=cost, seesaw=seesaw, crossover=crossover,
            value_first=converts and not relay, value_first_rows=paged_value_first_rows, slots_ahead=converts, relay=relay,
            skip_unmoved=skips_unmoved(seesaw=seesaw, relay=relay),
            group_fence=group_fence,
            consumer_registers=wg0_regs, wg1_registers=wg1_regs, producer_registers=producer_regs,
            tma_rows=tma_rows, producer_fences=fences_in_producer(tma_rows=tma_rows, group_fence=group_fence,
                                                                  crossover=crossover),
            spread_copies=one_page_tma and not seesaw, overlap=overlap, producer_q=producer_q,
            q_tma=q_tma, q_tma_heads=q_tma_heads, q_tma_tokens=q_tma_tokens,
            boxes=boxes, key_boxes=key_boxes, value_box=value_box, value_boxes=spec.d_v // BOX_COLS,
            out_boxes=out_cols // BOX_COLS, early_boxes=out_cols // BOX_COLS if seesaw else boxes,
            p_box=spec.d_v // BOX_COLS if seesaw else -1, box_bytes=box_bytes, q_box_bytes=q_box_bytes, q_bytes=q_bytes,
            kv_tile_bytes=kv_tile,
            scale_record_bytes=records,
            **r,
            consumer_barrier=1, producer_barrier=2, barriers=3, why=why + (ready_why, blocks_why, whole_why) + slack_why + (cost_why,))
