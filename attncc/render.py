"""Kernel plan → CUDA source, through thin Jinja templates (templates/decode.cu.j2, plan.j2 and
exports.j2). The algorithm and the launch sequence live in templates/include/attncc/; templates
only emit the plan's numbers as named constexprs and the C ABI's exports."""
from __future__ import annotations

import hashlib
import json
from dataclasses import fields, is_dataclass
from functools import lru_cache

from . import families
from .lower import Plan
from .resources import TEMPLATES_DIR

INCLUDE_DIR = TEMPLATES_DIR / "include"
ACRONYMS = {"qk", "kv", "pv"}  # spelled in capitals in constant names: kQKSplit, kKVOff


@lru_cache(maxsize=1)
def _environment():
    import jinja2  # only when rendering: loading an already built kernel needs no templates

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def source_name(plan: Plan) -> str:
    return f"{plan.name}.cu"


def constant_name(field_name: str) -> str:
    """`q_rows_pitch_bytes` -> `kQRowsPitchBytes`."""
    return "k" + "".join(p.upper() if p in ACRONYMS else p.capitalize() for p in field_name.split("_"))


def _constant(name: str, value, why: str = "") -> list[dict]:
    if is_dataclass(value):  # a nested record (e.g. a shared-memory row layout): one constant a field
        return [c for f in fields(value) for c in _constant(f"{name}_{f.name}", getattr(value, f.name))]
    if isinstance(value, bool):
        return [dict(type="bool", name=constant_name(name), value="true" if value else "false", why=why)]
    if isinstance(value, int):
        return [dict(type="int", name=constant_name(name), value=str(value), why=why)]
    raise TypeError(f"config field {name}: no C++ constant for {type(value).__name__}")


def constants(plan: Plan) -> list[dict]:
    """Every field of the plan's kernel config as a named constexpr (type, name, value, why)."""
    cfg = plan.config
    return [c for name, value in cfg.choices().items() for c in _constant(name, value, cfg.reason(name))]


def render(plan: Plan) -> str:
    """The translation unit for one plan: constants + kernel instantiations + C ABI."""
    template = families.by_name(plan.family).template
    data = dict(plan.template_dict(), schedule_key=plan.schedule_key)  # the digest of the rest
    return _environment().get_template(template).render(plan=data, constants=constants(plan))


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
