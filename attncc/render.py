"""Kernel plan → CUDA source, through thin Jinja templates (templates/*.j2). The
algorithm lives in templates/include/attncc/*.cuh; templates only emit constants."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from .lower import Plan
from .resources import TEMPLATES_DIR

KERNEL_TEMPLATE = "decode.cu.j2"
INCLUDE_DIR = TEMPLATES_DIR / "include"


@lru_cache(maxsize=1)
def _environment():
    import jinja2  # only when rendering: loading an already built kernel needs no templates

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def source_name(plan: Plan) -> str:
    return f"{plan.name}.cu"


def render(plan: Plan) -> str:
    """The translation unit for one plan: constants + kernel instantiations + C ABI."""
    return _environment().get_template(KERNEL_TEMPLATE).render(plan=plan.template_dict())


def template_digest() -> str:
    """Hash of every template and device header: part of the JIT cache key."""
    h = hashlib.sha256()
    for path in sorted(TEMPLATES_DIR.rglob("*")):
        if path.is_file() and path.suffix in (".j2", ".cuh", ".h"):
            h.update(str(path.relative_to(TEMPLATES_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def write_sources(plan: Plan, directory) -> list:
    """The rendered translation unit and the plan it came from, as a reader sees them
    in generated/<name>/. Files are rewritten only when their text changes."""
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {source_name(plan): render(plan),
             "plan.json": json.dumps(plan.template_dict(), indent=2, sort_keys=True) + "\n"}
    written = []
    for name, text in files.items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written
