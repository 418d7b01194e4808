"""The JIT build (attncc/build.py) on a machine with nvcc and no GPU.

(a) nvcc compile-only of every example (sm_90a and sm_80) and of the extra grid of
    tests/specs.py: both kernels present, no spills, no stack, <= 255 registers, and the
    library's exported shared-memory size equal to the plan's;
(b) the cache key: stable, and sensitive to exactly what DESIGN.md §5 lists;
(c) build(): cached, atomic, locked across processes, never poisoned by a killed build;
(d) a failing build's BuildError (nvcc text, the generated source, a repro command);
(e) the progress line on stderr."""
from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import attncc
import attncc.build
import attncc.render
import attncc.resources
from attncc.build import BuildError, build, cache_key, compile_source
from attncc.split import ctas_per_split

from specs import EXTRA
from support import compile_quiet, have_nvcc

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.attn"))




pytestmark = pytest.mark.skipif(not have_nvcc(), reason="nvcc not found (CUDA toolkit needed)")

ARCH_CODE = {"sm90a": "sm_90a", "sm80": "sm_80"}




def plan_of(name: str):
    return compile_quiet(REPO / "examples" / f"{name}.attn").plan


def sm80(text: str) -> str:
    """An attention block of tests/specs.py with a `target sm80` schedule."""
    name = re.search(r"attention (\w+)", text)[1]
    return text + f"\nschedule {name} {{\n    target sm80\n}}\n"


SMALL = EXTRA["gqa4_d64"]  # the fastest compile of the grid


def small_plan():
    return compile_quiet(SMALL).plan


# --- (a) compile-only ------------------------------------------------------------------

CASES = ([(f"example:{n}", arch) for n in EXAMPLES for arch in ("sm90a", "sm80")]
         + [(f"extra:{n}", "sm90a") for n in EXTRA]
         + [(f"sm80:{n}", None) for n in ("gqa4_d64", "mla_fp8_per64", "gla2_separate_fp16",
                                          "mla_page1")])


def case_plan(case: str):
    kind, name = case.split(":")
    if kind == "example":
        return plan_of(name)
    if kind == "extra":
        return compile_quiet(EXTRA[name]).plan
    plan = compile_quiet(sm80(EXTRA[name])).plan
    assert plan.target == "sm80"
    return plan


@pytest.mark.parametrize("case, arch", CASES, ids=[f"{c}-{a or 'target'}" for c, a in CASES])
def test_compiles_without_spills(tmp_path, case, arch):
    plan = case_plan(case)
    library, kernels, log = compile_source(plan, tmp_path, arch, progress=False)
    arch = arch or plan.target
    assert library.is_file() and library == tmp_path / attncc.build.LIBRARY
    assert f"for '{ARCH_CODE[arch]}'" in log, "compiled for the requested arch"
    assert (tmp_path / "ptxas.log").read_text() == log
    names = [k.function for k in kernels]
    decode = [k for k in kernels if "decode_kernel" in k.function]
    parts = [k for k in kernels if "decode_parts_kernel" in k.function]
    combine = [k for k in kernels if "combine_kernel" in k.function]
    assert len(decode) == 1 and len(parts) == 1 and len(combine) == 1, names
    assert len(kernels) == 3, names
    for k in decode + parts + combine:
        assert k.spill_stores == 0, f"{k.function}: {k.spill_stores} bytes spill stores\n{log}"
        assert k.spill_loads == 0, f"{k.function}: {k.spill_loads} bytes spill loads\n{log}"
        assert k.stack_bytes == 0, f"{k.function}: {k.stack_bytes} bytes stack\n{log}"
        assert 0 < k.registers <= 255
    # the C ABI of abi.h; the constants need no GPU to read
    lib = ctypes.CDLL(str(library))
    assert lib.attncc_smem_bytes() == plan.config.smem_bytes, "the library uses the plan's shared memory"
    assert lib.attncc_threads() == plan.config.threads
    for s_q in range(1, plan.max_sq + 1):  # the library's grid arithmetic is split.py's
        assert lib.attncc_ctas_per_split(s_q) == ctas_per_split(plan, s_q), s_q
    # the generated source is the rendered plan
    assert (tmp_path / f"{plan.name}.cu").read_text() == attncc.render.render(plan)


