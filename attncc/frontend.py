"""Spec text or file → checked IR: the first two stages (parse, check) in one call."""
from __future__ import annotations

from pathlib import Path

from .check import check
from .errors import Source, Span, SpecError
from .ir import Spec
from .parse import parse


def load_source(path_or_text) -> Source:
    """A Path, or a str ending in `.attn`, is a file; any other str is source text."""
    if isinstance(path_or_text, Path) or _looks_like_path(path_or_text):
        return read_file(Path(path_or_text))
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or spec text, got {type(path_or_text).__name__}")
    return Source(path_or_text.removeprefix(BOM))


def _looks_like_path(text) -> bool:
    # DESIGN.md §3: a str ending in `.attn` is a file. Spec text always spans lines, so a
    # multi-line str whose last comment happens to name a .attn file is still text.
    return isinstance(text, str) and text.strip().endswith(".attn") and "\n" not in text.strip()


BOM = "\ufeff"  # a UTF-8 byte-order mark: editors write it, it is not part of the text
START = Span(1, 1, 1, 2)


def read_file(path: Path) -> Source:
    """The file as UTF-8 text (a leading byte-order mark dropped). A file that cannot be read
    is a SpecError `path:1:1: ...`; bytes that are not UTF-8, one at their line and column."""
    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError("no such spec file", Source("", name), START, show_line=False) from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a spec file", Source("", name), START, show_line=False) from None
    except OSError as exc:
        raise SpecError(f"cannot read spec file: {exc.strerror or exc}", Source("", name), START,
                        show_line=False) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", errors="replace").removeprefix(BOM)
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        shown = data.decode("utf-8", errors="replace")
        raise SpecError(f"not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded",
                        Source(shown.removeprefix(BOM), name), Span(line, column, line, column + 1),
                        "save the spec as UTF-8") from None
    return Source(text.removeprefix(BOM), name)


def check_spec(path_or_text) -> Spec:
    source = load_source(path_or_text)
    return check(parse(source), source)
