"""Spec text → syntax tree. Lark (LALR) does the parsing; this module turns lark's
trees into `syntax` dataclasses and lark's exceptions into positioned SpecErrors."""
from __future__ import annotations

import difflib
from functools import lru_cache

import lark
from lark import Transformer, v_args

from . import syntax as st
from .errors import Source, Span, SpecError
from .resources import GRAMMAR_DIR

# How terminals read in "expected ..." messages.
_TERMINAL_TEXT = {"NAME": "a name", "INT": "an integer", "NUMBER": "a number",
                  "$END": "end of file", "SHARED": "`shared`", "_SCALE": "`scale`"}
MAX_INT = 2**31 - 1  # every count in a spec becomes a C int in the kernel
# Words that may follow a segment's `dtype[dim]`: a typo of one reads as a new segment's name.
SEGMENT_SUFFIXES = ("shared", "scale")
KEYWORDS = (
    "attention", "schedule", "heads", "cache", "paged", "separate", "shared", "scale",
    "per", "key", "value", "query", "len", "causal", "tokens", "topk", "target",
    "split_kv", "seesaw", "crossover", "tile", "stages", "q", "kv",
)


def _span(meta) -> Span:
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _token_span(token: lark.Token) -> Span:
    return Span(token.line, token.column, token.end_line or token.line,
                token.end_column or token.column + len(token))


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    # cache=True keeps the LALR tables in the temp dir, keyed by the grammar's hash:
    # building them costs ~0.15 s, a quarter of loading an already built kernel
    return lark.Lark.open(str(GRAMMAR_DIR / "attn.lark"), parser="lalr", cache=True,
                          propagate_positions=True, maybe_placeholders=True)


@v_args(meta=True)
class _ToSyntax(Transformer):
    """Lark tree → syntax dataclasses (token converters first, then one method a rule)."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    @v_args(inline=False, meta=False)
    def NAME(self, token):
        return st.Name(str(token), _token_span(token))

    @v_args(inline=False, meta=False)
    def INT(self, token):
        if len(token) > len(str(MAX_INT)) or int(token) > MAX_INT:
            raise SpecError(f"number too large (at most {MAX_INT})", self.source,
                            _token_span(token))
        return st.Int(int(token), _token_span(token))

    def start(self, meta, children):
        return st.Module(tuple(children))

    def attention(self, meta, children):
        name, *statements = children
        return st.Attention(name, tuple(statements), _span(meta))

    def heads(self, meta, children):
        return st.Heads(children[0], children[1], _span(meta))

    def cache(self, meta, children):
        page, separate, *segments = children
        return st.Cache(page, separate is not None, tuple(segments), _span(meta))

    def segment(self, meta, children):
        name, dtype, dim, shared, scale = children
        return st.SegmentDecl(name, dtype, dim, shared is not None, scale, _span(meta))

    def scale_format(self, meta, children):
        return st.ScaleFormat(children[0], children[1], _span(meta))

    def key(self, meta, children):
        return st.Projection("key", children[0], _span(meta))

    def value(self, meta, children):
        return st.Projection("value", children[0], _span(meta))

    def concat(self, meta, children):
        return tuple(children)

    def part(self, meta, children):
        return st.Part(children[0], children[1], children[2], _span(meta))

    def query(self, meta, children):
        return st.QueryLen(children[0], children[1] is not None, _span(meta))

    def tokens(self, meta, children):
        return st.Tokens(children[0], _span(meta))

    def softmax_scale(self, meta, children):
        return st.SoftmaxScale(float(children[0]), _span(meta))

    def schedule(self, meta, children):
        name, *knobs = children
        return st.Schedule(name, tuple(knobs), _span(meta))

    def target(self, meta, children):
        return st.Target(children[0], _span(meta))

    def split_kv(self, meta, children):
        return st.SplitKV(children[0], _span(meta))

    def seesaw(self, meta, children):
        return st.Seesaw(_span(meta))

    def crossover(self, meta, children):
        return st.Crossover(_span(meta))

    def tile(self, meta, children):
        return st.Tile(children[0], children[1], _span(meta))

    def stages(self, meta, children):
        return st.Stages(children[0], _span(meta))


def _terminal_text(name: str) -> str:
    if name in _TERMINAL_TEXT:
        return _TERMINAL_TEXT[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return f"`{name.lower()}`"
    return f"`{pattern.value}`" if isinstance(pattern, lark.lexer.PatternStr) else name.lower()


def _describe_expected(expected) -> str:
    names = sorted({_terminal_text(t) for t in expected})
    if len(names) > 8:
        names = names[:8] + ["..."]
    return ", ".join(names)


def _keyword_hint(word: str) -> str | None:
    close = difflib.get_close_matches(word, KEYWORDS, n=1, cutoff=0.7)
    return f"did you mean `{close[0]}`?" if close and close[0] != word else None


def _syntax_error(exc: lark.exceptions.UnexpectedInput, source: Source) -> SpecError:
    line, column = max(exc.line, 1), max(exc.column, 1)
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        char = source.line(line)[column - 1: column] or "?"
        return SpecError(f"unexpected character `{char}`", source,
                         Span(line, column, line, column + 1))
    token = getattr(exc, "token", None)
    if isinstance(exc, lark.exceptions.UnexpectedEOF) or token.type == "$END":
        # point just past the last character written, not at trailing blank lines
        lines = Source(source.text.rstrip()).lines()
        end = Span(len(lines), len(lines[-1]) + 1, len(lines), len(lines[-1]) + 2)
        return SpecError(f"unexpected end of file; expected {_describe_expected(exc.expected)}",
                         source, end)
    misspelled = _misspelled_suffix(exc)
    if misspelled is not None:
        return SpecError(f"unexpected `{misspelled}` after a segment's type", source,
                         _token_span(misspelled), _keyword_hint(str(misspelled)))
    hint = _keyword_hint(str(token)) if token.type == "NAME" else None
    return SpecError(f"unexpected `{token}`; expected {_describe_expected(exc.expected)}",
                     source, _token_span(token), hint)


def _misspelled_suffix(exc: lark.exceptions.UnexpectedToken):
    """`k: bf16[8] sharde` parses `sharde` as the next segment's name and fails one token
    later, expecting `:`; report the misspelled word itself when it is close to one."""
    if set(exc.expected) != {"COLON"} or exc.interactive_parser is None:
        return None
    stack = exc.interactive_parser.parser_state.value_stack
    last = stack[-1] if stack else None
    if isinstance(last, lark.Token) and last.type == "NAME" and difflib.get_close_matches(
            str(last), SEGMENT_SUFFIXES, n=1, cutoff=0.6):
        return last
    return None


def parse(source: Source) -> st.Module:
    """Parse spec text into a syntax tree; any syntax error is a positioned SpecError."""
    try:
        tree = _parser().parse(source.text)
    except lark.exceptions.UnexpectedInput as exc:
        raise _syntax_error(exc, source) from None
    try:
        return _ToSyntax(source).transform(tree)
    except lark.exceptions.VisitError as exc:  # only our own converters run here
        raise exc.orig_exc from None
