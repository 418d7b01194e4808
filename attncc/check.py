"""Syntax tree → checked IR. Every rule of DESIGN.md §2 is validated here and the first
violation is raised as a positioned SpecError.

Order: blocks are checked in source order, and so are the statements of an attention block
(each statement's own rules as it is read) and the knobs of a schedule. The rules that need
the whole block (a key or value against the record, the record's size, the 16-bit dtype,
causal with topk, the row count) run after its statements; of their errors the first in the
file is reported. So where the checks cannot follow the file: a statement's own error is
reported before a cross-statement error placed earlier in the file (a `key` naming an
unknown segment, above a cache whose dtype is misspelled, reports the dtype)."""
from __future__ import annotations

import difflib
import math

from . import syntax as st
from .errors import Source, Span, SpecError
from .ir import DTYPES, KERNEL_INT_MAX, SCALE_DTYPES, Schedule, Segment, Slice, Spec, scale_tensor_name
from .target import TARGETS

MAX_NAME = 200  # an attention's name names generated/<name>/<name>.cu and the op attncc::<name>_<hash>
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "e4m3",
                  "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "f16": "fp16"}
_SCALE_ALIASES = {"float32": "fp32", "f32": "fp32", "float": "fp32"}


def _suggest(word: str, choices, aliases=None) -> str | None:
    if aliases and word in aliases:
        return f"did you mean `{aliases[word]}`?"
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"did you mean `{close[0]}`?" if close else None


def _one_of(choices) -> str:
    return ", ".join(f"`{c}`" for c in choices)


