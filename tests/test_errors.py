"""Bad specs → positioned SpecErrors (DESIGN.md §2, "Errors").

Every case is a small inline spec, the exact `<string>:line:col:` the error must carry,
the text found at that position (so the table checks itself), a fragment of the message
and, where one is promised, the hint. Every case also checks the rendering: the source
line under the message and a caret under the reported column.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import attncc
from attncc import SpecError


def src(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# A valid spec, line by line, that most cases edit one line of.
HEADS = "    heads q = 4, kv = 2"
CACHE = ("    cache paged(16) {", "        k: bf16[8]", "        v: bf16[8]", "    }")
KEY, VALUE = "    key = k", "    value = v"


def spec(*body: str, name: str = "t", after: tuple[str, ...] = ()) -> str:
    return src(f"attention {name} {{", *body, "}", *after)


VALID = spec(HEADS, *CACHE, KEY, VALUE)


def cache(*segments: str, head: str = "    cache paged(16) {") -> tuple[str, ...]:
    return (head, *(f"        {s}" for s in segments), "    }")


def with_schedule(*knobs: str, name: str = "t") -> str:
    return spec(HEADS, *CACHE, KEY, VALUE,
                after=(f"schedule {name} {{", *(f"    {k}" for k in knobs), "}"))


HUGE = "9" * 5000  # more digits than int() converts by default (Python >= 3.11)

# (id, source, "line:col", text at line:col, message fragment, hint or None)
CASES = [
    # --- syntax ------------------------------------------------------------------------------
    ("misspelled-heads", spec("    haeds q = 4, kv = 2", *CACHE, KEY, VALUE),
     "2:5", "haeds", "unexpected `haeds`", "did you mean `heads`?"),
    ("misspelled-value", spec(HEADS, *CACHE, KEY, "    valeu = v"),
     "8:5", "valeu", "unexpected `valeu`", "did you mean `value`?"),
    ("misspelled-attention", "atention t {\n}\n",
     "1:1", "atention", "unexpected `atention`", "did you mean `attention`?"),
    ("misspelled-knob", with_schedule("stage 2"),
     "11:5", "stage", "unexpected `stage`", "did you mean `stages`?"),
    ("misspelled-causal", spec(HEADS, *CACHE, KEY, VALUE, "    query len <= 2 causl"),
     "9:20", "causl", "unexpected `causl`", "did you mean `causal`?"),
    ("misspelled-separate", spec(HEADS, *cache("k: bf16[8]", "v: bf16[8]",
                                               head="    cache paged(16) seperate {"), KEY, VALUE),
     "3:21", "seperate", "unexpected `seperate`", "did you mean `separate`?"),
    # a misspelled `shared`/`scale` after a segment must be reported where it is written,
    # not at the next segment
    ("misspelled-shared", spec(HEADS, *cache("k: bf16[8] sharde", "v: bf16[8]"), KEY, VALUE),
     "4:20", "sharde", "sharde", "did you mean `shared`?"),
    ("misspelled-scale", spec(HEADS, *cache("k: e4m3[8] scael fp32 per 4", "v: bf16[8]"),
                              KEY, VALUE),
     "4:20", "scael", "scael", "did you mean `scale`?"),
    ("missing-comma-heads", spec("    heads q = 4 kv = 2", *CACHE, KEY, VALUE),
     "2:17", "kv", "unexpected `kv`; expected `,`", None),
    ("missing-comma-tile", with_schedule("tile q = 64 kv = 64"),
     "11:17", "kv", "unexpected `kv`; expected `,`", None),
    ("missing-colon", spec(HEADS, *cache("k bf16[8]", "v: bf16[8]"), KEY, VALUE),
     "4:11", "bf16", "unexpected `bf16`; expected `:`", None),
    ("unexpected-char-at", spec(HEADS, *CACHE, "    key = k @", VALUE),
     "7:13", "@", "unexpected character `@`", None),
    ("unexpected-char-negative", spec("    heads q = -4, kv = 2", *CACHE, KEY, VALUE),
     "2:15", "-", "unexpected character `-`", None),
    ("unexpected-char-lt", spec(HEADS, *CACHE, KEY, VALUE, "    query len < 2"),
     "9:15", "<", "unexpected character `<`", None),
    ("unexpected-char-unicode", spec(HEADS, *CACHE, KEY, "    value = v é"),
     "8:15", "é", "unexpected character `é`", None),
    ("eof-in-heads", "attention t {\n    heads q = 4,",
     "2:17", "", "unexpected end of file; expected `kv`", None),
    ("eof-no-closing-brace", "attention t {\n    heads q = 4, kv = 2\n",
     "2:24", "", "unexpected end of file; expected", None),
    ("brace-after-concat", spec(HEADS, *CACHE, KEY, "    value = v ++"),
     "9:1", "}", "unexpected `}`; expected a name", None),
    ("huge-integer", spec(HEADS, *cache(f"k: bf16[{HUGE}]", "v: bf16[8]"), KEY, VALUE),
     "4:17", HUGE, "", None),

    # --- dtypes and scales ------------------------------------------------------------------
    ("dtype-bfloat16", spec(HEADS, *cache("k: bfloat16[8]", "v: bf16[8]"), KEY, VALUE),
     "4:12", "bfloat16", "unknown dtype `bfloat16`", "did you mean `bf16`?"),
    ("dtype-bf61", spec(HEADS, *cache("k: bf61[8]", "v: bf16[8]"), KEY, VALUE),
     "4:12", "bf61", "unknown dtype `bf61`", "did you mean `bf16`?"),
    ("dtype-float16", spec(HEADS, *cache("k: float16[8]", "v: fp16[8]"), KEY, VALUE),
     "4:12", "float16", "unknown dtype `float16`", "did you mean `fp16`?"),
    ("fp8-without-scale", spec(HEADS, *cache("k: e4m3[8]", "v: bf16[8]"), KEY, VALUE),
     "4:12", "e4m3", "fp8 segment `k` needs scales", "e.g. `scale fp32 per 8`"),
    ("e5m2-without-scale", spec(HEADS, *cache("k: bf16[8]", "v: e5m2[96]"), KEY, VALUE),
     "5:12", "e5m2", "fp8 segment `v` needs scales", "e.g. `scale fp32 per 32`"),
    ("scale-on-bf16", spec(HEADS, *cache("k: bf16[8] scale fp32 per 4", "v: bf16[8]"),
                           KEY, VALUE),
     "4:20", "scale fp32 per 4", "only fp8 segments carry scales; `k` is bf16", None),
    ("scale-dtype-float32", spec(HEADS, *cache("k: e4m3[8] scale float32 per 4", "v: bf16[8]"),
                                 KEY, VALUE),
     "4:26", "float32", "unknown scale dtype `float32`", "did you mean `fp32`?"),
    ("scale-dtype-bf16", spec(HEADS, *cache("k: e4m3[8] scale bf16 per 4", "v: bf16[8]"),
                              KEY, VALUE),
     "4:26", "bf16", "unknown scale dtype `bf16`", None),
    ("scale-group-not-dividing", spec(HEADS, *cache("k: e4m3[8] scale fp32 per 3", "v: bf16[8]"),
                                      KEY, VALUE),
     "4:35", "3", "scale group 3 does not divide the segment's 8 values", "e.g. `per 8`"),
    ("scale-group-zero", spec(HEADS, *cache("k: e4m3[8] scale fp32 per 0", "v: bf16[8]"),
                              KEY, VALUE),
     "4:35", "0", "scale group 0 does not divide", None),
    ("mixed-16-bit", spec(HEADS, *cache("k: bf16[8]", "v: fp16[8]"), KEY, VALUE),
     "5:12", "fp16", "segment `v` is fp16 but `k` is bf16", None),

    # --- heads, cache, statements ----------------------------------------------------------
    ("dim-zero", spec(HEADS, *cache("k: bf16[0]", "v: bf16[8]"), KEY, VALUE),
     "4:17", "0", "segment `k` must hold at least one value", None),
    ("page-zero", spec(HEADS, *cache("k: bf16[8]", "v: bf16[8]", head="    cache paged(0) {"),
                       KEY, VALUE),
     "3:17", "0", "page size must be at least 1", None),
    ("kv-not-dividing-q", spec("    heads q = 4, kv = 3", *CACHE, KEY, VALUE),
     "2:23", "3", "kv = 3 does not divide q = 4", None),
    ("q-zero", spec("    heads q = 0, kv = 2", *CACHE, KEY, VALUE),
     "2:15", "0", "`heads q` must be at least 1", None),
    ("kv-zero", spec("    heads q = 4, kv = 0", *CACHE, KEY, VALUE),
     "2:23", "0", "`heads kv` must be at least 1", None),
    ("duplicate-segment", spec(HEADS, *cache("k: bf16[8]", "v: bf16[8]", "k: bf16[16]"),
                               KEY, VALUE),
     "6:9", "k: bf16[16]", "duplicate segment `k` (first at line 4)", None),
    ("duplicate-heads", spec(HEADS, *CACHE, KEY, VALUE, "    heads q = 8, kv = 2"),
     "9:5", "heads q = 8", "duplicate `heads` statement (first at line 2)", None),
    ("duplicate-key", spec(HEADS, *CACHE, KEY, VALUE, "    key = v"),
     "9:5", "key = v", "duplicate `key` statement (first at line 7)", None),
    ("missing-heads", spec(*CACHE, KEY, VALUE),
     "1:11", "t {", "attention `t` has no `heads` statement", None),
    ("missing-cache", spec(HEADS, KEY, VALUE, name="mine"),
     "1:11", "mine {", "attention `mine` has no `cache` statement", None),
    ("missing-key", spec(HEADS, *CACHE, VALUE),
     "1:11", "t {", "attention `t` has no `key` statement", None),
    ("missing-value", spec(HEADS, *CACHE, KEY),
     "1:11", "t {", "attention `t` has no `value` statement", None),
    ("empty-cache", spec(HEADS, "    cache paged(16) {", "    }", KEY, VALUE),
     "3:5", "cache paged(16)", "the cache record has no segments", None),

    # --- key / value --------------------------------------------------------------------------
    ("key-unknown-segment", spec(HEADS, *cache("latent: bf16[8]", "rope: bf16[4]"),
                                 "    key = latnet ++ rope", "    value = latent"),
     "7:11", "latnet", "`key` reads unknown segment `latnet`; the record has `latent`, `rope`",
     "did you mean `latent`?"),
    ("value-unknown-segment", spec(HEADS, *CACHE, KEY, "    value = k ++ w"),
     "8:18", "w", "`value` reads unknown segment `w`", None),
    ("slice-out-of-range", spec(HEADS, *CACHE, "    key = k[0:9]", VALUE),
     "7:11", "k[0:9]", "slice [0:9] is not a non-empty range inside `k`'s 8 values", None),
    ("slice-empty", spec(HEADS, *CACHE, "    key = k[4:4]", VALUE),
     "7:11", "k[4:4]", "slice [4:4] is not a non-empty range", None),
    ("slice-hi-past-dim", spec(HEADS, *CACHE, KEY, "    value = k ++ v[2:12]"),
     "8:18", "v[2:12]", "slice [2:12] is not a non-empty range inside `v`'s 8 values", None),
    ("slice-reversed", spec(HEADS, *CACHE, "    key = k[6:2]", VALUE),
     "7:11", "k[6:2]", "slice [6:2]", None),

    # --- query, tokens, scale -------------------------------------------------------------------
    ("causal-then-topk", spec(HEADS, *CACHE, KEY, VALUE, "    query len <= 2 causal",
                              "    tokens topk 8"),
     "10:5", "tokens topk 8", "`causal` does not combine with `tokens topk`", None),
    ("topk-then-causal", spec(HEADS, *CACHE, KEY, VALUE, "    tokens topk 8",
                              "    query len <= 2 causal"),
     "10:5", "query len <= 2 causal", "`causal` does not combine with `tokens topk`", None),
    ("topk-zero", spec(HEADS, *CACHE, KEY, VALUE, "    tokens topk 0"),
     "9:17", "0", "`tokens topk` must be at least 1", None),
    ("query-len-zero", spec(HEADS, *CACHE, KEY, VALUE, "    query len <= 0"),
     "9:18", "0", "`query len` must be at least 1", None),
    ("scale-zero", spec(HEADS, *CACHE, KEY, VALUE, "    scale 0"),
     "9:5", "scale 0", "`scale` must be a positive finite number", None),
    ("scale-infinite", spec(HEADS, *CACHE, KEY, VALUE, "    scale 1e999"),
     "9:5", "scale 1e999", "`scale` must be a positive finite number", None),

    # --- schedule -------------------------------------------------------------------------------
    ("schedule-name-mismatch", with_schedule("stages 2", name="u"),
     "10:10", "u {", "schedule `u` names no attention block; this spec declares `t`",
     "did you mean `t`?"),
    ("unknown-target", with_schedule("target sm100"),
     "11:12", "sm100", "unknown target `sm100`; expected one of `sm90a`, `sm80`", None),
    ("unknown-target-typo", with_schedule("target sm90"),
     "11:12", "sm90", "unknown target `sm90`", "did you mean `sm90a`?"),
    ("split-kv-bad-word", with_schedule("split_kv atuo"),
     "11:14", "atuo", "`split_kv` takes `auto`, `off` or a count, not `atuo`",
     "did you mean `auto`?"),
    ("split-kv-zero", with_schedule("split_kv 0"),
     "11:14", "0", "`split_kv` count must be at least 1", "write `split_kv off` for no split"),
    ("duplicate-knob", with_schedule("stages 2", "seesaw", "stages 3"),
     "13:5", "stages 3", "duplicate `stages` knob (first at line 11)", None),
    ("tile-q-zero", with_schedule("tile q = 0, kv = 64"),
     "11:14", "0", "`tile q` must be at least 1", None),
    ("tile-kv-zero", with_schedule("tile q = 64, kv = 0"),
     "11:23", "0", "`tile kv` must be at least 1", None),
    ("stages-zero", with_schedule("stages 0"),
     "11:12", "0", "`stages` must be at least 1", None),
    ("seesaw-on-sm80", with_schedule("target sm80", "seesaw"),
     "12:5", "seesaw", "`seesaw` is a Hopper schedule and needs `target sm90a`, not `sm80`", None),
    ("seesaw-before-sm80", with_schedule("seesaw", "target sm80"),
     "11:5", "seesaw", "`seesaw` is a Hopper schedule", None),
    ("crossover-on-sm80", with_schedule("crossover", "target sm80"),
     "11:5", "crossover", "`crossover` is a Hopper schedule", None),
    ("two-schedules", with_schedule("stages 2") + "schedule t {\n}\n",
     "13:10", "t {", "a spec holds at most one `schedule` block", None),

    # --- blocks ------------------------------------------------------------------------------------
    ("two-attention-blocks", VALID + spec(HEADS, *CACHE, KEY, VALUE, name="u"),
     "10:11", "u {", "a spec holds one `attention` block; `t` is already declared", None),
    ("no-attention-block", "schedule t {\n    stages 2\n}\n",
     "1:1", "schedule", "no `attention` block", None),
    ("empty-file", "",
     "1:1", "", "no `attention` block", None),
    ("only-comments", "# nothing here\n# at all\n",
     "1:1", "#", "no `attention` block", None),
]

assert len(CASES) >= 30
assert len({c[0] for c in CASES}) == len(CASES)


def compile_error(text) -> SpecError:
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    assert type(info.value) is SpecError
    return info.value


def assert_rendering(err: SpecError, text: str, line: int, col: int, filename: str = "<string>"):
    """`file:line:col: message`, then the source line, then a caret under `col`."""
    rendered = str(err).split("\n")
    assert rendered[0].startswith(f"{filename}:{line}:{col}: ")
    source_lines = text.split("\n")
    assert rendered[1] == "    " + source_lines[line - 1].rstrip("\r")
    caret = rendered[2]
    assert caret.strip() and set(caret.strip()) == {"^"}, caret
    assert caret.index("^") == 4 + col - 1, (caret, col)
    for banned in ("Traceback", "lark", "VisitError", "KeyError", "ValueError"):
        assert banned not in str(err)
        assert banned not in repr(err)


@pytest.mark.parametrize("case_id, text, where, at, fragment, hint", CASES,
                         ids=[c[0] for c in CASES])
def test_bad_spec(case_id, text, where, at, fragment, hint):
    line, col = map(int, where.split(":"))
    # the table checks itself: the expected position holds the expected text
    lines = text.split("\n")
    assert 1 <= line <= len(lines)
    assert lines[line - 1][col - 1:].startswith(at), (lines[line - 1], col, at)

    err = compile_error(text)
    message = str(err)
    assert message.startswith(f"<string>:{line}:{col}: "), message
    assert fragment in message.split("\n")[0], message
    assert err.span is not None and (err.span.line, err.span.column) == (line, col)
    if hint is not None:
        assert f"\n  hint: {hint}" in message, message
        assert err.hint == hint
    assert_rendering(err, text, line, col)


@pytest.mark.parametrize("case_id, text, width", [
    ("misspelled-heads", CASES[0][1], len("haeds")),
    ("unexpected-char", spec(HEADS, *CACHE, "    key = k @", VALUE), 1),
    ("slice", spec(HEADS, *CACHE, "    key = k[0:9]", VALUE), len("k[0:9]")),
    ("duplicate-heads", spec(HEADS, *CACHE, KEY, VALUE, "    heads q = 8, kv = 2"),
     len("heads q = 8, kv = 2")),
    ("unknown-target", with_schedule("target sm100"), len("sm100")),
])
def test_caret_underlines_the_offending_text(case_id, text, width):
    err = compile_error(text)
    caret = str(err).split("\n")[2]
    line, col = err.span.line, err.span.column
    assert caret == "    " + " " * (col - 1) + "^" * width
    # the caret sits exactly under the reported text in the rendered source line
    shown = str(err).split("\n")[1]
    assert shown[caret.index("^"):caret.index("^") + width] == \
        text.split("\n")[line - 1][col - 1:col - 1 + width]


def test_caret_column_exact_for_a_few_cases():
    err = compile_error(spec("    heads q = 4, kv = 3", *CACHE, KEY, VALUE))
    assert str(err).split("\n")[1:3] == ["        heads q = 4, kv = 3",
                                         "                          ^"]
    err = compile_error(spec(HEADS, *cache("k: bf61[8]", "v: bf16[8]"), KEY, VALUE))
    assert str(err).split("\n")[1:4] == ["            k: bf61[8]",
                                         "               ^^^^",
                                         "  hint: did you mean `bf16`?"]
    err = compile_error("attention t {\n    heads q = 4,")
    assert str(err).split("\n")[1:3] == ["        heads q = 4,",
                                         "                    ^"]


def test_message_fields():
    err = compile_error(spec(HEADS, *cache("k: bfloat16[8]", "v: bf16[8]"), KEY, VALUE))
    assert err.message.startswith("unknown dtype `bfloat16`")
    assert err.hint == "did you mean `bf16`?"
    assert err.location == "<string>:4:12"
    assert err.source.filename == "<string>"
    assert isinstance(err, Exception)


def test_valid_base_spec_compiles():
    """The cases above are one edit away from this spec; it must itself be fine."""
    kernel = attncc.compile(VALID)
    assert kernel.name == "t"
    assert attncc.compile(with_schedule("target sm90a", "seesaw", "split_kv 4", "tile q = 64, kv = 64",
                                        "stages 2")).name == "t"


@pytest.mark.parametrize("as_path", [True, False], ids=["Path", "str"])
def test_error_in_file_is_reported_with_its_path(tmp_path: Path, as_path):
    text = spec(HEADS, *cache("k: bf16[8]", "v: bfloat16[8]"), KEY, VALUE)
    path = tmp_path / "bad.attn"
    path.write_text(text, encoding="utf-8")
    err = compile_error(path if as_path else str(path))
    message = str(err)
    assert message.startswith(f"{path}:5:12: unknown dtype `bfloat16`"), message
    assert "<string>" not in message
    assert err.source.filename == str(path)
    assert_rendering(err, text, 5, 12, filename=str(path))


def test_missing_file_is_named_not_string(tmp_path: Path):
    """A spec file that does not exist is not source text: the message must not claim
    to come from `<string>`, and must name the file."""
    path = tmp_path / "nope.attn"
    err = compile_error(path)
    assert "no such spec file" in str(err)
    assert str(path) in str(err)
    assert not str(err).startswith("<string>"), str(err)


# --- line breaks: lark counts lines by "\n"; the rendered line, the character named in
# the message and end-of-file positions must use the same lines ------------------------------
ODD_BREAKS = [("cr", "\r"), ("ff", "\f"), ("vt", "\v"), ("nel", "\x85"), ("ls", "\u2028"),
              ("ps", "\u2029"), ("fs", "\x1c")]


@pytest.mark.parametrize("char", [c for _, c in ODD_BREAKS], ids=[n for n, _ in ODD_BREAKS])
def test_odd_line_break_characters_keep_positions_consistent(char):
    # the odd character sits before an error on the same "\n"-line
    text = spec(HEADS, *CACHE, f"  {char}  key = kk", VALUE)
    err = compile_error(text)
    line, col = err.span.line, err.span.column
    assert str(err).startswith(f"<string>:{line}:{col}: ")
    assert_rendering(err, text, line, col)
    if "unexpected character" in err.message:
        assert err.message == f"unexpected character `{text.split(chr(10))[line - 1][col - 1]}`"
    else:
        assert (line, col) == (7, 12)
        assert err.message.startswith("`key` reads unknown segment `kk`")


@pytest.mark.parametrize("char", [c for _, c in ODD_BREAKS], ids=[n for n, _ in ODD_BREAKS])
def test_odd_line_break_characters_at_end_of_file(char):
    text = f"attention t {{{char}    heads q = 4,"
    err = compile_error(text)
    lines = text.split("\n")
    line, col = err.span.line, err.span.column
    assert 1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1, str(err)
    assert_rendering(err, text, line, col)


def test_crlf_line_endings():
    text = spec(HEADS, *CACHE, "    key = kk", VALUE).replace("\n", "\r\n")
    err = compile_error(text)
    assert str(err).startswith("<string>:7:11: `key` reads unknown segment `kk`")
    assert str(err).split("\n")[1] == "    " + "    key = kk"


def test_tab_counts_as_one_column():
    err = compile_error(spec(HEADS, *CACHE, "\tkey = kk", VALUE))
    assert str(err).startswith("<string>:7:8: ")


def test_errors_are_reported_one_at_a_time():
    """Two errors: the message names one, with one position and one caret line."""
    text = spec("    heads q = 0, kv = 2", *cache("k: bf61[8]", "v: bf16[8]"), KEY, VALUE)
    err = compile_error(text)
    assert str(err).startswith("<string>:2:15: `heads q` must be at least 1")
    assert str(err).count("^") == 1
    assert "bf61" not in str(err)


@pytest.mark.parametrize("text", [VALID.replace("k: bf16[8]", "k: bf16[8] scale"),
                                  "attention", "}", "{", "attention t { heads q = 4, kv = 2 ++ }",
                                  "schedule t { tile q = 1 }", "\x00", "attention t {\n" * 50])
def test_more_garbage_is_positioned(text):
    err = compile_error(text)
    m = re.match(r"<string>:(\d+):(\d+): \S", str(err))
    assert m, str(err)
    assert_rendering(err, text, int(m[1]), int(m[2]))


# --- edges: files, encodings, order, names, limits (the hardening issue) ------------------------

BASE = """attention t {
    heads q = 2, kv = 1
    cache paged(4) { k: bf16[16]  v: bf16[16] }
    key = k
    value = v
}
"""


def test_a_byte_order_mark_is_not_text(tmp_path):
    path = tmp_path / "bom.attn"
    path.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    assert attncc.compile(path).name == "t"
    assert attncc.compile("\ufeff" + BASE).name == "t"
    path.write_bytes(b"\xef\xbb\xbf" + BASE.replace("kv = 1", "kv = 3").encode())
    with pytest.raises(SpecError) as info:
        attncc.compile(path)
    assert str(info.value).startswith(f"{path}:2:23: ")  # columns as an editor shows them


def test_bytes_that_are_not_utf8_are_positioned(tmp_path):
    path = tmp_path / "latin1.attn"
    path.write_bytes(BASE.replace("value = v", "value = v  # d\xe9j\xe0 vu").encode("latin-1"))
    with pytest.raises(SpecError) as info:
        attncc.compile(path)
    text = str(info.value)
    assert text.startswith(f"{path}:5:19: not UTF-8 text: byte 0xe9"), text
    assert "save the spec as UTF-8" in text and "^" in text


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_a_file_that_cannot_be_read_is_file_line_col(tmp_path, what):
    path = tmp_path / "spec.attn"
    if what == "directory":
        path.mkdir()
    with pytest.raises(SpecError) as info:
        attncc.compile(path)
    expected = "no such spec file" if what == "missing" else "is a directory, not a spec file"
    assert str(info.value) == f"{path}:1:1: {expected}"


def test_errors_follow_the_file_across_blocks():
    text = ("schedule t {\n    tile q = 0, kv = 64\n}\n" + BASE.replace("kv = 1", "kv = 3"))
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    assert (info.value.span.line, info.value.span.column) == (2, 14), str(info.value)
    text = BASE.replace("kv = 1", "kv = 3") + "attention u {\n}\n"
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    assert info.value.span.line == 2, "the first attention's error, not the second block's"


def test_cross_statement_errors_report_the_first_in_the_file():
    # the key reads an unknown segment (line 4); the dtypes conflict (line 3, earlier)
    text = BASE.replace("v: bf16[16]", "v: fp16[16]").replace("key = k", "key = nope")
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    assert info.value.span.line == 3 and "16-bit dtype" in info.value.message
    text = BASE.replace("key = k", "key = nope")
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    assert info.value.span.line == 4 and "unknown segment" in info.value.message


def test_a_long_name_is_an_error_at_the_name():
    name = "n" * 253
    with pytest.raises(SpecError) as info:
        attncc.compile(BASE.replace("attention t", f"attention {name}").replace("", ""))
    assert (info.value.span.line, info.value.span.column) == (1, 11)
    assert "at most 200" in info.value.message
    assert attncc.compile(BASE.replace("attention t", "attention " + "n" * 200)).name == "n" * 200


@pytest.mark.parametrize("order", ["fp8 first", "name first"])
def test_a_segment_named_like_another_segments_scales_is_an_error(order):
    fp8, other = "k: e4m3[128] scale fp32 per 128", "k_scale: bf16[128]"
    segments = f"{fp8}\n        {other}" if order == "fp8 first" else f"{other}\n        {fp8}"
    text = (f"attention t {{\n    heads q = 2, kv = 1\n    cache paged(16) separate {{\n        "
            f"{segments}\n        v: bf16[128]\n    }}\n    key = k_scale\n    value = v\n}}\n")
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    exc = info.value
    assert "k_scale" in exc.message and "scales" in exc.message and exc.span.line == 5
    if order == "fp8 first":
        assert exc.span.column == 9, "at the second segment's name"
    else:
        assert text.split("\n")[4][exc.span.column - 1:].startswith("scale fp32"), "at k's scales"
    # packed, the names do not collide
    attncc.compile(text.replace(" separate", ""))


@pytest.mark.parametrize("heads, query, line, words", [
    ("heads q = 2147483647, kv = 2147483647", "", 3, "32-bit offsets"),
    ("heads q = 1073741824, kv = 1", "    query len <= 4\n", 6, "32-bit ints"),
])
def test_counts_past_the_kernels_int_are_errors_naming_the_limit(heads, query, line, words):
    text = BASE.replace("heads q = 2, kv = 1", heads).replace("    value = v\n", "    value = v\n" + query)
    with pytest.raises(SpecError) as info:
        attncc.compile(text)
    assert info.value.span.line == line and words in info.value.message
    assert "2147483647" in info.value.message


KEYWORDS_AND_API_WORDS = ["shared", "scale", "cache", "slots", "self", "key", "value", "q", "kv",
                          "per", "heads", "paged", "separate", "query", "len", "causal", "tokens",
                          "topk", "attention", "schedule", "tile", "stages"]


@pytest.mark.parametrize("name", KEYWORDS_AND_API_WORDS)
def test_every_name_the_grammar_accepts_names_a_usable_segment(name):
    import torch

    text = f"""attention t {{
    heads q = 2, kv = 1
    cache paged(4) {{
        v: bf16[16] shared
        {name}: bf16[16]
        w: e4m3[16] scale fp32 per 16
    }}
    key = {name} ++ v
    value = v ++ w
    scale 0.5
}}"""
    k = attncc.compile(text)
    assert [s.name for s in k.spec.segments] == ["v", name, "w"]
    assert k.spec.segment("v").shared and k.spec.segment("w").scale_group == 16
    assert k.spec.softmax_scale == 0.5
    cache = k.new_cache(2, device="cpu")
    gen = torch.Generator().manual_seed(0)
    values = {"v": torch.randn(5, 16, generator=gen), name: torch.randn(5, 1, 16, generator=gen),
              "w": torch.randn(5, 1, 16, generator=gen)}
    k.write_cache(cache, torch.arange(5), **values)
    q = torch.randn(1, 1, 2, 32, generator=gen).to(torch.bfloat16)
    out, lse = k(q, cache, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32))
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
