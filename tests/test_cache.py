"""The cache of built libraries (attncc/cache.py), on a machine with nvcc and no GPU.

(b) the cache key: stable, and sensitive to exactly what DESIGN.md §5 lists;
(c) build(): cached, atomic, locked across processes, never poisoned by a killed build;
(f) integrity: a corrupted entry is rebuilt, never loaded;
(g) an unusable cache says so and names ATTNCC_CACHE_DIR; entries follow the umask;
(h) no compiler at run time: a built library found without nvcc; packages."""
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
import attncc.cache
import attncc.render
import attncc.resources
from attncc.build import BuildError
from attncc.cache import build, cache_key

from specs import EXTRA
from support import compile_quiet, have_nvcc

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not have_nvcc(), reason="nvcc not found (CUDA toolkit needed)")


def plan_of(name: str):
    return compile_quiet(REPO / "examples" / f"{name}.attn").plan


SMALL = EXTRA["gqa4_d64"]  # the fastest compile of the grid


def small_plan():
    return compile_quiet(SMALL).plan


BROKEN = "attncc_test_broken_on_purpose"


# --- (b) cache keys --------------------------------------------------------------------

def test_cache_key_is_stable_across_calls():
    plan = plan_of("mla")
    key = cache_key(plan)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert cache_key(plan) == key == cache_key(plan_of("mla")) == cache_key(plan, plan.target)


def test_cache_key_is_stable_across_processes():
    code = ("import warnings; warnings.simplefilter('ignore'); import attncc, attncc.cache; "
            "print(attncc.cache.cache_key(attncc.compile('examples/mla.attn').plan))")
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
    monkeypatch.setattr(attncc.cache, "__version__", "99.0.0")
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


