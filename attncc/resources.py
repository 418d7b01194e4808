"""Where the grammar and templates live: inside an installed package (`attncc/_grammar`,
`attncc/_templates`, mapped there by pyproject.toml) or beside it in a source checkout."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _locate(name: str) -> Path:
    installed = PACKAGE_DIR / f"_{name}"
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name


GRAMMAR_DIR = _locate("grammar")
TEMPLATES_DIR = _locate("templates")
