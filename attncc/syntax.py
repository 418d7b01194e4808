"""The syntax tree of a `.attn` file: what was written, where, before any checking."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import Span


@dataclass(frozen=True)
class Name:
    text: str
    span: Span


@dataclass(frozen=True)
class Int:
    value: int
    span: Span


@dataclass(frozen=True)
class Heads:
    q: Int
    kv: Int
    span: Span


@dataclass(frozen=True)
class ScaleFormat:
    dtype: Name
    group: Int
    span: Span


@dataclass(frozen=True)
class SegmentDecl:
    name: Name
    dtype: Name
    dim: Int
    shared: bool
    scale: ScaleFormat | None
    span: Span


@dataclass(frozen=True)
class Cache:
    page_size: Int
    separate: bool
    segments: tuple[SegmentDecl, ...]
    span: Span


@dataclass(frozen=True)
class Part:
    """`segment` or `segment[lo:hi]` inside a key/value concatenation."""

    segment: Name
    lo: Int | None
    hi: Int | None
    span: Span


@dataclass(frozen=True)
class Projection:
    kind: str  # "key" or "value"
    parts: tuple[Part, ...]
    span: Span


@dataclass(frozen=True)
class QueryLen:
    max_len: Int
    causal: bool
    span: Span


@dataclass(frozen=True)
class Tokens:
    topk: Int
    span: Span


@dataclass(frozen=True)
class SoftmaxScale:
    value: float
    span: Span


@dataclass(frozen=True)
class Attention:
    name: Name
    statements: tuple
    span: Span


@dataclass(frozen=True)
class Target:
    arch: Name
    span: Span


@dataclass(frozen=True)
class SplitKV:
    value: Name | Int
    span: Span


@dataclass(frozen=True)
class Seesaw:
    span: Span


@dataclass(frozen=True)
class Crossover:
    span: Span


@dataclass(frozen=True)
class Tile:
    q: Int
    kv: Int
    span: Span


@dataclass(frozen=True)
class Stages:
    count: Int
    span: Span


@dataclass(frozen=True)
class Schedule:
    name: Name
    knobs: tuple
    span: Span


@dataclass(frozen=True)
class Module:
    blocks: tuple  # Attention and Schedule, in source order