@pytest.mark.parametrize("path", ["decode.cu.j2", "plan.j2", "include/attncc/mma_sync/kernel.cuh",
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
        (directory / attncc.cache.LIBRARY).write_text(f"fake library {len(calls)}\n")
        return directory / attncc.cache.LIBRARY, [], ""

    monkeypatch.setattr(attncc.build, "compile_source", fake)
    return calls


def entries(root: Path) -> list[str]:
    """Entry directories and leftovers; locks and the nvcc-free pointers are not entries."""
    return sorted(p.name for p in root.iterdir() if not p.name.endswith((".lock", ".entry")))


def test_build_once_then_cached(cache_dir, counted, capsys):
    plan = small_plan()
    key = cache_key(plan)
    first = build(plan)
    assert len(counted) == 1
    assert first == cache_dir / key / attncc.cache.LIBRARY and first.is_file()
    assert (cache_dir / key / attncc.cache.READY).is_file()
    assert (cache_dir / key / f"{plan.name}.cu").read_text() == attncc.render.render(plan)
    assert entries(cache_dir) == [key], "no temp directory left behind"
    base = attncc.cache.base_key(plan)
    assert (cache_dir / f"{base}.entry").read_text().strip() == key, "found without nvcc too"
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
        import attncc, attncc.build, attncc.cache
        def boom(*a, **k):
            raise SystemExit("compile_source called on a cache hit")
        attncc.build.compile_source = boom
        print(attncc.cache.build(attncc.compile({SMALL!r}).plan))
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
    (leftover / attncc.cache.LIBRARY).write_text("half-written\n")
    unready = cache_dir / key
    unready.mkdir()
    (unready / attncc.cache.LIBRARY).write_text("stale, never marked READY\n")
    (unready / "junk").write_text("x")
    path = build(plan)
    assert len(faked) == 1, "an entry without READY is rebuilt"
    assert path == unready / attncc.cache.LIBRARY
    assert path.read_text() == "fake library 1\n"
    assert (unready / attncc.cache.READY).is_file() and not (unready / "junk").exists()
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
import attncc, attncc.build, attncc.cache
def hang(plan, directory, arch=None, progress=True):
    (directory / attncc.cache.LIBRARY).write_text("half")
    print("compiling", flush=True)
    time.sleep(600)
attncc.build.compile_source = hang
attncc.cache.build(attncc.compile(sys.argv[1]).plan)
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
    assert path == cache_dir / key / attncc.cache.LIBRARY
    assert path.read_text() == "fake library 1\n" and len(faked) == 1


CONCURRENT_BUILD = """
import os, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import attncc, attncc.build, attncc.cache
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
print(attncc.cache.build(plan, progress=False))
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
    assert paths == {str(cache_dir / key / attncc.cache.LIBRARY)}
    assert len(marker.read_text().splitlines()) == 1, marker.read_text()
    assert entries(cache_dir) == [key]
    library = cache_dir / key / attncc.cache.LIBRARY
    assert library.is_file() and ctypes.CDLL(str(library)).attncc_smem_bytes() == plan.config.smem_bytes


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




# --- (f) integrity -----------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["empty", "truncated", "same size, other bytes", "old READY"])
def test_a_corrupted_entry_is_rebuilt_not_loaded(cache_dir, faked, damage):
    plan = small_plan()
    path = build(plan)
    assert path.read_text() == "fake library 1\n"
    entry = path.parent
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_text("fake lib")
    elif damage == "same size, other bytes":
        path.write_text("fake library X\n")
    else:  # a READY of before the record: the nvcc version only
        (entry / attncc.cache.READY).write_text("Build cuda_13.0\n")
    assert attncc.cache.verified(entry) is None
    with pytest.warns(UserWarning, match="does not match its record.*rebuilding"):
        again = build(plan)
    assert again == path and again.read_text() == "fake library 2\n" and len(faked) == 2
    assert attncc.cache.verified(entry) == path
    assert build(plan) == path and len(faked) == 2  # and trusted again


def test_a_corrupted_entry_without_nvcc_is_an_error(cache_dir, faked, monkeypatch):
    plan = small_plan()
    path = build(plan)
    path.write_bytes(b"")
    monkeypatch.setattr(attncc.build, "nvcc_version", _no_nvcc)
    with pytest.raises(attncc.cache.CacheError, match="no built library for `gqa4_d64`.*no CUDA compiler"):
        build(plan)


def _no_nvcc():
    raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)", "", Path("-"), "-")


# --- (g) an unusable cache, shared caches ---------------------------------------------------------

def test_a_cache_below_a_file_says_what_failed(tmp_path, monkeypatch, faked):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(attncc.cache.CacheError) as info:
        build(small_plan())
    message = str(info.value)
    assert str(blocker / "cache") in message and "ATTNCC_CACHE_DIR" in message
    assert "cannot create the kernel cache" in message and not faked


def test_an_unwritable_cache_says_what_failed(cache_dir, faked, monkeypatch):
    cache_dir.mkdir(parents=True)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(attncc.cache.tempfile, "mkdtemp", refuse)
    with pytest.raises(attncc.cache.CacheError, match=r"cannot write to the kernel cache at .*Permission "
                                                     r"denied\. Set ATTNCC_CACHE_DIR"):
        build(small_plan())


def test_a_cache_hit_needs_no_lock_and_no_write(cache_dir, faked, monkeypatch):
    plan = small_plan()
    path = build(plan)
    import filelock

    def no_lock(*args, **kwargs):
        raise AssertionError("a cache hit took a lock")

    monkeypatch.setattr(filelock, "FileLock", no_lock)
    monkeypatch.setattr(attncc.cache.tempfile, "mkdtemp", no_lock)
    assert build(plan) == path


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_entries_follow_the_umask(cache_dir, faked, mask):
    old = os.umask(mask)
    try:
        path = build(small_plan())
    finally:
        os.umask(old)
    entry = path.parent
    assert entry.stat().st_mode & 0o777 == 0o777 & ~mask
    assert (entry / attncc.cache.READY).stat().st_mode & 0o777 == 0o666 & ~mask
    pointer = cache_dir / f"{attncc.cache.base_key(small_plan())}.entry"
    assert pointer.stat().st_mode & 0o777 == 0o666 & ~mask


# --- (h) no compiler at run time, packages --------------------------------------------------------

NO_NVCC_ENV = {"PATH": "/usr/bin:/bin", "CUDA_HOME": "/nonexistent-cuda", "CXX": "/nonexistent-c++"}

LOAD_WITHOUT_NVCC = """
import ctypes, shutil, sys, warnings
warnings.simplefilter("ignore")
import attncc, attncc.abi, attncc.build
assert shutil.which("nvcc") is None
try:
    attncc.build.nvcc()
    raise SystemExit("nvcc was found")
except attncc.build.BuildError:
    pass
if sys.argv[1] == "package":
    kernels = attncc.load_package(sys.argv[2])
    k = kernels[sys.argv[3]]
else:
    k = attncc.compile(sys.argv[3])
path = k.build()
attncc.abi.check_abi(ctypes.CDLL(str(path)), path)
if len(sys.argv) > 4:  # and the compiled launcher, built for this torch: no C++ compiler needed
    import attncc.launcher
    print(attncc.launcher.build())
print(path)
"""


def _without_nvcc(tmp_path, *args, cache=None):
    script = tmp_path / "attncc_load_worker.py"
    script.write_text(LOAD_WITHOUT_NVCC)
    env = dict(NO_NVCC_ENV, PYTHONPATH=str(REPO))
    if cache is not None:
        env["ATTNCC_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_a_built_library_loads_where_there_is_no_nvcc(cache_dir, tmp_path):
    path = build(small_plan(), progress=False)
    out = _without_nvcc(tmp_path, "cache", "-", SMALL, cache=cache_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(path)


def test_without_nvcc_an_unbuilt_spec_says_how_to_get_one(tmp_path):
    out = _without_nvcc(tmp_path, "cache", "-", SMALL, cache=tmp_path / "empty-cache")
    assert out.returncode != 0
    assert "no built library for `gqa4_d64`" in out.stderr and "attncc package" in out.stderr
    assert "Traceback" in out.stderr  # an exception, but one that says what to do


def test_a_package_is_built_and_loaded_from_another_directory(tmp_path, capsys):
    from attncc.cli import main

    package = tmp_path / "pkg"
    spec_file = tmp_path / "gqa4_d64.attn"
    spec_file.write_text(SMALL)
    assert main(["package", str(spec_file), str(REPO / "examples" / "gqa8.attn"), "-o", str(package)]) == 0
    out = capsys.readouterr().out
    assert "gqa4_d64" in out and "gqa8" in out and str(package) in out
    assert sorted(p.name for p in (package / "specs").iterdir()) == ["gqa4_d64.attn", "gqa8.attn"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for how in ("package", "cache"):
        args = (how, str(package), "gqa4_d64") if how == "package" else (how, "-", str(spec_file))
        result = _without_nvcc(elsewhere, *args, "launcher", cache=package if how == "cache" else tmp_path / "none")
        assert result.returncode == 0, result.stderr
        launcher, library = result.stdout.strip().splitlines()[-2:]
        assert library.startswith(str(package)) and launcher.startswith(str(package)), how


def test_load_package_refuses_a_directory_that_is_not_one(tmp_path):
    with pytest.raises(attncc.cache.CacheError, match="not an attncc package"):
        attncc.load_package(tmp_path)
