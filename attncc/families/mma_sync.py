"""The portable family: warp-level mma.sync (sm_80+) with cp.async copies, every operand
through ldmatrix (templates/include/attncc/mma_sync/). Its kernel is

    for each KV tile (cp.async pipeline, `stages` deep):
        S = Q K^T (mma.sync, Q and K by ldmatrix); mask; online softmax; P -> shared
        O += P V  (V by ldmatrix.trans)
    out/lse, or partials for the combine

with warps = WM x WN: warp (wm, wn) owns warp_rows rows; in S = Q K^T tokens_per_warp of the
tile's tokens, in O += P V value_cols_per_warp of the value's columns. This module makes
every choice of that kernel (tiles, warp layout, policy flags, shared-memory offsets, named
barriers) and says why; the C++ only static_asserts them."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import SCALE_BYTES, Spec
from ..layout import CHUNK_BYTES, Layout
from ..target import Target
from .base import (DEPENDENT_LAUNCH_WHY, WALK_OFFSET, WHOLE_OFFSET, WHOLE_PARTS_WHY, Family, KernelConfig, Refusal,
                   combine_blocks, misaligned, piece_cost, ready_words, whole_slack)

MAX_ACC_REGS = 128    # fp32 output accumulators per thread (255 registers, no spills)
MAX_SCORE_REGS = 32   # fp32 scores per thread
WARPS = (4, 8)        # warps per CTA the kernel is written for
ROWS = (16, 32, 64)   # tile_m: whole 16-row mma tiles over 4 or 8 warps
ALIGN_ELEMS = 8       # 16-byte ldmatrix rows / cp.async chunks of 16-bit data
WORK_BYTES = 128      # shared memory for the work stash (base.py: the CTA's work, part walk, whole word)
SLOT_BYTES = 4        # a token's slot (int) in the slot ring
STREAM_TILE_BYTES = 16 * 1024  # a 16-row tile's KV stage stages at least this much (measured)


@dataclass(frozen=True)
class SmemRows:
    """A row-major 16-bit tile in shared memory, addressed in 16-byte chunks. ldmatrix reads
    one chunk from each of 8 consecutive rows: they must fall in 8 different 16-byte bank
    groups. Rows whose chunk count is a multiple of 8 are XOR-swizzled (no padding), odd counts
    already are conflict-free, others get one chunk of padding."""

    cols: int
    pitch_bytes: int
    swizzle: bool

    @staticmethod
    def of(cols: int) -> "SmemRows":
        chunks = cols // 8
        swizzle = chunks % 8 == 0
        pitch_chunks = chunks if swizzle or chunks % 2 == 1 else chunks + 1
        return SmemRows(cols, 16 * pitch_chunks, swizzle)

    def bytes(self, rows: int) -> int:
        return rows * self.pitch_bytes


@dataclass(frozen=True, kw_only=True)
class MmaSyncConfig(KernelConfig):
    warps: int
    warp_rows: int            # rows per warp, 16 or 32
    warps_m: int              # row groups
    warps_n: int              # warps per row group
    m_tiles: int              # m16 tiles per warp
    tokens_per_warp: int      # S = Q K^T: tokens per warp ...
    score_n_tiles: int        # ... in n8 tiles
    value_cols_per_warp: int  # O += P V: value columns per warp ...
    value_n_tiles: int        # ... in n8 tiles
    acc_registers: int        # O accumulator registers per thread
    raw_staging: bool         # fp8 record: copied raw, then dequantized into the staged tile
    qk_split: bool            # a warp pair splits S = Q K^T over d_k
    qk_n_tiles: int           # n8 tiles of S = Q K^T per warp
    qk_steps: int             # k-steps of S = Q K^T per warp
    qk_chains: int            # independent accumulator chains in S = Q K^T
    pair_slot_bytes: int      # qk_split: a round's exchange slot per warp
    ping_pong: bool           # two row groups hand tiles over by named barriers
    copy_threads: int         # threads that copy KV tiles
    copy_interleave: bool     # the next tile's copies spread over S = Q K^T's k-steps
    copy_steps: int           # ... over this many k-steps
    copy_token_major: bool    # 8 threads per token copy a token's runs
    q_rows: SmemRows
    kv_rows: SmemRows
    p_rows: SmemRows
    kv_buffers: int           # staged KV tiles (1 with raw staging: dequantized per step)
    kv_tile_bytes: int
    raw_tile_bytes: int
    q_off: int                # shared-memory regions, in bytes from the base
    kv_off: int
    raw_off: int
    p_off: int
    slot_off: int             # stages + 1 ring entries: tile_n slots, then the tile's hole words
    slot_pitch: int           # ... ints from one entry to the next
    hole_words: int           # ... one per 32 tokens: the ballot of its bad page numbers (dense)
    red_off: int              # [tile_m][warps_n] floats: row-group reductions
    work_off: int             # the CTA's work, then (walk_off) its part walk
    walk_off: int
    whole_off: int
    work_bytes: int
    row_group_barrier0: int   # named barriers: row groups 1..WM (0 is __syncthreads)
    pair_barrier0: int        # ... one per qk_split pair
    full_barrier0: int        # ... ping_pong: FULL(i) by parity
    empty_barrier0: int       # ... ping_pong: EMPTY(i) by parity
    barriers: int             # ids in use


def warp_rows(d_k: int, d_v: int, tile_m: int, tile_n: int, warps: int) -> int | None:
    """Rows per warp (16 or 32) that fit the register budget and read the fewest shared
    bytes per KV tile; None when no layout of these warps is legal."""
    best = None
    for rows in (16, 32):
        if tile_m % rows or warps % (tile_m // rows):
            continue
        wm = tile_m // rows
        wn = warps // wm
        if tile_n % (8 * wn) or d_v % (16 * wn) or tile_n > 32 * warps:
            continue
        if rows * (d_v // wn) // 32 > MAX_ACC_REGS or rows * (tile_n // wn) // 32 > MAX_SCORE_REGS:
            continue
        cost = wn * tile_m * d_k + wm * tile_n * d_k + wn * tile_m * tile_n + wm * tile_n * d_v
        if best is None or cost < best[0]:
            best = (cost, rows)
    return None if best is None else best[1]


def compute_bound(d_k: int, d_v: int, layout: Layout, tile_m: int) -> bool:
    """A tile's math per byte of cache, 2 tile_m (d_k + d_v) / record bytes per kv head,
    >= 64: shared memory and the tensor pipe, not the copies, bound the KV step."""
    return 2 * tile_m * (d_k + d_v) >= 64 * layout.raw_pitch


def smem_regions(d_k: int, layout: Layout, tile_m: int, tile_n: int, stages: int,
                 warps_n: int) -> dict:
    """The shared-memory plan: every region's offset and the total."""
    q, kv, p = SmemRows.of(d_k), SmemRows.of(layout.staged_width), SmemRows.of(tile_n)
    raw = layout.fp8
    kv_buffers = 1 if raw else stages
    r = dict(q_rows=q, kv_rows=kv, p_rows=p, kv_buffers=kv_buffers, kv_tile_bytes=kv.bytes(tile_n),
             raw_tile_bytes=layout.raw_pitch * tile_n, q_off=0)
    r["kv_off"] = r["q_off"] + q.bytes(tile_m)
    r["raw_off"] = r["kv_off"] + kv_buffers * r["kv_tile_bytes"]
    r["p_off"] = r["raw_off"] + (stages * r["raw_tile_bytes"] if raw else 0)
    r["slot_off"] = r["p_off"] + p.bytes(tile_m)
    r["hole_words"] = -(-tile_n // 32)
    r["slot_pitch"] = tile_n + -(-r["hole_words"] // 4) * 4  # hole words 16-byte aligned (tile_n % 16 == 0)
    r["red_off"] = r["slot_off"] + (stages + 1) * r["slot_pitch"] * SLOT_BYTES
    r["work_off"] = r["red_off"] + warps_n * tile_m * 4
    r.update(walk_off=WALK_OFFSET, whole_off=WHOLE_OFFSET, work_bytes=WORK_BYTES, smem_bytes=r["work_off"] + WORK_BYTES)
    return r


# --- what ptxas spilled (sm_90a), learned one layout at a time -------------------------------
# Each rule names a shape whose kernels spilled although the register model above allows them,
# the evidence, and what builds instead; the lowering steps around it and explain quotes it.
# bench/build_fuzz.py finds the next one (bench/RESULTS.md, sessions 27 and 28).

def rows_spill(spec: Spec) -> str | None:
    """Why 64-row tiles are skipped, else None: a 512-wide value of several kv heads under the
    causal rule at s_q > 1 spilled 4-12 bytes at every token count tried (16 to 64: GLA-2 and
    GLA-8 of a 512 bf16 latent, groups 48, 64 and 128, pages 1 and 16, s_q 2 and 3); 32 rows
    build."""
    if spec.heads_kv > 1 and spec.d_v >= 512 and spec.causal and spec.max_query_len > 1:
        return "64-row tiles of a 512-wide value of several kv heads under the causal rule spill (ptxas)"
    return None


def tokens_cap(spec: Spec, layout: Layout, tile_m: int) -> tuple[int, str] | None:
    """The widest token count a tile of tile_m rows builds at and why, else None (64):
    - fp8 records of a 512-wide value, a scale per < 64 values, causal s_q > 1, in 64 rows:
      16 (32 tokens spilled 4 bytes in the any-stride part kernel: MLA e4m3 per 32, h_q 64 and
      128, pages 16 and 64, s_q 2; without the causal rule, or a scale per >= 64, 32 builds);
    - fp8 records of a 512-wide value (a warp's 128 accumulators) in 32 rows: 32 (12-48 bytes
      at 64: MLA at h_q 32, e4m3 per 128 at any page and s_q 1 to 4; e4m3 per 64 at pages 1, 16
      and 64 at s_q 1 and 3, e5m2 per 64, e4m3 per 32; the grid's s_q 2 causal at page 64 and
      s_q 4 causal at page 7 built; GLA's 256-wide latents build);
    - fp8 of several kv heads from several cache tensors (each tensor's per-head address live)
      in 64 rows: 32 (8-16 bytes at 64: GLA-2, separate latent, scales and shared rope, h_q 128,
      a scale per 64 or 128);
    - fp8 records of a 512-wide value and a key of no whole 64-column steps in 64 rows: 32 (8
      bytes at 64: a 32-wide rope, d_k 544; MLA and GLA-2, e5m2 per 64 and e4m3 per 128, groups
      64 and 96; bf16 and a 64-wide rope build);
    - fp8 copied in 8-byte halves (kv heads' copies 8 mod 16 apart in a packed record) in 64 rows:
      32 (8 bytes at 64 in the part kernels: GLA-2, e4m3 per 128, h_q 128, page 3)."""
    if not layout.fp8:
        return None
    groups = [s.scale.group for s in layout.sources if s.scale]
    if (tile_m == 64 and spec.d_v >= 512 and spec.causal and spec.max_query_len > 1
            and groups and min(groups) < 64):
        return 16, (f"fp8 records of a 512-wide value, a scale per {min(groups)}, causal s_q > 1 "
                    "in 64 rows: 32 tokens spill (ptxas)")
    if tile_m == 32 and spec.d_v >= 512:
        return 32, "32 rows of fp8 records of a 512-wide value: 64 tokens spill (ptxas)"
    if tile_m == 64 and len(layout.tensors) > 1 and spec.heads_kv > 1:
        return 32, "fp8 of several kv heads from several cache tensors: 64 tokens spill (ptxas)"
    if tile_m == 64 and spec.d_v >= 512 and spec.d_k % 64:
        return 32, (f"fp8 records of a 512-wide value and a {spec.d_k}-wide key in 64 rows: 64 "
                    "tokens spill (ptxas)")
    if tile_m == 64 and any(s.copy_bytes == 8 for s in layout.sources):
        return 32, "fp8 copied in 8-byte halves (kv heads 8 mod 16 bytes apart) in 64 rows: 64 tokens spill (ptxas)"
    return None


def ring_spills(tile_n: int, warps: int, stages: int) -> str | None:
    """Why a ring of `stages` tiles of tile_n tokens is skipped, else None: 8 warps (a 64-row tile
    of a 512-wide value, ~250 registers at 2 stages) over 32-token tiles with 3 or 4 stages
    spilled 4-8 bytes in the part kernels (MLA h_q 64 and 128, GLA-8 of a 512-wide latent; pages
    1, 16, 64); 16-token tiles build at 3 to 8."""
    if warps == 8 and tile_n == 32 and stages > 2:
        return f"8 warps over {tile_n}-token tiles with {stages} stages spill (ptxas)"
    return None


class MmaSyncFamily(Family):
    name = "mma_sync"
    summary = "portable mma.sync + cp.async (sm_80 and later)"
    targets = ("sm90a", "sm80")
    honours = frozenset({"tile", "stages"})
    tolerates = frozenset({"seesaw"})  # a Hopper schedule: run without it (crossover changes what
    # runs where, so a plan without it is not the one asked for: refused, at the knob)
    limits = (f"tile q in {ROWS}, tile kv a multiple of 16 up to 128, 2 to 8 stages",
              "key and value widths multiples of 16; runs on 16-byte boundaries",
              "fp8 scale groups and slices on multiples of 16 values")

    # --- what it takes ---------------------------------------------------------------------
    def _check_spec(self, spec: Spec, layout: Layout) -> None:
        for label, width in (("key", spec.d_k), ("value", spec.d_v)):
            if width % 16:
                raise Refusal(f"needs the {label} width to be a multiple of 16 (one mma "
                              f"k-step); it is {width}", spec.span_of(label))
        scale_tensors = {s.scale.tensor for s in layout.sources if s.scale}
        for i, t in enumerate(layout.tensors):
            # values move in 16-byte chunks; fp32 scales one at a time
            if t.token_stride_bytes % (SCALE_BYTES if i in scale_tensors else CHUNK_BYTES):
                raise Refusal(f"cache tensor `{t.name}` has {t.token_stride_bytes} bytes per "
                              "token: needs a multiple of 16 (4 for scales)", spec.span_of("cache"))
        for label, runs in (("key", layout.key_runs), ("value", layout.value_runs)):
            for col, width in runs:
                if col % ALIGN_ELEMS or width % ALIGN_ELEMS:
                    raise Refusal(
                        f"needs every `{label}` piece to start and end on a multiple of "
                        f"{ALIGN_ELEMS} values (16 bytes); a piece of width {width} at staged "
                        f"column {col} does not", spec.span_of(label))
        for src in layout.sources:
            if src.scale and (src.seg_lo % 16 or src.scale.group % 16):
                raise Refusal(
                    f"fp8 segment `{src.segment}`: dequantizes 16 values at a time and needs "
                    f"scale groups (per {src.scale.group}) and slices starting at a multiple of "
                    "16", spec.segment(src.segment).span)
            if off := misaligned(spec, layout, src):
                raise Refusal(off, spec.segment(src.segment).span)

    def _check_knobs(self, spec: Spec) -> None:
        sched = spec.schedule
        if sched.tile_q is not None:
            if sched.tile_q not in ROWS:
                raise Refusal(f"`tile q = {sched.tile_q}`: this kernel path takes 16, 32 or 64 "
                              "rows (whole 16-row mma tiles over 4 or 8 warps)",
                              sched.span_of("tile"), "tile")
            if sched.tile_kv % 16 or sched.tile_kv > 128:
                raise Refusal(f"`tile kv = {sched.tile_kv}`: this kernel path takes a multiple "
                              "of 16 tokens, at most 128", sched.span_of("tile"), "tile")
        if sched.stages is not None and not 2 <= sched.stages <= 8:
            raise Refusal(f"`stages {sched.stages}`: this kernel path pipelines 2 to 8 tiles",
                          sched.span_of("stages"), "stages")

    # --- the shape search --------------------------------------------------------------------
    def _shape(self, spec: Spec, layout: Layout, target: Target) -> tuple[dict, list]:
        """Tile shape, pipeline depth and warps: the schedule's knobs where given, else the
        measured defaults (falling back to narrower tiles until shared memory fits)."""
        sched = spec.schedule
        limit = target.smem_per_block
        why = []
        # Rows are sized for one query token's group, not for max_sq: a spec allowing s_q = 2
        # still runs mostly at s_q = 1, where a tile sized for both would idle half its rows
        # (measured: MLA h_q = 16 at s_q = 1 streams 2.3 TB/s with 32-row tiles). Extra query
        # tokens become extra row tiles over the same KV, re-read from L2.
        preferred = next(m for m in ROWS if m >= min(spec.group, 64))
        no_64 = None if sched.tile_q else rows_spill(spec)
        if no_64 and preferred == 64:
            preferred = 32
        # narrow values may need a taller tile for a legal warp layout: try those next
        tile_ms = [sched.tile_q] if sched.tile_q else [m for m in ROWS if m >= preferred and not (no_64 and m == 64)]
        # Measured on the H200 (bench/RESULTS.md): a 16-row tile is memory-bound and streams
        # best with 2 stages, 2 CTAs per SM and 32-token tiles, unless 32 tokens of a narrow
        # record stage less than STREAM_TILE_BYTES: then 64 (GTA-4's 192-column row, same process:
        # 79 -> 91% of 4.48 TB/s at page 64, 76 -> 89% at page 16). Wider rows want 64 tokens.
        narrow = SmemRows.of(layout.staged_width).bytes(32) < STREAM_TILE_BYTES

        stage_choices = [sched.stages] if sched.stages else [2]
        caps = {m: tokens_cap(spec, layout, m) for m in tile_ms}  # the widest token count that builds, why
        reasons = []
        ring_skipped = None  # the last deeper ring skipped for spilling (ring_spills)
        for tile_m, tile_n in ((m, n) for m in tile_ms for n in (
                [sched.tile_kv] if sched.tile_kv else
                [n for n in ([32, 16] if m == 16 and not narrow else [64, 32, 16])
                 if not caps[m] or n <= caps[m][0]])):
            for warps in WARPS:
                rows = warp_rows(spec.d_k, spec.d_v, tile_m, tile_n, warps)
                if rows is None:
                    reasons.append(f"no register-legal warp layout for tile {tile_m}x{tile_n} "
                                   f"with {warps} warps")
                    continue
                warps_n = warps // (tile_m // rows)
                for stages in stage_choices:
                    smem = smem_regions(spec.d_k, layout, tile_m, tile_n, stages, warps_n)
                    deep = ring_spills(tile_n, warps, stages)
                    if smem["smem_bytes"] <= limit and deep:
                        reasons.append(f"tile {tile_m}x{tile_n}, {stages} stages: {deep}")
                        ring_skipped = deep
                    elif smem["smem_bytes"] <= limit:
                        cap = caps[tile_m]
                        why += [("tile_m", f"`tile q = {tile_m}`" if sched.tile_q else
                                 no_64 if no_64 and tile_m == 32 else
                                 f"the group of {spec.group} query heads, in whole mma tiles"),
                                ("tile_n", f"`tile kv = {tile_n}`" if sched.tile_kv else
                                 cap[1] if cap and tile_n == cap[0] else
                                 ("measured default for 16 rows of a record staging < "
                                  f"{STREAM_TILE_BYTES // 1024} KB in 32 tokens" if tile_m == 16 and narrow
                                  else "measured default for this row count") if not reasons else
                                 "the widest default that fits shared memory" + (
                                     f" and does not spill ({ring_skipped})" if ring_skipped else "")),
                                ("stages", f"`stages {stages}`" if sched.stages else "default"),
                                ("warps", "the fewest warps with a register-legal layout"
                                 if warps == WARPS[0] else "4 warps have no legal layout"),
                                ("warp_rows", "the legal row count reading the fewest shared bytes"),
                                ("smem_bytes", f"<= {limit} B ({target.name})")]
                        return dict(tile_m=tile_m, tile_n=tile_n, stages=stages, warps=warps,
                                    warp_rows=rows, warps_n=warps_n, **smem), why
                    else:
                        reasons.append(f"tile {tile_m}x{tile_n}, {stages} stages: "
                                       f"{smem['smem_bytes']} B of shared memory > {limit}")
        knob = "tile" if sched.tile_q else ("stages" if sched.stages else "tile")
        raise Refusal("no schedule of this kernel path fits: " + "; ".join(reasons[-3:]),
                      sched.span_of(knob) or spec.span_of("name"), knob if sched.span_of(knob) else None)

    # --- policy ------------------------------------------------------------------------------
    def lower(self, spec: Spec, layout: Layout, target: Target) -> MmaSyncConfig:
        self._check_spec(spec, layout)
        self._check_knobs(spec)
        s, why = self._shape(spec, layout, target)
        d_k, d_v = spec.d_k, spec.d_v
        tile_m, tile_n, stages, warps, wr = s["tile_m"], s["tile_n"], s["stages"], s["warps"], s["warp_rows"]
        threads = warps * 32
        wm, wn = tile_m // wr, s["warps_n"]
        mt, tok = wr // 16, tile_n // wn
        nts, cols = tok // 8, d_v // wn
        nto = cols // 8
        acc = mt * nto * 4
        raw = layout.fp8
        bound = compute_bound(d_k, d_v, layout, tile_m)
        why.append(("compute_bound", f"2 tile_m (d_k + d_v) = {2 * tile_m * (d_k + d_v)} "
                    f"{'>=' if bound else '<'} 64 x {layout.raw_pitch} record bytes per kv head"))

        # qk_split: S = Q K^T split over d_k between the two warps wn = 2 wt + wk of a pair, so
        # a Q fragment serves 2 TN tokens (half the Q reads, for tile_m tile_n fp32 exchanged).
        # Legal with an even WN, <= 32 registers of partial S and key runs on multiples of 32
        # columns; on where it pays and fits: compute-bound plans (H200: +9% on MLA h_q 128,
        # at ~250 registers) and plans with an O accumulator of <= 64 registers (+5% on
        # memory-bound MLA h_q 16); off for the others (a 32-row warp of 128 accumulators in a
        # memory-bound plan spilled).
        runs32 = all(c % 32 == 0 and w % 32 == 0 for c, w in layout.key_runs)
        qk_legal = wn % 2 == 0 and wr * 2 * tok // 32 <= MAX_SCORE_REGS and runs32
        qk_split = qk_legal and (bound or acc <= 64)
        why.append(("qk_split", "on: legal and " + ("compute-bound" if bound else
                    f"{acc} accumulator registers <= 64") if qk_split else
                    "off: " + ("not legal (odd WN, > 32 partial-S registers or key runs off "
                               "32-column boundaries)" if not qk_legal else
                               f"memory-bound with {acc} accumulator registers")))
        qk_n_tiles = 2 * nts if qk_split else nts
        qk_steps = d_k // 32 if qk_split else d_k // 16
        qk_chains = 1 if mt * qk_n_tiles >= 4 else 4 // (mt * qk_n_tiles)

        # ping_pong: two row groups drift up to half a KV step apart, so that one group's
        # softmax overlaps the other's products; row group 1 alone copies tiles. Legal with two
        # row groups, two stages, 16-bit staging and tile_n <= 32 WN; on when compute-bound
        # (H200: +5% on MLA h_q 128; GLA-2 h_q 128 within 1%).
        pp_legal = wm == 2 and stages == 2 and not raw and tile_n <= wn * 32
        ping_pong = pp_legal and bound
        why.append(("ping_pong", "on: two row groups, two stages, compute-bound" if ping_pong else
                    "off: " + ("not legal (needs two row groups, two stages, 16-bit staging)"
                               if not pp_legal else "memory-bound")))
        copy_threads = wn * 32 if ping_pong else threads

        # copy_interleave: spread the next tile's copies over the k-steps of S = Q K^T (their
        # issue hides behind ldmatrix latency) when compute-bound without ping_pong (H200: fp8
        # MLA h_q 128 202 vs 191 TFLOP/s); else all at the top of the step (more bytes in
        # flight sooner). With ping_pong the producer waits for its copies right after
        # S = Q K^T, so they go at the top (MLA h_q 128 351 vs 322 TFLOP/s).
        # Raw staging of a record of several kv heads, or of several cache tensors into 64-row
        # tiles, keeps each run's per-head address live through the step: interleaved, GLA-2's
        # fp8 latent and shared rope spilled 24-36 bytes, a separate fp8 MLA cache (latent,
        # scales, rope) at h_q 64 and 128 4 bytes (ptxas; at 32 rows it builds interleaved, and
        # spilled 16 bytes with its copies at the top, token-major).
        raw_tensors = raw and len(layout.tensors) > 1 and tile_m >= 64
        raw_heads = raw and spec.heads_kv > 1 or raw_tensors
        interleave = bound and not ping_pong and not raw_heads
        why.append(("copy_interleave", "on: compute-bound without ping_pong" if interleave else
                    "off: " + ("ping_pong waits for its copies after S = Q K^T" if ping_pong
                               else "raw staging of several kv heads (or cache tensors, 64 rows): their "
                               "run addresses would stay live through S = Q K^T (spilled)" if bound and raw_heads
                               else "memory-bound: all copies at the top of the step")))
        copy_steps = qk_steps // 2 if ping_pong else qk_steps

        # Token-major copies (8 threads a token: one slot read per token, shared addresses a
        # constant plus one per-thread value) keep a pointer per pass and source live through
        # the step: fine at the top of the step, at most 2 through interleaved S = Q K^T
        # (4 spilled); else chunk-major.
        passes = tile_n * 8 // copy_threads if tile_n * 8 % copy_threads == 0 else 0
        can_token_major = passes >= 1 and (raw or all((src.smem_col // 8) % 8 == 0
                                                      for src in layout.sources))
        token_major = can_token_major and (not interleave or passes * len(layout.sources) <= 2)
        why.append(("copy_token_major", "on: 8 threads per token" if token_major else
                    "off: " + ("interleaved copies would keep too many pointers live"
                               if can_token_major else "tile_n * 8 not a multiple of the copy "
                               "threads, or runs off 64-column boundaries")))

        # Named barriers: 0 (__syncthreads), 1 .. WM (row groups), one per qk_split pair, then
        # ping_pong's FULL and EMPTY pairs.
        pair0 = wm + 1
        full0 = pair0 + (warps // 2 if qk_split else 0)
        empty0 = full0 + 2
        barriers = empty0 + (2 if ping_pong else 0)
        if barriers > target.named_barriers:
            raise Refusal(f"needs {barriers} named barriers, more than {target.named_barriers}",
                          spec.span_of("heads"))
        if qk_split and wn * (mt * nts * 4 // 2 * 4 * 32) > s["p_rows"].bytes(wr):
            raise Refusal("qk_split's exchange slots do not fit the row group's P rows",
                          spec.span_of("heads"))
        regs = min(target.max_registers_per_thread, target.registers_per_sm // threads)
        ready, ready_why = ready_words(spec, target)
        blocks, blocks_why = combine_blocks(spec, ready)
        tight_rows, slack_tiles, slack_why = whole_slack(spec, tile_n)
        cost, cost_why = piece_cost(False)
        return MmaSyncConfig(
            tile_m=tile_m, tile_n=tile_n, stages=stages, threads=threads,
            smem_bytes=s["smem_bytes"], registers=regs, compute_bound=bound,
            dependent_launch=target.dependent_launch, ready_words=ready, combine_blocks=blocks,
            whole_parts=True, whole_tight_rows=tight_rows, whole_slack_tiles=slack_tiles, piece_cost_tiles=cost, warps=warps, warp_rows=wr, warps_m=wm, warps_n=wn, m_tiles=mt, tokens_per_warp=tok,
            score_n_tiles=nts, value_cols_per_warp=cols, value_n_tiles=nto, acc_registers=acc,
            raw_staging=raw, qk_split=qk_split, qk_n_tiles=qk_n_tiles, qk_steps=qk_steps,
            qk_chains=qk_chains, pair_slot_bytes=mt * nts * 4 // 2 * 4 * 32,
            ping_pong=ping_pong, copy_threads=copy_threads, copy_interleave=interleave,
            copy_steps=copy_steps, copy_token_major=token_major,
            q_rows=s["q_rows"], kv_rows=s["kv_rows"], p_rows=s["p_rows"],
            kv_buffers=s["kv_buffers"], kv_tile_bytes=s["kv_tile_bytes"],
            raw_tile_bytes=s["raw_tile_bytes"], q_off=s["q_off"], kv_off=s["kv_off"],
            raw_off=s["raw_off"], p_off=s["p_off"], slot_off=s["slot_off"], slot_pitch=s["slot_pitch"],
            hole_words=s["hole_words"], red_off=s["red_off"],
            work_off=s["work_off"], walk_off=s["walk_off"], whole_off=s["whole_off"],
            work_bytes=s["work_bytes"],
            row_group_barrier0=1, pair_barrier0=pair0, full_barrier0=full0,
            empty_barrier0=empty0, barriers=barriers,
            why=tuple(why) + (("registers", f"launch bounds ({threads} threads, 1 CTA): "
                               f"{regs} per thread"),
                              DEPENDENT_LAUNCH_WHY[target.dependent_launch], ready_why, blocks_why,
                              WHOLE_PARTS_WHY) + slack_why + (cost_why,))
