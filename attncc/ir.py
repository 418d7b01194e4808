"""The checked IR: everything a kernel, the reference and `explain` need, resolved to
numbers. Frozen values only; `canonical()` is the identity of a spec (no positions)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from .errors import Source, Span


@dataclass(frozen=True)
class DType:
    name: str
    bytes: int
    torch_name: str          # attribute of `torch`
    max_finite: float = 0.0  # fp8 only: the quantization range

    @property
    def is_fp8(self) -> bool:
        return self.bytes == 1


DTYPES = {
    "bf16": DType("bf16", 2, "bfloat16"),
    "fp16": DType("fp16", 2, "float16"),
    "e4m3": DType("e4m3", 1, "float8_e4m3fn", 448.0),
    "e5m2": DType("e5m2", 1, "float8_e5m2", 57344.0),
}
SCALE_DTYPES = {"fp32": 4}
SCALE_BYTES = SCALE_DTYPES["fp32"]


KERNEL_INT_MAX = 2**31 - 1  # kernels count rows and address a record with 32-bit ints


def scale_tensor_name(segment: str) -> str:
    """A `separate` cache stores the scales of fp8 segment `segment` in this tensor."""
    return f"{segment}_scale"


@dataclass(frozen=True)
class Segment:
    """One field of the per-token record. Packed layout: `copies` consecutive copies
    (one per kv head, or one if shared), each `values` then its fp32 scales."""

    name: str
    dtype: DType
    dim: int
    shared: bool
    copies: int
    scale_group: int  # values per fp32 scale; 0 for a 16-bit segment
    offset: int       # bytes from the record's start (packed storage)
    span: Span = field(compare=False, repr=False)

    @property
    def values_bytes(self) -> int:
        return self.dim * self.dtype.bytes

    @property
    def scales_per_copy(self) -> int:
        return self.dim // self.scale_group if self.scale_group else 0

    @property
    def copy_bytes(self) -> int:
        return self.values_bytes + self.scales_per_copy * SCALE_BYTES

    @property
    def scale_tensor(self) -> str:
        """In a `separate` cache, the name of the tensor holding this segment's scales."""
        return scale_tensor_name(self.name)

    @property
    def head_stride(self) -> int:
        """Bytes between kv head j and j+1 (0: every head reads the one shared copy)."""
        return 0 if self.shared else self.copy_bytes

    @property
    def bytes(self) -> int:
        return self.copies * self.copy_bytes


@dataclass(frozen=True)
class Slice:
    segment: str
    lo: int
    hi: int

    @property
    def width(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Schedule:
    target: str = "sm90a"
    split_kv: str | int = "auto"  # "auto", "off", or a fixed count
    seesaw: bool = False
    crossover: bool = False
    tile_q: int | None = None
    tile_kv: int | None = None
    stages: int | None = None
    spans: tuple = field(default=(), compare=False, repr=False)  # (knob, Span) pairs

    def span_of(self, knob: str) -> Span | None:
        return dict(self.spans).get(knob)


@dataclass(frozen=True)
class Spec:
    name: str
    heads_q: int
    heads_kv: int
    page_size: int
    separate: bool
    segments: tuple[Segment, ...]
    key: tuple[Slice, ...]
    value: tuple[Slice, ...]
    max_query_len: int
    causal: bool
    topk: int                 # 0: dense (block table); > 0: sparse top-k indices
    softmax_scale: float
    schedule: Schedule
    source: Source = field(compare=False, repr=False)
    spans: tuple = field(default=(), compare=False, repr=False)  # (statement, Span) pairs

    # --- derived numbers -------------------------------------------------------------
    @property
    def group(self) -> int:
        """Query heads per kv head: query head i reads kv head i // group."""
        return self.heads_q // self.heads_kv

    @property
    def d_k(self) -> int:
        return sum(s.width for s in self.key)

    @property
    def d_v(self) -> int:
        return sum(s.width for s in self.value)

    @property
    def sparse(self) -> bool:
        return self.topk > 0

    @property
    def record_bytes(self) -> int:
        """Cache bytes per token (one layer, all kv heads): what decode must stream."""
        return sum(s.bytes for s in self.segments)

    @property
    def elem(self) -> DType:
        """q/out dtype: the record's 16-bit dtype, bf16 if it has none."""
        for s in self.segments:
            if not s.dtype.is_fp8:
                return s.dtype
        return DTYPES["bf16"]

    @property
    def packed_dtype(self) -> DType | None:
        """The packed cache tensor's dtype; None means raw bytes (uint8)."""
        kinds = {s.dtype for s in self.segments}
        if len(kinds) == 1 and not any(s.scale_group for s in self.segments):
            return next(iter(kinds))
        return None

    @property
    def flops_per_token(self) -> int:
        """FLOPs one query token spends on one cached token: QK and PV for every head."""
        return 2 * self.heads_q * (self.d_k + self.d_v)

    @property
    def intensity(self) -> float:
        """FLOPs per cache byte at s_q = 1."""
        return self.flops_per_token / self.record_bytes

    def segment(self, name: str) -> Segment:
        return next(s for s in self.segments if s.name == name)

    def span_of(self, statement: str) -> Span | None:
        return dict(self.spans).get(statement)

    # --- identity --------------------------------------------------------------------
    def canonical(self) -> dict:
        """Everything that defines the computation and its schedule, no positions."""
        return {
            "name": self.name, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
            "page_size": self.page_size, "separate": self.separate,
            "segments": [[s.name, s.dtype.name, s.dim, s.shared, s.scale_group]
                         for s in self.segments],
            "key": [[s.segment, s.lo, s.hi] for s in self.key],
            "value": [[s.segment, s.lo, s.hi] for s in self.value],
            "max_query_len": self.max_query_len, "causal": self.causal, "topk": self.topk,
            "softmax_scale": repr(self.softmax_scale),
            "schedule": [self.schedule.target, self.schedule.split_kv, self.schedule.seesaw,
                         self.schedule.crossover, self.schedule.tile_q, self.schedule.tile_kv,
                         self.schedule.stages],
        }

    @property
    def digest(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
