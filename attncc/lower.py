"""Checked IR + schedule → kernel plan: everything the CUDA template needs, as numbers.

The plan is the single source of the kernel's constants (rendered as named constexprs)
and of the JIT cache key. Where a schedule cannot run on this kernel path (tile shapes,
shared memory, registers, alignment), lowering raises a SpecError at the knob."""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass, field

from . import storage
from .errors import SpecError
from .ir import DTYPES, SCALE_BYTES, Spec

NUM_SMS = {"sm90a": 132, "sm80": 108}   # H200 / A100; the launch reads the real count
SMEM_LIMIT = {"sm90a": 227 * 1024, "sm80": 163 * 1024}
MAX_ACC_REGS = 128   # fp32 output accumulators per thread (255 registers, no spills)
MAX_SCORE_REGS = 32  # fp32 scores per thread
WARPS = (4, 8)       # warps per CTA the decode kernel is written for
ALIGN_ELEMS = 8                         # 16-byte ldmatrix rows / cp.async chunks of 16-bit data
HOPPER_ONLY_KNOBS = ("seesaw", "crossover")


@dataclass(frozen=True)
class TensorPlan:
    name: str
    token_stride_bytes: int


@dataclass(frozen=True)
class ScalePlan:
    tensor: int
    offset_bytes: int
    head_stride_bytes: int
    group: int


@dataclass(frozen=True)
class SourcePlan:
    """A run [seg_lo, seg_lo + width) of one segment, staged into shared memory at
    column smem_col as 16-bit values (fp8 dequantized with its group's scale)."""

    segment: str
    tensor: int
    offset_bytes: int
    head_stride_bytes: int
    width: int
    dtype: str
    seg_lo: int
    scale: ScalePlan | None
    smem_col: int


@dataclass(frozen=True)
class Plan:
    name: str
    elem: str
    heads_q: int
    heads_kv: int
    group: int
    max_sq: int
    causal: bool
    sparse: bool
    topk: int
    page_size: int
    d_k: int
    d_v: int
    tensors: tuple[TensorPlan, ...]
    sources: tuple[SourcePlan, ...]
    staged_width: int
    key_runs: tuple[tuple[int, int], ...]
    value_runs: tuple[tuple[int, int], ...]
    tile_m: int
    tile_n: int
    stages: int
    warps: int
    warp_rows: int
    split_kv: str | int
    target: str
    num_sms: int
    smem_bytes: int
    compute_bound: bool  # sets the kernel's defaults and, with split_kv auto, balanced parts
    not_applied: tuple[str, ...] = field(default=())  # schedule knobs this path ignores

    def template_dict(self) -> dict:
        """The plan as the template reads it (also the canonical form for hashing)."""
        return asdict(self)

    def canonical_json(self) -> str:
        return json.dumps(self.template_dict(), sort_keys=True, separators=(",", ":"))

    def __call__(self, seqlens, s_q: int = 1, num_sms: int | None = None) -> "DecodeMetadata":
        """Scheduling metadata for one decode step, shared by all layers of that step
        (`k.plan(seqlens)`): the split count from the longest sequence actually present
        instead of the block table's capacity. Reads seqlens once (a host sync). Plans that
        balance parts need no lengths on the host: their count stays 0 (chosen at launch)."""
        lengths = [int(x) for x in (seqlens.tolist() if hasattr(seqlens, "tolist") else seqlens)]
        longest = self.topk if self.sparse else max(lengths + [0])
        if balanced(self):
            return DecodeMetadata(0, longest)
        sms = num_sms or self.num_sms
        return DecodeMetadata(num_splits(self, len(lengths), s_q, longest, sms), longest)

    def explain_lines(self) -> tuple[str, ...]:
        lines = [
            f"plan: {self.target} mma.sync path, tile {self.tile_m} rows x {self.tile_n} tokens, "
            f"{self.stages} stages, {self.warps} warps, {self.smem_bytes} B shared memory",
            f"  staged token row: {self.staged_width} x {self.elem} from "
            + ", ".join(f"{s.segment}[{s.seg_lo}:{s.seg_lo + s.width}]" for s in self.sources),
            (f"  split_kv {self.split_kv}: balanced, all sequences' KV tiles cut into equal parts, one "
             f"per SM (row blocks x kv heads CTAs each)" if balanced(self) else
             f"  split_kv {self.split_kv} (count chosen per call from batch, heads and {self.num_sms} SMs)"),
        ]
        lines += [f"  note: `{k}` is not yet applied on this path (Hopper schedules come later)"
                  for k in self.not_applied]
        return tuple(lines)


@dataclass(frozen=True)
class DecodeMetadata:
    num_splits: int
    longest: int


