"""Spec text or file → checked IR: the first two stages (parse, check) in one call."""
from __future__ import annotations

from pathlib import Path

from .check import check
from .errors import Source, SpecError
from .ir import Spec
from .parse import parse


def load_source(path_or_text) -> Source:
    """A Path, or a str ending in `.attn`, is a file; any other str is source text."""
    if isinstance(path_or_text, Path) or (isinstance(path_or_text, str)
                                          and path_or_text.strip().endswith(".attn")):
        path = Path(path_or_text)
        try:
            return Source(path.read_text(encoding="utf-8"), str(path))
        except FileNotFoundError:
            raise SpecError(f"no such spec file: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read spec file {path}: {exc}") from None
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or spec text, got {type(path_or_text).__name__}")
    return Source(path_or_text)


def check_spec(path_or_text) -> Spec:
    source = load_source(path_or_text)
    return check(parse(source), source)