def test_parse_ptxas_report():
    log = textwrap.dedent("""\
        ptxas info    : 0 bytes gmem
        ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
        ptxas info    : Function properties for _Z3fooPf
            8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
        ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'
        ptxas info    : Function properties for _Z3barv
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 8 registers, used 0 barriers, 380 bytes cmem[0]
        """)
    foo, bar = attncc.build.parse_ptxas(log)
    assert (foo.registers, foo.smem_bytes, foo.stack_bytes, foo.spill_stores, foo.spill_loads) == (
        40, 1024, 8, 4, 12)
    assert "foo" in foo.function
    assert (bar.registers, bar.smem_bytes, bar.stack_bytes, bar.spill_stores, bar.spill_loads) == (
        8, 0, 0, 0, 0)


# --- (b) cache keys --------------------------------------------------------------------

def test_cache_key_is_stable_across_calls():
    plan = plan_of("mla")
    key = cache_key(plan)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert cache_key(plan) == key == cache_key(plan_of("mla")) == cache_key(plan, plan.target)


def test_cache_key_is_stable_across_processes():
    code = ("import warnings; warnings.simplefilter('ignore'); import attncc, attncc.build; "
            "print(attncc.build.cache_key(attncc.compile('examples/mla.attn').plan))")
    keys = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        keys.add(out.stdout.strip().splitlines()[-1])
    assert keys == {cache_key(plan_of("mla"))}


GQA8 = (REPO / "examples" / "gqa8.attn").read_text()
EDITS = [
    ("heads q = 32, kv = 8", "heads q = 64, kv = 8"),
    ("heads q = 32, kv = 8", "heads q = 32, kv = 4"),
    ("paged(16)", "paged(32)"),
    ("k: bf16[128]", "k: bf16[64]"),
    ("v: bf16[128]", "v: bf16[256]"),
    ("key   = k", "key   = k[0:64]"),
    ("value = v\n", "value = v\n    query len <= 2\n"),
    ("value = v\n", "value = v\n    query len <= 2 causal\n"),
    ("k: bf16[128]\n        v: bf16[128]", "k: fp16[128]\n        v: fp16[128]"),
    ("attention gqa8", "attention gqa8b"),
    ("}\n", "}\nschedule gqa8 {\n    split_kv 4\n}\n"),
    ("}\n", "}\nschedule gqa8 {\n    split_kv off\n}\n"),
    ("}\n", "}\nschedule gqa8 {\n    tile q = 32, kv = 32\n}\n"),
    ("}\n", "}\nschedule gqa8 {\n    stages 5\n}\n"),
    ("}\n", "}\nschedule gqa8 {\n    target sm80\n}\n"),
]


def _edit(text: str, old: str, new: str) -> str:
    if old == "}\n":  # append after the attention block's closing brace
        assert text.endswith("}\n")
        return text + new[2:]
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("old, new", EDITS)
def test_cache_key_changes_with_the_plan(old, new):
    base = compile_quiet(GQA8).plan
    edited = compile_quiet(_edit(GQA8, old, new)).plan
    assert edited != base
    assert cache_key(edited) != cache_key(base)


def test_softmax_scale_is_a_runtime_argument_not_part_of_the_key():
    # the library takes the scale per call (AttnccArgs.softmax_scale): one build serves both
    edited = compile_quiet(_edit(GQA8, "value = v\n", "value = v\n    scale 0.125\n"))
    assert edited.spec.softmax_scale == 0.125
    assert cache_key(edited.plan) == cache_key(compile_quiet(GQA8).plan)


def test_cache_key_ignores_whitespace_and_comments():
    base = cache_key(compile_quiet(GQA8).plan)
    reformatted = "# a comment before it all\n\n" + "\n".join(
        "\t" + line.strip() + "   # trailing comment" if line.strip() and not line.strip().startswith("#")
        else line for line in GQA8.splitlines()) + "\n\n\n"
    assert reformatted != GQA8
    assert cache_key(compile_quiet(reformatted).plan) == base
    # a file and the same text, and the same spec on one line each
    assert cache_key(compile_quiet(REPO / "examples" / "gqa8.attn").plan) == base
    one_line = ("attention gqa8 { heads q = 32, kv = 8 cache paged(16) { k: bf16[128] "
                "v: bf16[128] } key = k value = v }")
    assert cache_key(compile_quiet(one_line).plan) == base


def test_cache_key_changes_with_the_arch():
    plan = plan_of("gqa8")
    assert cache_key(plan, "sm80") != cache_key(plan, "sm90a") == cache_key(plan)


