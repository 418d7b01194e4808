"""An installed (non-editable) package carries its grammar and templates."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    return next(out.glob("attncc-*.whl"))


def test_wheel_ships_grammar_templates_and_headers(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "attncc/_grammar/attn.lark" in names
    templates = ROOT / "templates"
    shipped = {n.removeprefix("attncc/_templates/") for n in names if n.startswith("attncc/_templates/")}
    wanted = {str(p.relative_to(templates)) for p in templates.rglob("*")
              if p.is_file() and p.suffix in (".j2", ".cuh", ".h")}
    assert wanted and wanted <= shipped, sorted(wanted - shipped)


def test_installed_package_parses_and_explains_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import attncc, attncc.resources as r; "
            "assert str(r.GRAMMAR_DIR).startswith(%r), r.GRAMMAR_DIR; "
            "print(attncc.compile(%r).explain(batch=2, seqlen=64))") % (str(site), str(ROOT / "examples/mla.attn"))
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "1152 bytes/token" in result.stdout
