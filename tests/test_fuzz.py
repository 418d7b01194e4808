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
from attncc.layout import layout as record_layout

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


# --- mutations: each takes a random.Random and a spec text and returns a mutated text --------

def mutate_chars(rng, text):
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(text))
        op = rng.choice(["delete", "insert", "replace", "delete-run"])
        if op == "delete":
            text = text[:i] + text[i + 1:]
        elif op == "insert":
            text = text[:i] + rng.choice(CHARS) + text[i:]
        elif op == "replace":
            text = text[:i] + rng.choice(CHARS) + text[i + 1:]
        else:
            text = text[:i] + text[i + rng.randint(1, 40):]
    return text


def mutate_tokens(rng, text):
    tokens = TOKEN_RE.findall(text)
    assert "".join(tokens)
    for _ in range(rng.randint(1, 3)):
        i, j = rng.randrange(len(tokens)), rng.randrange(len(tokens))
        op = rng.choice(["swap", "delete", "duplicate", "replace", "insert"])
        if op == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "delete":
            del tokens[i]
        elif op == "duplicate":
            tokens.insert(i, tokens[i])
        elif op == "replace":
            tokens[i] = rng.choice(WORDS)
        else:
            tokens.insert(i, " " + rng.choice(WORDS) + " ")
        if not tokens:
            tokens = [""]
    return "".join(tokens)


def mutate_lines(rng, text):
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        op = rng.choice(["duplicate", "delete", "swap", "move"])
        if op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines.insert(j, lines.pop(i))
    text = "\n".join(lines)
    if rng.random() < 0.5:  # and truncate somewhere
        text = text[:rng.randint(0, len(text))]
    return text


def truncate(rng, text):
    return text[:rng.randint(0, len(text))]


def mutate_numbers(rng, text):
    spans = [m.span() for m in re.finditer(r"(?<![\w.])[0-9]+(?:\.[0-9]*)?", text)]
    assert spans
    for lo, hi in sorted(rng.sample(spans, rng.randint(1, min(3, len(spans)))), reverse=True):
        text = text[:lo] + rng.choice(NUMBERS) + text[hi:]
    return text


def rename_segment(rng, text):
    """A segment renamed to a keyword or an API word, everywhere it is named."""
    names = re.findall(r"^\s*(\w+)\s*:", text, re.M)
    assert names
    old, new = rng.choice(names), rng.choice(WORDS[:24] + ["cache", "slots", "self", "scale_2"])
    return re.sub(rf"\b{old}\b(?=\s*(:|\+\+|\[|\n|$))", new, text)


MUTATIONS = [mutate_chars, mutate_tokens, mutate_lines, truncate, mutate_numbers, rename_segment]


@pytest.mark.parametrize("mutate", MUTATIONS, ids=[m.__name__ for m in MUTATIONS])
@FUZZ
@given(text=st.sampled_from(TEXTS), rng=st.randoms(use_true_random=False))
def test_mutations(mutate, text, rng):
    check_outcome(mutate(rng, text))


BULK_CASES = 10_000
CASE_SECONDS = 2.0


def test_ten_thousand_mutations_each_under_two_seconds():
    """DESIGN.md §2 at volume, deterministic: 10,000 mutated examples, every outcome a spec or
    a positioned SpecError, and no case slower than 2 s (a non-linear front end shows here)."""
    import random
    import time
    import warnings

    rng = random.Random(20261201)
    slowest, checked = (0.0, ""), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for case in range(BULK_CASES):
            text = MUTATIONS[case % len(MUTATIONS)](rng, rng.choice(TEXTS))
            if text.strip().endswith(".attn"):
                continue  # a file name, not source text
            start = time.perf_counter()
            check_text(text)
            elapsed = time.perf_counter() - start
            slowest = max(slowest, (elapsed, text))
            checked += 1
    assert checked >= 0.99 * BULK_CASES, checked
    assert slowest[0] < CASE_SECONDS, f"{slowest[0]:.2f} s for:\n{slowest[1]}"


def test_a_long_key_compiles_in_linear_time():
    """40,000 pieces in one key: the front end and lowering are linear (no piece is looked
    up by scanning the others). Timed with the garbage collector off: its full collections grow
    with the live objects, which made 10x the pieces take up to 24x the time on a 2-core CI
    machine (session 55: 0.30 s and 7.26 s, all of it in lark's parse, whose calls grow 10x)."""
    import gc
    import time

    def spec(n):
        pieces = " ++ ".join(f"k[{16 * i}:{16 * i + 8}]" for i in range(n))
        return (f"attention big {{ heads q = 2, kv = 1 cache paged(4) {{ k: bf16[{16 * n}] v: bf16[16] }} "
                f"key = {pieces} value = v }}")

    times = {}
    for n in (4_000, 40_000):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            k = attncc.compile(spec(n))
            times[n] = time.perf_counter() - start
        finally:
            gc.enable()
        assert k.spec.d_k == 8 * n and len(record_layout(k.spec).sources) == n + 1
    assert times[40_000] < 20 * times[4_000] + 1.0, times  # linear: ~10x, quadratic: ~100x