def test_cache_key_changes_with_attncc_version(monkeypatch):
    plan = plan_of("gqa8")
    before = cache_key(plan)
    monkeypatch.setattr(attncc, "__version__", "99.0.0")
    monkeypatch.setattr(attncc.build, "__version__", "99.0.0", raising=False)
    assert cache_key(plan) != before
    monkeypatch.undo()
    assert cache_key(plan) == before


def test_cache_key_changes_with_nvcc_version(monkeypatch):
    plan = plan_of("gqa8")
    before = cache_key(plan)
    real = attncc.build.nvcc_version()
    assert real and "cuda" in real.lower()
    monkeypatch.setattr(attncc.build, "nvcc_version", lambda: real + " (patched)")
    assert cache_key(plan) != before


@pytest.fixture
def template_copy(tmp_path, monkeypatch):
    """A private copy of templates/ that attncc.render reads instead."""
    copy = tmp_path / "templates"
    shutil.copytree(attncc.render.TEMPLATES_DIR, copy)
    monkeypatch.setattr(attncc.render, "TEMPLATES_DIR", copy)
    monkeypatch.setattr(attncc.render, "INCLUDE_DIR", copy / "include")
    monkeypatch.setattr(attncc.build, "INCLUDE_DIR", copy / "include")
    attncc.render._environment.cache_clear()
    yield copy
    attncc.render._environment.cache_clear()


@pytest.mark.parametrize("path", ["mma_sync/decode.cu.j2", "plan.j2", "include/attncc/mma_sync/kernel.cuh",
                                  "include/attncc/core/softmax.cuh", "include/attncc/abi.h"])
def test_cache_key_changes_with_template_content(template_copy, path):
    plan = plan_of("gqa8")
    before = cache_key(plan)
    target = template_copy / path
    assert target.is_file()
    comment = "{# edited #}\n" if path.endswith(".j2") else "// edited\n"
    target.write_text(target.read_text() + comment)
    assert cache_key(plan) != before


def test_cache_key_same_for_an_identical_template_copy(template_copy, monkeypatch):
    # the copy has the same content: the key does not depend on where templates live
    plan = plan_of("gqa8")
    key = cache_key(plan)
    with monkeypatch.context() as m:
        m.setattr(attncc.render, "TEMPLATES_DIR", attncc.resources.TEMPLATES_DIR)
        assert attncc.render.TEMPLATES_DIR != template_copy
        assert cache_key(plan) == key
    new_header = template_copy / "include" / "attncc" / "extra.cuh"
    key = cache_key(plan)
    new_header.write_text("#pragma once\n")
    assert cache_key(plan) != key, "a new header is part of the key"
    new_header.unlink()
    (template_copy / "notes.txt").write_text("not a template")
    assert cache_key(plan) == key


# --- (c) build(): cached, atomic, locked -----------------------------------------------

@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(root))
    return root


@pytest.fixture
def counted(monkeypatch):
    """compile_source, counted: calls the real one."""
    calls = []
    real = attncc.build.compile_source

    def wrapper(plan, directory, arch=None, progress=True):
        calls.append((plan.name, Path(directory), arch))
        return real(plan, directory, arch, progress)

    monkeypatch.setattr(attncc.build, "compile_source", wrapper)
    return calls


@pytest.fixture
def faked(monkeypatch):
    """compile_source replaced by one that writes a dummy library (no nvcc)."""
    calls = []

    def fake(plan, directory, arch=None, progress=True):
        calls.append(Path(directory))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / attncc.build.LIBRARY).write_text(f"fake library {len(calls)}\n")
        return directory / attncc.build.LIBRARY, [], ""

    monkeypatch.setattr(attncc.build, "compile_source", fake)
    return calls


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))


def test_build_once_then_cached(cache_dir, counted, capsys):
    plan = small_plan()
    key = cache_key(plan)
    first = build(plan)
    assert len(counted) == 1
    assert first == cache_dir / key / attncc.build.LIBRARY and first.is_file()
    assert (cache_dir / key / attncc.build.READY).is_file()
    assert (cache_dir / key / f"{plan.name}.cu").read_text() == attncc.render.render(plan)
    assert entries(cache_dir) == [key], "no temp directory left behind"
    err = capsys.readouterr().err
    assert re.search(rf"attncc: building {plan.name} for sm90a \.\.\. \d+\.\ds done", err), err
    second = build(plan)
    assert second == first and len(counted) == 1
    assert capsys.readouterr().err == "", "a cache hit prints nothing"
    # another arch is another entry
    other = build(plan, "sm80")
    assert other != first and len(counted) == 2 and other.is_file()


