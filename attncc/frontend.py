"""Spec text or file → checked IR: the first two stages (parse, check) in one call."""
from __future__ import annotations

from pathlib import Path

from .check import check
from .errors import Source, SpecError
from .ir import Spec
from .parse import parse


def load_source(path_or_text) -> Source:
    """A Path, or a str ending in `.attn`, is a file; any other str is source text."""
    if isinstance(path_or_text, Path) or _looks_like_path(path_or_text):
        return read_file(Path(path_or_text))
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or spec text, got {type(path_or_text).__name__}")
    return Source(path_or_text)


def _looks_like_path(text) -> bool:
    # DESIGN.md §3: a str ending in `.attn` is a file. Spec text always spans lines, so a
    # multi-line str whose last comment happens to name a .attn file is still text.
    return isinstance(text, str) and text.strip().endswith(".attn") and "\n" not in text.strip()


def read_file(path: Path) -> Source:
    try:
        return Source(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise SpecError("no such spec file", Source("", str(path))) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read spec file: {exc}", Source("", str(path))) from None


def check_spec(path_or_text) -> Spec:
    source = load_source(path_or_text)
    return check(parse(source), source)
