"""An installed (non-editable) package carries its grammar, templates and launcher source; a fresh machine
gets every dependency the code and tests import from pyproject.toml; CI proves it."""
import re
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
    assert "attncc/csrc/launcher.cpp" in names  # the compiled launcher is built from it


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


# --- what a fresh machine needs ---------------------------------------------------------------

# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml"}
STDLIB = set(sys.stdlib_module_names)
FIRST_PARTY = {"attncc", "specs", "support"}


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = _project()
    name = lambda req: re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower()  # noqa: E731
    extras = {k: {name(r) for r in v} for k, v in project.get("optional-dependencies", {}).items()}
    return {name(r) for r in project["dependencies"]}, extras


def _imports(paths) -> dict[str, set[str]]:
    """Top-level modules imported anywhere in these files (inside functions too), by file."""
    import ast

    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top not in STDLIB and top not in FIRST_PARTY:
                    found.setdefault(DISTRIBUTION.get(top, top).lower(), set()).add(path.name)
    return found


def test_every_import_is_declared():
    """attncc's imports are dependencies (or an extra a command names); the tests' are
    dependencies or the `test` extra; and nothing is declared that nothing imports."""
    runtime, extras = _declared()
    package = _imports((ROOT / "attncc").rglob("*.py"))
    tests = _imports(list((ROOT / "tests").glob("*.py")))
    optional = {"matplotlib": "plot"}  # attncc bench --plot, which says how to install it
    for module, files in package.items():
        if module in optional:
            assert module in extras[optional[module]], (module, files)
        else:
            assert module in runtime, f"{module} (imported by {sorted(files)}) is not a dependency"
    for module, files in tests.items():
        assert module in runtime | extras["test"], f"{module} (imported by {sorted(files)}) is not declared"
    used = set(package) | set(tests) | {"ninja"}  # ninja: the build runs its binary
    for module in runtime | extras["test"]:
        assert module in used or module == "setuptools", f"{module} is declared and never imported"


def test_torch_has_the_lower_bound_custom_op_needs():
    runtime_reqs = _project()["dependencies"]
    torch_req = next(r for r in runtime_reqs if r.startswith("torch"))
    assert re.fullmatch(r"torch>=2\.(\d+)", torch_req) and int(torch_req.split(".")[1]) >= 4, torch_req


def test_there_is_a_license():
    text = (ROOT / "LICENSE").read_text()
    assert "Permission is hereby granted" in text
    assert "license" in _project()


def test_ci_installs_into_a_fresh_venv_then_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    test_command = re.search(r"## Test\n+```\n(.+?)\n```", readme).group(1).strip()
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    activate = next(i for i, line in enumerate(lines) if "bin/activate" in line)
    installs = [i for i, line in enumerate(lines) if "pip install" in line]
    assert venv < activate < min(installs), "install into the fresh venv, not the machine's Python"
    assert all("python -m pip" in lines[i] for i in installs), "the venv's pip"
    assert lines[-1].replace("python3 ", "python ") == test_command