def test_build_cached_across_processes(cache_dir, faked):
    plan = small_plan()
    path = build(plan)
    script = textwrap.dedent(f"""
        import warnings; warnings.simplefilter("ignore")
        import attncc, attncc.build
        def boom(*a, **k):
            raise SystemExit("compile_source called on a cache hit")
        attncc.build.compile_source = boom
        print(attncc.build.build(attncc.compile({SMALL!r}).plan))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=dict(os.environ, ATTNCC_CACHE_DIR=str(cache_dir)), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(path)


def test_leftover_temp_dir_and_unready_entry_do_not_poison(cache_dir, faked):
    plan = small_plan()
    key = cache_key(plan)
    cache_dir.mkdir(parents=True)
    leftover = cache_dir / f"{key}.abc123.tmp"
    leftover.mkdir()
    (leftover / attncc.build.LIBRARY).write_text("half-written\n")
    unready = cache_dir / key
    unready.mkdir()
    (unready / attncc.build.LIBRARY).write_text("stale, never marked READY\n")
    (unready / "junk").write_text("x")
    path = build(plan)
    assert len(faked) == 1, "an entry without READY is rebuilt"
    assert path == unready / attncc.build.LIBRARY
    assert path.read_text() == "fake library 1\n"
    assert (unready / attncc.build.READY).is_file() and not (unready / "junk").exists()
    assert build(plan) == path and len(faked) == 1


def test_failed_build_leaves_no_entry(cache_dir, monkeypatch):
    plan = small_plan()

    def failing(plan, directory, arch=None, progress=True):
        (directory / "partial.o").write_text("x")
        raise BuildError("nvcc failed (simulated)", "log", directory / "x.cu", "repro")

    monkeypatch.setattr(attncc.build, "compile_source", failing)
    with pytest.raises(BuildError) as err:
        build(plan)
    # no cache entry; the failed sources are kept apart, where the error points
    assert entries(cache_dir) == ["failed"]
    kept = cache_dir / "failed" / cache_key(plan)
    assert (kept / "partial.o").is_file() and str(kept / "x.cu") in str(err.value)


KILLED_BUILD = """
import sys, time, warnings
warnings.simplefilter("ignore")
import attncc, attncc.build
def hang(plan, directory, arch=None, progress=True):
    (directory / attncc.build.LIBRARY).write_text("half")
    print("compiling", flush=True)
    time.sleep(600)
attncc.build.compile_source = hang
attncc.build.build(attncc.compile(sys.argv[1]).plan)
"""


def test_killed_build_does_not_poison(cache_dir, faked, tmp_path):
    plan = small_plan()
    script = tmp_path / "attncc_killed_worker.py"
    script.write_text(KILLED_BUILD)
    proc = subprocess.Popen([sys.executable, str(script), SMALL], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, ATTNCC_CACHE_DIR=str(cache_dir)))
    try:
        assert proc.stdout.readline().strip() == "compiling"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    key = cache_key(plan)
    assert not (cache_dir / key).exists()
    assert any(p.name.startswith(key) and p.name.endswith(".tmp") for p in cache_dir.iterdir())
    path = build(plan)  # the dead process's lock is gone; its temp dir is ignored
    assert path == cache_dir / key / attncc.build.LIBRARY
    assert path.read_text() == "fake library 1\n" and len(faked) == 1


CONCURRENT_BUILD = """
import os, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import attncc, attncc.build
marker, go = Path(sys.argv[2]), Path(sys.argv[3])
real = attncc.build.compile_source
def counted(plan, directory, arch=None, progress=True):
    with open(marker, "a") as f:
        f.write(f"{os.getpid()} {directory}\\n")
    return real(plan, directory, arch, progress)
attncc.build.compile_source = counted
plan = attncc.compile(sys.argv[1]).plan
Path(str(go) + f".ready.{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.01)
print(attncc.build.build(plan, progress=False))
"""


def test_concurrent_processes_build_once(cache_dir, tmp_path):
    plan = small_plan()
    script = tmp_path / "attncc_build_worker.py"
    script.write_text(CONCURRENT_BUILD)
    marker, go = tmp_path / "compiles.txt", tmp_path / "go"
    env = dict(os.environ, ATTNCC_CACHE_DIR=str(cache_dir))
    procs = [subprocess.Popen([sys.executable, str(script), SMALL, str(marker), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready.*"))) < len(procs):
        assert time.monotonic() < deadline, "workers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()  # all start building at once
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    paths = {out.strip().splitlines()[-1] for out, _ in results}
    key = cache_key(plan)
    assert paths == {str(cache_dir / key / attncc.build.LIBRARY)}
    assert len(marker.read_text().splitlines()) == 1, marker.read_text()
    assert entries(cache_dir) == [key]
    library = cache_dir / key / attncc.build.LIBRARY
    assert library.is_file() and ctypes.CDLL(str(library)).attncc_smem_bytes() == plan.config.smem_bytes


# --- (d) a failing build ---------------------------------------------------------------

BROKEN = "attncc_test_broken_on_purpose"


def test_build_error_carries_nvcc_text_source_and_repro(tmp_path, monkeypatch):
    plan = small_plan()
    real_render = attncc.build.render
    monkeypatch.setattr(attncc.build, "render", lambda p: real_render(p) + f"\n#error {BROKEN}\n")
    with pytest.raises(BuildError) as info:
        compile_source(plan, tmp_path, progress=False)
    exc = info.value
    text = str(exc)
    assert BROKEN in text and "error" in text.lower()
    assert str(exc.source) in text and exc.source == tmp_path / f"{plan.name}.cu"
    assert exc.source.is_file() and BROKEN in exc.source.read_text()
    assert exc.repro in text and "nvcc" in exc.repro and str(exc.source) in exc.repro
    assert BROKEN in exc.log
    # the repro command reproduces the failure, from anywhere
    out = subprocess.run(shlex.split(exc.repro), cwd="/", capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and BROKEN in out.stdout + out.stderr


def test_build_error_for_missing_headers(tmp_path, monkeypatch):
    plan = small_plan()
    empty = tmp_path / "empty-include"
    empty.mkdir()
    monkeypatch.setattr(attncc.build, "INCLUDE_DIR", empty)
    with pytest.raises(BuildError) as info:
        compile_source(plan, tmp_path / "work", progress=False)
    text = str(info.value)
    assert "attncc/abi.h" in text and str(empty) in info.value.repro
    assert f"source: {tmp_path / 'work' / (plan.name + '.cu')}" in text
    assert "repro: " in text


def test_build_error_from_build_keeps_the_source_it_names(cache_dir, monkeypatch):
    """build() fails: the message names the generated source and a repro command; both
    must still be usable after build() returns (the cache itself stays clean)."""
    plan = small_plan()
    real_render = attncc.build.render
    monkeypatch.setattr(attncc.build, "render", lambda p: real_render(p) + f"\n#error {BROKEN}\n")
    with pytest.raises(BuildError) as info:
        build(plan, progress=False)
    exc = info.value
    assert BROKEN in str(exc) and str(exc.source) in str(exc)
    assert not (cache_dir / cache_key(plan)).exists()
    assert exc.source.is_file(), f"the error names {exc.source}, which no longer exists"
    out = subprocess.run(shlex.split(exc.repro), capture_output=True, text=True, timeout=300)
    assert BROKEN in out.stdout + out.stderr


# --- (e) progress ----------------------------------------------------------------------

def test_progress_line_on_stderr(tmp_path, capsys):
    plan = small_plan()
    compile_source(plan, tmp_path, progress=True)
    out, err = capsys.readouterr()
    assert "attncc: building" not in out
    lines = [line for line in re.split(r"[\r\n]", err) if line]
    assert lines[0].startswith(f"attncc: building {plan.name} for sm90a ... ")
    assert re.fullmatch(rf"attncc: building {plan.name} for sm90a \.\.\. \d+\.\ds done", lines[-1]), err
    assert float(re.search(r"(\d+\.\d)s done", lines[-1])[1]) > 0


def test_progress_line_reports_failure(tmp_path, capsys, monkeypatch):
    plan = small_plan()
    real_render = attncc.build.render
    monkeypatch.setattr(attncc.build, "render", lambda p: real_render(p) + f"\n#error {BROKEN}\n")
    with pytest.raises(BuildError):
        compile_source(plan, tmp_path, progress=True)
    err = capsys.readouterr().err
    assert re.search(rf"attncc: building {plan.name} for sm90a \.\.\. \d+\.\ds \(failed\)", err), err


def test_no_progress_when_disabled(tmp_path, capsys):
    compile_source(small_plan(), tmp_path, "sm80", progress=False)
    assert "attncc: building" not in capsys.readouterr().err