class _Checker:
    def __init__(self, source: Source):
        self.source = source

    def fail(self, message: str, span: Span, hint: str | None = None):
        raise SpecError(message, self.source, span, hint)

    # --- the file ----------------------------------------------------------------------
    def module(self, module: st.Module) -> Spec:
        attentions = [b for b in module.blocks if isinstance(b, st.Attention)]
        if not attentions:
            self.fail("no `attention` block: a spec declares one", Span(1, 1, 1, 2))
        name = attentions[0].name.text
        spec_parts = schedule = None
        for block in module.blocks:  # in source order
            if isinstance(block, st.Attention):
                if spec_parts is not None:
                    self.fail(f"a spec holds one `attention` block; `{name}` is already declared",
                              block.name.span)
                spec_parts = self.attention(block)
            else:
                if schedule is not None:
                    self.fail("a spec holds at most one `schedule` block", block.name.span)
                schedule = self.schedule(block, name)
        return Spec(schedule=schedule or Schedule(), source=self.source, **spec_parts)

    # --- attention -----------------------------------------------------------------------
    def attention(self, block: st.Attention) -> dict:
        if len(block.name.text) > MAX_NAME:
            self.fail(f"the name is {len(block.name.text)} characters long; at most {MAX_NAME} (it "
                      "names files, a directory and the torch op)", block.name.span)
        seen: dict[str, object] = {}
        for stmt in block.statements:
            kind = {st.Heads: "heads", st.Cache: "cache", st.QueryLen: "query len",
                    st.Tokens: "tokens", st.SoftmaxScale: "scale"}.get(type(stmt))
            kind = kind or stmt.kind  # key / value projections
            if kind in seen:
                first = seen[kind].span
                self.fail(f"duplicate `{kind}` statement (first at line {first.line})",
                          stmt.span)
            seen[kind] = stmt
            self.statement(stmt, seen)
        for required in ("heads", "cache", "key", "value"):
            if required not in seen:
                self.fail(f"attention `{block.name.text}` has no `{required}` statement",
                          block.name.span)
        heads, cache = seen["heads"], seen["cache"]
        query, tokens = seen.get("query len"), seen.get("tokens")
        segments = self.layout(cache, heads.kv.value)
        errors: list[SpecError] = []

        def attempt(check, *args):
            try:
                return check(*args)
            except SpecError as exc:
                errors.append(exc)
                return None

        attempt(self.record_size, cache, segments)
        key = attempt(self.projection, seen["key"], segments)
        value = attempt(self.projection, seen["value"], segments)
        attempt(self.elem_dtype, cache)
        attempt(self.rows, heads, query)
        if tokens is not None and query is not None and query.causal:
            later = max(tokens, query, key=lambda s: (s.span.line, s.span.column))
            attempt(self.fail, "`causal` does not combine with `tokens topk`: a sparse query "
                    "attends exactly to the tokens its indices name", later.span)
        if errors:  # the first in the file
            raise min(errors, key=lambda e: (e.span.line, e.span.column))
        d_k = sum(s.width for s in key)
        scale_stmt = seen.get("scale")
        softmax_scale = scale_stmt.value if scale_stmt else 1.0 / math.sqrt(d_k)
        spans = tuple((k, v.span) for k, v in seen.items()) + (("name", block.name.span),)
        return dict(
            name=block.name.text, heads_q=heads.q.value, heads_kv=heads.kv.value,
            page_size=cache.page_size.value, separate=cache.separate,
            segments=segments, key=key, value=value,
            max_query_len=query.max_len.value if query else 1,
            causal=bool(query and query.causal),
            topk=tokens.topk.value if tokens else 0,
            softmax_scale=softmax_scale, spans=spans,
        )

    def statement(self, stmt, seen) -> None:
        if isinstance(stmt, st.Heads):
            if stmt.q.value < 1:
                self.fail("`heads q` must be at least 1", stmt.q.span)
            if stmt.kv.value < 1:
                self.fail("`heads kv` must be at least 1", stmt.kv.span)
            if stmt.q.value % stmt.kv.value:
                self.fail(f"kv = {stmt.kv.value} does not divide q = {stmt.q.value}: "
                          "every kv head serves the same number of query heads", stmt.kv.span)
        elif isinstance(stmt, st.Cache):
            if stmt.page_size.value < 1:
                self.fail("page size must be at least 1", stmt.page_size.span)
            if not stmt.segments:
                self.fail("the cache record has no segments", stmt.span)
            names: dict[str, st.SegmentDecl] = {}
            scale_tensors: dict[str, st.SegmentDecl] = {}  # separate: tensor name -> its fp8 segment
            for seg in stmt.segments:
                if seg.name.text in names:
                    self.fail(f"duplicate segment `{seg.name.text}` (first at line "
                              f"{names[seg.name.text].span.line})", seg.name.span)
                if seg.name.text in scale_tensors:
                    owner = scale_tensors[seg.name.text].name.text
                    self.fail(f"segment `{seg.name.text}` has the name of the tensor that holds the "
                              f"scales of `{owner}` in a separate cache", seg.name.span,
                              "rename one of them")
                names[seg.name.text] = seg
                self.segment_decl(seg)
                if stmt.separate and seg.scale is not None:
                    tensor = scale_tensor_name(seg.name.text)
                    if tensor in names:
                        self.fail(f"the scales of `{seg.name.text}` are stored in a tensor named "
                                  f"`{tensor}`, the name of the segment at line {names[tensor].span.line} "
                                  "(a separate cache holds one tensor per name)", seg.scale.span,
                                  "rename one of them")
                    scale_tensors[tensor] = seg
        elif isinstance(stmt, st.QueryLen):
            if stmt.max_len.value < 1:
                self.fail("`query len` must be at least 1", stmt.max_len.span)
        elif isinstance(stmt, st.Tokens):
            if stmt.topk.value < 1:
                self.fail("`tokens topk` must be at least 1", stmt.topk.span)
        elif isinstance(stmt, st.SoftmaxScale):
            if not (math.isfinite(stmt.value) and stmt.value > 0):
                self.fail("`scale` must be a positive finite number", stmt.span)
        # key/value are checked once the cache is known (they may precede it).

    def segment_decl(self, seg: st.SegmentDecl) -> None:
        dtype = DTYPES.get(seg.dtype.text)
        if dtype is None:
            self.fail(f"unknown dtype `{seg.dtype.text}`; expected one of "
                      f"{_one_of(DTYPES)}", seg.dtype.span,
                      _suggest(seg.dtype.text, DTYPES, _DTYPE_ALIASES))
        if seg.dim.value < 1:
            self.fail(f"segment `{seg.name.text}` must hold at least one value", seg.dim.span)
        if dtype.is_fp8 and seg.scale is None:
            self.fail(f"fp8 segment `{seg.name.text}` needs scales: write "
                      f"`{dtype.name}[{seg.dim.value}] scale fp32 per N`", seg.dtype.span,
                      f"e.g. `scale fp32 per {_largest_group(seg.dim.value)}`")
        if seg.scale is None:
            return
        if not dtype.is_fp8:
            self.fail(f"only fp8 segments carry scales; `{seg.name.text}` is "
                      f"{dtype.name}", seg.scale.span)
        if seg.scale.dtype.text not in SCALE_DTYPES:
            self.fail(f"unknown scale dtype `{seg.scale.dtype.text}`; expected "
                      f"{_one_of(SCALE_DTYPES)}", seg.scale.dtype.span,
                      _suggest(seg.scale.dtype.text, SCALE_DTYPES, _SCALE_ALIASES))
        group = seg.scale.group.value
        if group < 1 or seg.dim.value % group:
            self.fail(f"scale group {group} does not divide the segment's {seg.dim.value} "
                      "values", seg.scale.group.span,
                      f"e.g. `per {_largest_group(seg.dim.value)}`")

    def layout(self, cache: st.Cache, heads_kv: int) -> tuple[Segment, ...]:
        """Packed record layout: segments in order, byte offsets accumulated."""
        segments, offset = [], 0
        for decl in cache.segments:
            seg = Segment(
                name=decl.name.text, dtype=DTYPES[decl.dtype.text], dim=decl.dim.value,
                shared=decl.shared, copies=1 if decl.shared else heads_kv,
                scale_group=decl.scale.group.value if decl.scale else 0,
                offset=offset, span=decl.span)
            segments.append(seg)
            offset += seg.bytes
        return tuple(segments)

    def record_size(self, cache: st.Cache, segments) -> None:
        for decl, seg in zip(cache.segments, segments):
            end = seg.offset + seg.bytes
            if end > KERNEL_INT_MAX:
                self.fail(f"the record reaches {end} bytes per token at segment `{seg.name}`; "
                          f"kernels address a record with 32-bit offsets (at most {KERNEL_INT_MAX})",
                          decl.span)

    def rows(self, heads: st.Heads, query) -> None:
        """A sequence's query rows, s_q x h_q, are counted with 32-bit ints."""
        max_len = query.max_len.value if query else 1
        if heads.q.value * max_len > KERNEL_INT_MAX:
            self.fail(f"{max_len} query tokens of {heads.q.value} heads are "
                      f"{heads.q.value * max_len} rows per sequence; kernels count them with "
                      f"32-bit ints (at most {KERNEL_INT_MAX})", (query or heads).span)

    def projection(self, proj: st.Projection, segments) -> tuple[Slice, ...]:
        by_name = {s.name: s for s in segments}
        slices = []
        for part in proj.parts:
            seg = by_name.get(part.segment.text)
            if seg is None:
                self.fail(f"`{proj.kind}` reads unknown segment `{part.segment.text}`; the "
                          f"record has {_one_of(by_name)}", part.segment.span,
                          _suggest(part.segment.text, by_name))
            lo, hi = (0, seg.dim) if part.lo is None else (part.lo.value, part.hi.value)
            if part.lo is not None and not (lo < hi <= seg.dim):
                self.fail(f"slice [{lo}:{hi}] is not a non-empty range inside "
                          f"`{seg.name}`'s {seg.dim} values", part.span)
            slices.append(Slice(seg.name, lo, hi))
        return tuple(slices)

    def elem_dtype(self, cache: st.Cache) -> None:
        """q and out take the record's 16-bit dtype, so there may be only one."""
        first = None
        for decl in cache.segments:
            if DTYPES[decl.dtype.text].is_fp8:
                continue
            if first is None:
                first = decl
            elif decl.dtype.text != first.dtype.text:
                self.fail(f"segment `{decl.name.text}` is {decl.dtype.text} but "
                          f"`{first.name.text}` is {first.dtype.text}: q and out take the "
                          "record's 16-bit dtype, so it must be one", decl.dtype.span)

    # --- schedule --------------------------------------------------------------------------
    def schedule(self, block: st.Schedule, attention_name: str) -> Schedule:
        if block.name.text != attention_name:
            self.fail(f"schedule `{block.name.text}` names no attention block; this spec "
                      f"declares `{attention_name}`", block.name.span,
                      f"did you mean `{attention_name}`?")
        knobs: dict = {}
        spans: dict[str, Span] = {}
        for knob in block.knobs:
            kind = {st.Target: "target", st.SplitKV: "split_kv", st.Seesaw: "seesaw",
                    st.Crossover: "crossover", st.Tile: "tile", st.Stages: "stages"}[type(knob)]
            if kind in spans:
                self.fail(f"duplicate `{kind}` knob (first at line {spans[kind].line})",
                          knob.span)
            spans[kind] = knob.span
            if isinstance(knob, st.Target):
                if knob.arch.text not in TARGETS:
                    self.fail(f"unknown target `{knob.arch.text}`; expected one of "
                              f"{_one_of(TARGETS)}", knob.arch.span,
                              _suggest(knob.arch.text, TARGETS))
                knobs["target"] = knob.arch.text
            elif isinstance(knob, st.SplitKV):
                value = knob.value
                if isinstance(value, st.Name):
                    if value.text not in ("auto", "off"):
                        self.fail(f"`split_kv` takes `auto`, `off` or a count, not "
                                  f"`{value.text}`", value.span,
                                  _suggest(value.text, ("auto", "off")))
                    knobs["split_kv"] = value.text
                else:
                    if value.value < 1:
                        self.fail("`split_kv` count must be at least 1", value.span,
                                  "write `split_kv off` for no split")
                    knobs["split_kv"] = value.value
            elif isinstance(knob, st.Seesaw):
                knobs["seesaw"] = True
            elif isinstance(knob, st.Crossover):
                knobs["crossover"] = True
            elif isinstance(knob, st.Tile):
                for axis, n in (("q", knob.q), ("kv", knob.kv)):
                    if n.value < 1:
                        self.fail(f"`tile {axis}` must be at least 1", n.span)
                knobs["tile_q"], knobs["tile_kv"] = knob.q.value, knob.kv.value
            elif isinstance(knob, st.Stages):
                if knob.count.value < 1:
                    self.fail("`stages` must be at least 1", knob.count.span)
                knobs["stages"] = knob.count.value
        target = knobs.get("target", Schedule.target)
        for knob in ("seesaw", "crossover"):
            if knobs.get(knob) and target != "sm90a":
                self.fail(f"`{knob}` is a Hopper schedule and needs `target sm90a`, "
                          f"not `{target}`", spans[knob])
        return Schedule(spans=tuple(spans.items()), **knobs)


def _largest_group(dim: int) -> int:
    for n in (128, 64, 32, 16, 8, 4, 2):
        if dim % n == 0:
            return n
    return dim


def check(module: st.Module, source: Source) -> Spec:
    """Validate a parsed spec and resolve it to the checked IR."""
    return _Checker(source).module(module)
