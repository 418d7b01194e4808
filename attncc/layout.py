"""The record layout as kernels read and write it, from the checked IR alone (no kernel
family's choices): which cache tensors there are, which runs of which segments a kernel stages
(each cache element once, in record order, into one 16-bit row per token), where the key and the
value sit in that row, the raw row an fp8 record is copied into before dequantization, and
where write_cache's kernel stores each segment (and its scales)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from . import storage
from .ir import DTYPES, SCALE_BYTES, Spec

CHUNK_BYTES = 16  # every copy of the cache moves 16-byte chunks (cp.async, TMA, 128-bit loads)


@dataclass(frozen=True)
class TensorPlan:
    name: str
    token_stride_bytes: int  # a token's bytes in the tensor (its stride when contiguous)
    head_axis: bool          # kv heads are a dimension of the tensor (a separate per-head
                             # segment), with a stride of the view's; else a place in the record


@dataclass(frozen=True)
class ScalePlan:
    tensor: int
    offset_bytes: int
    head_stride_bytes: int
    group: int
    first_group: int   # the segment's scale group of the run's first value
    count: int         # scales covering the run


@dataclass(frozen=True)
class SourcePlan:
    """A run [seg_lo, seg_lo + width) of one segment, staged into shared memory at column
    smem_col as 16-bit values (fp8 dequantized with its group's scale). In a raw row (fp8
    records) its bytes sit at raw_offset and its scales at raw_scale_offset. copy_bytes: the
    size of the cp.async copies that read it (16; 8 for an fp8 run whose kv heads' copies sit
    8 mod 16 bytes apart in a packed record, each 16-byte chunk then copied as two halves)."""

    segment: str
    tensor: int
    offset_bytes: int
    head_stride_bytes: int
    width: int
    dtype: str
    seg_lo: int
    scale: ScalePlan | None
    smem_col: int
    raw_offset: int
    raw_scale_offset: int
    copy_bytes: int = 16

    @property
    def data_bytes(self) -> int:
        return self.width * DTYPES[self.dtype].bytes


@dataclass(frozen=True)
class StorePlan:
    """Where write_cache stores segment `segment` (spec order): copy j (kv head j; one copy
    when shared) of a token's values at tensors[tensor] + (token offset) + offset_bytes +
    j * head stride, `dim` values of `dtype`; an fp8 segment's fp32 scales (one per
    scale_group values) at tensors[scale_tensor] + (token offset) + scale_offset_bytes +
    j * (its head stride). A head stride is the view's where the tensor has a head axis,
    else head_stride_bytes (a place in the record)."""

    segment: str
    tensor: int
    offset_bytes: int
    head_stride_bytes: int
    copies: int
    dim: int
    dtype: str
    scale_group: int         # 0: a 16-bit segment, no scales
    scale_tensor: int        # -1: none
    scale_offset_bytes: int
    scale_head_stride_bytes: int
    max_finite: float        # fp8: the quantization range (ir.DTYPES); 0 for a 16-bit segment


@dataclass(frozen=True)
class Layout:
    tensors: tuple[TensorPlan, ...]
    sources: tuple[SourcePlan, ...]
    staged_width: int                       # 16-bit columns of a staged token row
    key_runs: tuple[tuple[int, int], ...]   # (staged column, width), adjacent runs merged
    value_runs: tuple[tuple[int, int], ...]
    raw_pitch: int  # bytes of one token's raw row: each run then its scales, 16-byte padded
    fp8: bool       # some run is fp8: kernels stage the record raw, then dequantize
    stores: tuple[StorePlan, ...]  # every segment, whole, as write_cache stores it


def pad16(n: int) -> int:
    return -(-n // CHUNK_BYTES) * CHUNK_BYTES


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


def _token_bytes(shape, dtype) -> int:
    n = 1
    for s in shape[2:]:
        n *= s
    return n * dtype.itemsize


def _tensors(spec: Spec) -> tuple[TensorPlan, ...]:
    layouts = storage.tensor_layouts(spec, 1)
    return tuple(TensorPlan(name, _token_bytes(shape, dtype), len(shape) == 4)
                 for name, (shape, dtype) in layouts.items())


def _sources(spec: Spec, tensors: tuple[TensorPlan, ...]) -> tuple[SourcePlan, ...]:
    index = {t.name: i for i, t in enumerate(tensors)}
    used = _used_intervals(spec)
    sources, col, raw = [], 0, 0
    for seg in spec.segments:  # record order: reads walk the record forward
        for lo, hi in used.get(seg.name, []):
            elt = seg.dtype.bytes
            scale = None
            if seg.scale_group:
                first = lo // seg.scale_group
                count = (hi - 1) // seg.scale_group - first + 1
            if spec.separate:
                tensor, base, head = index[seg.name], lo * elt, 0 if seg.shared else seg.values_bytes
                if seg.scale_group:
                    scale = ScalePlan(index[seg.scale_tensor], 0,
                                      0 if seg.shared else seg.scales_per_copy * SCALE_BYTES,
                                      seg.scale_group, first, count)
            else:
                tensor, base, head = 0, seg.offset + lo * elt, seg.head_stride
                if seg.scale_group:
                    scale = ScalePlan(0, seg.offset + seg.values_bytes, seg.head_stride,
                                      seg.scale_group, first, count)
            data = pad16((hi - lo) * elt)
            sources.append(SourcePlan(seg.name, tensor, base, head, hi - lo, seg.dtype.name, lo,
                                      scale, col, raw, raw + data, _copy_bytes(seg, base, head)))
            col += hi - lo
            raw += data + (pad16(scale.count * SCALE_BYTES) if scale else 0)
    return tuple(sources)


def _copy_bytes(seg, base: int, head_stride: int) -> int:
    """The cp.async size of a run at `base` whose kv heads' copies are `head_stride` bytes apart:
    8 for an fp8 run with more than one copy 8 mod 16 bytes apart (its values and scales: 256
    e4m3 and 2 fp32 scales make 264 bytes) from a 16-byte aligned first byte, else 16 (the
    families refuse a run misaligned otherwise, base.misaligned)."""
    if seg.dtype.is_fp8 and seg.copies > 1 and base % 16 == 0 and head_stride % 16 == 8:
        return 8
    return 16


def _stores(spec: Spec, tensors: tuple[TensorPlan, ...]) -> tuple[StorePlan, ...]:
    index = {t.name: i for i, t in enumerate(tensors)}
    stores = []
    for seg in spec.segments:
        if spec.separate:  # a per-head tensor's head stride is the view's (head axis)
            place = (index[seg.name], 0, 0)
            scale = (index[seg.scale_tensor], 0, 0) if seg.scale_group else (-1, 0, 0)
        else:
            place = (0, seg.offset, seg.head_stride)
            scale = (0, seg.offset + seg.values_bytes, seg.head_stride) if seg.scale_group else (-1, 0, 0)
        stores.append(StorePlan(seg.name, *place, seg.copies, seg.dim, seg.dtype.name,
                                seg.scale_group, *scale, seg.dtype.max_finite))
    return tuple(stores)


def _runs(pieces, sources) -> tuple[tuple[int, int], ...]:
    """Key or value as runs of staged columns; adjacent runs merged. Linear in the pieces
    (each found among its segment's sources by bisection)."""
    by_segment: dict[str, list[SourcePlan]] = {}
    for s in sources:  # in seg_lo order within a segment
        by_segment.setdefault(s.segment, []).append(s)
    starts = {name: [s.seg_lo for s in srcs] for name, srcs in by_segment.items()}
    runs: list[list[int]] = []
    for piece in pieces:
        src = by_segment[piece.segment][bisect.bisect_right(starts[piece.segment], piece.lo) - 1]
        assert src.seg_lo <= piece.lo and piece.hi <= src.seg_lo + src.width
        col = src.smem_col + piece.lo - src.seg_lo
        if runs and runs[-1][0] + runs[-1][1] == col:
            runs[-1][1] += piece.width
        else:
            runs.append([col, piece.width])
    return tuple((c, w) for c, w in runs)


def layout(spec: Spec) -> Layout:
    tensors = _tensors(spec)
    sources = _sources(spec, tensors)
    last = sources[-1]
    raw_pitch = last.raw_scale_offset + (pad16(last.scale.count * SCALE_BYTES) if last.scale else 0)
    return Layout(tensors=tensors, sources=sources, staged_width=sum(s.width for s in sources),
                  key_runs=_runs(spec.key, sources), value_runs=_runs(spec.value, sources),
                  raw_pitch=raw_pitch, fp8=any(DTYPES[s.dtype].is_fp8 for s in sources),
                  stores=_stores(spec, tensors))