def balanced(plan: Plan) -> bool:
    """split_kv auto on a compute-bound plan: cut the tiles of all sequences into equal
    parts (schedule.cuh) rather than each sequence into equal splits. Memory-bound plans
    keep splits: they run several CTAs per SM, which already evens out the waves."""
    return plan.split_kv == "auto" and plan.compute_bound


def lanes(plan: Plan, s_q: int) -> int:
    """CTAs that read the same KV tiles: row blocks x kv heads."""
    rows = plan.group * (1 if plan.sparse else s_q)
    return plan.heads_kv * math.ceil(rows / plan.tile_m)


def num_parts(plan: Plan, s_q: int, sms: int, ctas_per_sm: int) -> int:
    """Parts of a balanced launch: as many as fill the SMs once, lanes CTAs each."""
    return max(1, sms * max(ctas_per_sm, 1) // lanes(plan, s_q))


MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (prologue, combine) dominates


def num_splits(plan: Plan, batch: int, s_q: int, kv_tokens: int, sms: int) -> int:
    """Split-KV count: enough CTAs to fill the SMs when batch x heads x row tiles does
    not, never so many that a split holds fewer than MIN_TOKENS_PER_SPLIT tokens."""
    if plan.split_kv == "off":
        return 1
    tiles = max(1, math.ceil(kv_tokens / plan.tile_n))
    if isinstance(plan.split_kv, int):
        return max(1, min(plan.split_kv, tiles))
    units = batch * (s_q if plan.sparse else 1) * lanes(plan, s_q)
    most = max(1, kv_tokens // max(plan.tile_n, MIN_TOKENS_PER_SPLIT))
    return max(1, min(most, math.ceil(sms / max(units, 1))))


def _used_intervals(spec: Spec) -> dict[str, list[list[int]]]:
    """Per segment, the merged ranges the key or the value reads (each loaded once)."""
    ranges: dict[str, list[list[int]]] = {}
    for piece in spec.key + spec.value:
        ranges.setdefault(piece.segment, []).append([piece.lo, piece.hi])
    merged = {}
    for name, spans in ranges.items():
        spans.sort()
        out = [spans[0][:]]
        for lo, hi in spans[1:]:
            if lo <= out[-1][1]:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        merged[name] = out
    return merged


def _tensors(spec: Spec) -> tuple[TensorPlan, ...]:
    layouts = storage.tensor_layouts(spec, 1)
    return tuple(TensorPlan(name, _token_bytes(shape, dtype)) for name, (shape, dtype) in layouts.items())


def _token_bytes(shape, dtype) -> int:
    n = 1
    for s in shape[2:]:
        n *= s
    return n * dtype.itemsize


def _sources(spec: Spec, tensors: tuple[TensorPlan, ...]) -> tuple[SourcePlan, ...]:
    index = {t.name: i for i, t in enumerate(tensors)}
    used = _used_intervals(spec)
    sources, col = [], 0
    for seg in spec.segments:  # record order: reads walk the record forward
        for lo, hi in used.get(seg.name, []):
            elt = seg.dtype.bytes
            if spec.separate:
                tensor, base, head = index[seg.name], lo * elt, 0 if seg.shared else seg.values_bytes
                scale = (ScalePlan(index[storage.scale_name(seg)], 0,
                                   0 if seg.shared else seg.scales_per_copy * SCALE_BYTES,
                                   seg.scale_group) if seg.scale_group else None)
            else:
                tensor, base, head = 0, seg.offset + lo * elt, seg.head_stride
                scale = (ScalePlan(0, seg.offset + seg.values_bytes, seg.head_stride, seg.scale_group)
                         if seg.scale_group else None)
            sources.append(SourcePlan(seg.name, tensor, base, head, hi - lo, seg.dtype.name, lo,
                                      scale, col))
            col += hi - lo
    return tuple(sources)


def _runs(spec: Spec, pieces, sources) -> tuple[tuple[int, int], ...]:
    """Key or value as runs of staged columns; adjacent runs merged."""
    runs: list[list[int]] = []
    for piece in pieces:
        src = next(s for s in sources if s.segment == piece.segment
                   and s.seg_lo <= piece.lo and piece.hi <= s.seg_lo + s.width)
        col = src.smem_col + piece.lo - src.seg_lo
        if runs and runs[-1][0] + runs[-1][1] == col:
            runs[-1][1] += piece.width
        else:
            runs.append([col, piece.width])
    return tuple((c, w) for c, w in runs)


# --- resources: mirrors the formulas documented at the top of include/attncc/decode.cuh --

def _pitch_bytes(width: int) -> int:
    """Shared-memory row pitch of `width` 16-bit values (XOR swizzle or one pad chunk)."""
    chunks = width // 8
    return 16 * (chunks if chunks % 8 == 0 or chunks % 2 == 1 else chunks + 1)


def _pad16(n: int) -> int:
    return (n + 15) // 16 * 16


def _raw_pitch(sources) -> int:
    """Bytes of one token's fp8 sources as copied from global memory, before dequantizing."""
    total = 0
    for s in sources:
        scales = 0
        if s.scale:
            scales = (s.seg_lo + s.width - 1) // s.scale.group - s.seg_lo // s.scale.group + 1
        total += _pad16(s.width * DTYPES[s.dtype].bytes) + _pad16(scales * SCALE_BYTES)
    return total


WORK_STASH_BYTES = 128  # decode.cuh's kWorkBytes: the CTA's work and its part walk


def compute_bound(d_k: int, d_v: int, sources, tile_m: int) -> bool:
    """A tile's math per byte of cache, 2 tile_m (d_k + d_v) / record bytes per kv head,
    >= 64: shared memory and the tensor pipe, not the copies, bound the KV step."""
    return 2 * tile_m * (d_k + d_v) >= 64 * _raw_pitch(sources)


def smem_bytes(d_k: int, staged: int, sources, tile_m: int, tile_n: int, stages: int,
               warps_n: int) -> int:
    raw = any(DTYPES[s.dtype].is_fp8 for s in sources)
    return (tile_m * _pitch_bytes(d_k)
            + (1 if raw else stages) * tile_n * _pitch_bytes(staged)
            + (stages * tile_n * _raw_pitch(sources) if raw else 0)
            + tile_m * _pitch_bytes(tile_n)
            + (stages + 1) * tile_n * 4
            + warps_n * tile_m * 4
            + WORK_STASH_BYTES)


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


def kernel_shape(spec: Spec, staged: int, sources) -> dict:
    """Tile shape, pipeline depth and warps: the schedule's knobs where given, else the
    measured defaults (falling back to narrower tiles until shared memory fits). Raises
    at the knob when a given value cannot work."""
    sched, target = spec.schedule, spec.schedule.target
    limit = SMEM_LIMIT[target]
    if sched.tile_q is not None:
        if sched.tile_q not in (16, 32, 64):
            _fail(spec, "tile", f"`tile q = {sched.tile_q}`: this kernel path takes 16, 32 or 64 "
                  "rows (whole 16-row mma tiles over 4 or 8 warps)")
        if sched.tile_kv % 16 or sched.tile_kv > 128:
            _fail(spec, "tile", f"`tile kv = {sched.tile_kv}`: this kernel path takes a multiple "
                  "of 16 tokens, at most 128")
    if sched.stages is not None and not 2 <= sched.stages <= 8:
        _fail(spec, "stages", f"`stages {sched.stages}`: this kernel path pipelines 2 to 8 tiles")
    # Rows are sized for one query token's group, not for max_sq: a spec allowing s_q = 2
    # still runs mostly at s_q = 1, where a tile sized for both would idle half its rows
    # (measured: MLA h_q = 16 at s_q = 1 streams 2.3 TB/s with 32-row tiles). Extra query
    # tokens become extra row tiles over the same KV, re-read from L2.
    preferred = next(m for m in (16, 32, 64) if m >= min(spec.group, 64))
    # narrow values may need a taller tile for a legal warp layout: try those next
    tile_ms = [sched.tile_q] if sched.tile_q else [m for m in (16, 32, 64) if m >= preferred]
    # Measured on the H200 (bench/RESULTS.md): a 16-row tile is memory-bound and streams
    # best with 32-token tiles, 2 stages and 2 CTAs per SM; wider rows want 64 tokens.
    stage_choices = [sched.stages] if sched.stages else [2]
    reasons = []
    for tile_m, tile_n in ((m, n) for m in tile_ms for n in (
            [sched.tile_kv] if sched.tile_kv else ([32, 16] if m == 16 else [64, 32, 16]))):
        for warps in WARPS:
            rows_per_warp = warp_rows(spec.d_k, spec.d_v, tile_m, tile_n, warps)
            if rows_per_warp is None:
                reasons.append(f"no register-legal warp layout for tile {tile_m}x{tile_n} "
                               f"with {warps} warps")
                continue
            warps_n = warps // (tile_m // rows_per_warp)
            for stages in stage_choices:
                smem = smem_bytes(spec.d_k, staged, sources, tile_m, tile_n, stages, warps_n)
                if smem <= limit:
                    return dict(tile_m=tile_m, tile_n=tile_n, stages=stages, warps=warps,
                                warp_rows=rows_per_warp, smem_bytes=smem)
                reasons.append(f"tile {tile_m}x{tile_n}, {stages} stages: {smem} B of shared "
                               f"memory > {limit}")
    knob = "tile" if sched.tile_q else ("stages" if sched.stages else "tile")
    _fail(spec, knob, "no schedule of this kernel path fits: " + "; ".join(reasons[-3:]))


class UnsupportedSpec(SpecError):
    """A valid spec this kernel path cannot take (widths, alignment): the reference still
    runs it on CPU; a CUDA call reports this."""


def _check_widths(spec: Spec) -> None:
    for label, width in (("key", spec.d_k), ("value", spec.d_v)):
        if width % 16:
            raise UnsupportedSpec(f"this kernel path needs the {label} width to be a multiple of "
                                  f"16 (one mma k-step); it is {width}", spec.source,
                                  spec.span_of(label))


def _fail(spec: Spec, knob: str, message: str):
    raise SpecError(message, spec.source, spec.schedule.span_of(knob) or spec.span_of("name"))


def _check_alignment(spec: Spec, sources, key_runs, value_runs) -> None:
    """The kernel moves 16-byte chunks and feeds ldmatrix 8-element rows."""
    for label, runs in (("key", key_runs), ("value", value_runs)):
        for col, width in runs:
            if col % ALIGN_ELEMS or width % ALIGN_ELEMS:
                raise UnsupportedSpec(
                    f"this kernel path needs every `{label}` piece to start and end on a multiple "
                    f"of {ALIGN_ELEMS} values (16 bytes); a piece of width {width} at staged "
                    f"column {col} does not", spec.source, spec.span_of(label))
    for src in sources:
        if src.scale and (src.seg_lo % 16 or src.scale.group % 16):
            raise UnsupportedSpec(
                f"fp8 segment `{src.segment}`: this kernel path dequantizes 16 values at a time "
                f"and needs scale groups (per {src.scale.group}) and slices starting at a "
                "multiple of 16", spec.source, spec.segment(src.segment).span)
        if src.offset_bytes % 16 or src.head_stride_bytes % 16:
            raise UnsupportedSpec(
                f"segment `{src.segment}` starts at byte {src.offset_bytes} of the record (head "
                f"stride {src.head_stride_bytes}): this kernel path needs 16-byte alignment",
                spec.source, spec.segment(src.segment).span)


def lower(spec: Spec) -> Plan:
    """Resolve the spec and its schedule to a kernel plan, or raise at the knob."""
    sched = spec.schedule
    _check_widths(spec)
    tensors = _tensors(spec)
    if len(tensors) > 8:
        raise UnsupportedSpec(f"separate storage with {len(tensors)} tensors: this kernel path "
                        "takes at most 8", spec.source, spec.span_of("cache"))
    scale_tensors = {storage.scale_name(s) for s in spec.segments if s.scale_group}
    for t in tensors:
        # values move in 16-byte chunks; fp32 scales one at a time
        if t.token_stride_bytes % (SCALE_BYTES if t.name in scale_tensors else 16):
            raise UnsupportedSpec(f"cache tensor `{t.name}` has {t.token_stride_bytes} bytes per "
                            "token: this kernel path needs a multiple of 16 (4 for scales)", spec.source,
                            spec.span_of("cache"))
    sources = _sources(spec, tensors)
    key_runs, value_runs = _runs(spec, spec.key, sources), _runs(spec, spec.value, sources)
    _check_alignment(spec, sources, key_runs, value_runs)
    staged = sum(s.width for s in sources)
    shape = kernel_shape(spec, staged, sources)
    shape["compute_bound"] = compute_bound(spec.d_k, spec.d_v, sources, shape["tile_m"])
    not_applied = tuple(k for k in HOPPER_ONLY_KNOBS if getattr(sched, k))
    for knob in not_applied:
        warnings.warn(f"{spec.source.filename}: `{knob}` is not yet applied: attncc runs "
                      f"`{spec.name}` on the portable mma.sync path", stacklevel=4)
    return Plan(
        name=spec.name, elem=spec.elem.name, heads_q=spec.heads_q, heads_kv=spec.heads_kv,
        group=spec.group, max_sq=spec.max_query_len, causal=spec.causal, sparse=spec.sparse,
        topk=spec.topk, page_size=spec.page_size, d_k=spec.d_k, d_v=spec.d_v,
        tensors=tensors, sources=sources, staged_width=staged, key_runs=key_runs,
        value_runs=value_runs, split_kv=sched.split_kv, target=sched.target,
        num_sms=NUM_SMS[sched.target], not_applied=not_applied, **shape)
