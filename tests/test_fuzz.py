"""Mutation fuzzing of the example specs: whatever the text, `attncc.compile` either
succeeds or raises a SpecError positioned inside the text (DESIGN.md §2: "It never lets
a bare Python error through")."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import attncc
from attncc import SpecError
from attncc.errors import Source, Span

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = {p.name: p.read_text(encoding="utf-8") for p in sorted(EXAMPLES_DIR.glob("*.attn"))}
TEXTS = list(EXAMPLES.values())

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# what gets inserted: the language's punctuation, letters, digits, whitespace, and a few
# characters that some tools (but not lark) treat as line breaks
CHARS = list("{}[]():,=+<>#._-*/;\"'@$é 0123456789azAZqkv") + \
    ["\n", "\t", " ", "\r", "\f", "\v", "\x00", "\x85", "\u2028"]
WORDS = ["attention", "schedule", "heads", "cache", "paged", "separate", "shared", "scale",
         "per", "key", "value", "query", "len", "causal", "tokens", "topk", "target",
         "split_kv", "seesaw", "crossover", "tile", "stages", "q", "kv", "bf16", "fp16", "e4m3",
         "e5m2", "fp32", "sm90a", "sm80", "auto", "off", "latent", "rope", "k", "v", "++", "<=",
         "=", ",", "{", "}", "[", "]", ":", "(", ")", "0", "1", "2.5", ".5", "1e999", "#"]
NUMBERS = ["0", "00", "1", "-1", "-0", "3", "7", "2147483648", "18446744073709551617",
           "1" + "0" * 30, "9" * 5000, "1.5", "1e9", "1e999", ".0", "0x10"]
TOKEN_RE = re.compile(r"\s+|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[0-9.]+(?:[eE][-+]?[0-9]+)?|\+\+|<=|.",
                      re.S)


def check_outcome(text: str) -> None:
    # DESIGN.md §3: a str ending in `.attn` names a file, it is not source text
    assume(not text.strip().endswith(".attn"))
    check_text(text)


def check_text(text: str) -> None:
    """Succeed, or a SpecError `<string>:L:C: ...` with L:C inside the text; any other
    exception propagates and fails the test."""
    try:
        kernel = attncc.compile(text)
    except SpecError as err:
        message = str(err)
        m = re.match(r"<string>:(\d+):(\d+): \S", message)
        assert m, message
        line, col = int(m[1]), int(m[2])
        lines = text.split("\n")  # lark's lines: "\n" separates them
        assert 1 <= line <= len(lines), (line, len(lines), message)
        assert 1 <= col <= len(lines[line - 1]) + 1, (col, lines[line - 1], message)
        rendered = message.split("\n")
        assert rendered[1] == "    " + lines[line - 1].removesuffix("\r"), message
        assert rendered[2].index("^") == 4 + col - 1, message
        for banned in ("Traceback", "lark", "VisitError", "KeyError"):
            assert banned not in message
            assert banned not in repr(err)
        return
    # a spec that compiles is a real one: its numbers are consistent
    spec = kernel.spec
    assert spec.heads_q % spec.heads_kv == 0
    assert spec.d_k > 0 and spec.d_v > 0 and spec.record_bytes > 0
    assert not (spec.causal and spec.sparse)


def test_examples_are_there_and_valid():
    assert {"mla.attn", "gqa8.attn", "mla_fp8_sparse.attn"} <= set(EXAMPLES)
    for name, text in EXAMPLES.items():
        assert attncc.compile(text).name == name.removesuffix(".attn")
        check_text(text)


def test_check_text_has_teeth(monkeypatch):
    """The property rejects a bare Python error and a SpecError placed outside the text."""
    def raise_key_error(text):
        raise KeyError("bf16")
    monkeypatch.setattr(attncc, "compile", raise_key_error)
    with pytest.raises(KeyError):
        check_text("attention t {}")

    def raise_outside(text):
        raise SpecError("x", Source(text), Span(9, 1, 9, 2))
    monkeypatch.setattr(attncc, "compile", raise_outside)
    with pytest.raises(AssertionError):
        check_text("a\nb\n")

    def raise_unpositioned(text):
        raise SpecError("x", Source(text))
    monkeypatch.setattr(attncc, "compile", raise_unpositioned)
    with pytest.raises(AssertionError):
        check_text("a\nb\n")


@st.composite
def char_mutations(draw):
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "delete-run"]))
        if op == "delete":
            text = text[:i] + text[i + 1:]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(CHARS)) + text[i:]
        elif op == "replace":
            text = text[:i] + draw(st.sampled_from(CHARS)) + text[i + 1:]
        else:
            text = text[:i] + text[i + draw(st.integers(1, 40)):]
    return text


@FUZZ
@given(char_mutations())
def test_character_mutations(text):
    check_outcome(text)


@st.composite
def token_mutations(draw):
    tokens = TOKEN_RE.findall(draw(st.sampled_from(TEXTS)))
    assert "".join(tokens)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(tokens) - 1))
        j = draw(st.integers(0, len(tokens) - 1))
        op = draw(st.sampled_from(["swap", "delete", "duplicate", "replace", "insert"]))
        if op == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "delete":
            del tokens[i]
        elif op == "duplicate":
            tokens.insert(i, tokens[i])
        elif op == "replace":
            tokens[i] = draw(st.sampled_from(WORDS))
        else:
            tokens.insert(i, " " + draw(st.sampled_from(WORDS)) + " ")
        if not tokens:
            tokens = [""]
    return "".join(tokens)


@FUZZ
@given(token_mutations())
def test_token_mutations(text):
    check_outcome(text)


@st.composite
def line_mutations(draw):
    lines = draw(st.sampled_from(TEXTS)).split("\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["duplicate", "delete", "swap", "move"]))
        if op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines.insert(j, lines.pop(i))
    text = "\n".join(lines)
    if draw(st.booleans()):  # and truncate somewhere
        text = text[:draw(st.integers(0, len(text)))]
    return text


@FUZZ
@given(line_mutations())
def test_line_mutations_and_truncation(text):
    check_outcome(text)


@FUZZ
@given(st.sampled_from(TEXTS), st.data())
def test_truncation(text, data):
    check_outcome(text[:data.draw(st.integers(0, len(text)))])


@st.composite
def number_mutations(draw):
    text = draw(st.sampled_from(TEXTS))
    spans = [m.span() for m in re.finditer(r"(?<![\w.])[0-9]+(?:\.[0-9]*)?", text)]
    assert spans
    chosen = draw(st.lists(st.sampled_from(spans), min_size=1, max_size=3, unique=True))
    for lo, hi in sorted(chosen, reverse=True):
        text = text[:lo] + draw(st.sampled_from(NUMBERS)) + text[hi:]
    return text


@FUZZ
@given(number_mutations())
def test_number_mutations(text):
    check_outcome(text)
