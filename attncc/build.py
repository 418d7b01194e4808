"""JIT build: rendered CUDA → a C-ABI shared library, cached on disk.

The cache key hashes the canonical plan, the template sources, attncc's version, the
nvcc version and the arch. Builds run in a private temp dir under a file lock and are
renamed into place when complete, so concurrent processes build once and a killed
build never leaves a half-written entry. The library has no Python or torch coupling:
it builds wherever nvcc is, and loads under any Python."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


from . import __version__
from .lower import Plan
from .render import INCLUDE_DIR, render, source_name, template_digest
from .target import TARGETS

ARCH_FLAGS = {name: t.arch_flag for name, t in TARGETS.items()}
NVCC_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-Xptxas", "-v")
LIBRARY = "kernel.so"
READY = "READY"  # written last inside the temp dir: a directory without it is incomplete


def cache_root() -> Path:
    return Path(os.environ.get("ATTNCC_CACHE_DIR", Path.home() / ".cache" / "attncc"))


class BuildError(RuntimeError):
    """nvcc failed: carries the log, the generated source and a command to reproduce."""

    def __init__(self, message: str, log: str, source: Path, repro: str):
        self.log, self.source, self.repro = log, source, repro
        super().__init__(f"{message}\n  source: {source}\n  repro: {repro}\n{log}")


@lru_cache(maxsize=1)
def nvcc() -> str:
    found = shutil.which("nvcc") or next(
        (str(p) for p in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc",)
         if p.exists()), None)
    if found is None:
        raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)", "", Path("-"), "-")
    return found


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def cache_key(plan: Plan, arch: str | None = None) -> str:
    arch = arch or plan.target
    payload = {"plan": plan.canonical_json(), "templates": template_digest(),
               "attncc": __version__, "nvcc": nvcc_version(), "arch": arch,
               "flags": [*NVCC_FLAGS, ARCH_FLAGS[arch]]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def nvcc_command(source: Path, output: Path, arch: str) -> list[str]:
    return [nvcc(), *NVCC_FLAGS, ARCH_FLAGS[arch], f"-I{INCLUDE_DIR}", str(source), "-o", str(output)]


@dataclass(frozen=True)
class KernelResources:
    """One kernel's `-Xptxas -v` report."""

    function: str
    registers: int
    smem_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


_FUNCTION = re.compile(r"Compiling entry function '(\S+)' for")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str) -> list[KernelResources]:
    kernels, name, stack = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _FUNCTION.search(line):
            name = m.group(1)
        elif (m := _STACK.search(line)) and name:
            stack = tuple(int(g) for g in m.groups())
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            smem = re.search(r"(\d+) bytes smem", line)
            kernels.append(KernelResources(_demangle(name), int(m.group(1)),
                                           int(smem.group(1)) if smem else 0, *stack))
            name, stack = None, (0, 0, 0)
    return kernels


def _demangle(name: str) -> str:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool:
        return name
    out = subprocess.run([tool, name], capture_output=True, text=True)
    return out.stdout.strip() or name


class _Progress:
    """One status line with elapsed time while nvcc runs (stderr)."""

    def __init__(self, label: str):
        self.label, self.start, self.done = label, time.monotonic(), threading.Event()
        self.tty = sys.stderr.isatty()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self):
        while not self.done.wait(1.0 if self.tty else 10.0):
            self._line(end="\r" if self.tty else "\n")

    def _line(self, suffix: str = "", end: str = "\n"):
        print(f"attncc: building {self.label} ... {time.monotonic() - self.start:.1f}s{suffix}",
              end=end, file=sys.stderr, flush=True)

    def __enter__(self):
        self._line(end="\r" if self.tty else "\n")
        self.thread.start()
        return self

    def __exit__(self, exc_type, *_):
        self.done.set()
        self.thread.join()
        self._line(" (failed)" if exc_type else " done")


def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the pip package ships the binary
    except ImportError:
        raise BuildError("ninja not found (pip install ninja)", "", Path("-"), "-") from None
    return str(Path(ninja.BIN_DIR) / "ninja")


def _write_ninja(directory: Path, command: list[str]) -> None:
    """One rule, one edge: ninja runs nvcc and rebuilds only if the source changed."""
    source, output = command[-3], command[-1]
    flags = " ".join(shlex.quote(c) for c in command[1:-3])
    (directory / "build.ninja").write_text(
        f"rule nvcc\n  command = {shlex.quote(command[0])} {flags} $in -o $out\n"
        f"  description = nvcc $out\n"
        f"build {shlex.quote(Path(output).name)}: nvcc {shlex.quote(Path(source).name)}\n")


def compile_source(plan: Plan, directory: Path, arch: str | None = None,
                   progress: bool = True) -> tuple[Path, list[KernelResources], str]:
    """Render and compile into `directory` with ninja (no caching): the library, the
    ptxas report and the full compiler log. Raises BuildError carrying the log."""
    arch = arch or plan.target
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / source_name(plan)
    source.write_text(render(plan))
    library = directory / LIBRARY
    command = nvcc_command(source, library, arch)
    _write_ninja(directory, command)
    repro = shlex.join(command)
    with _Progress(f"{plan.name} for {arch}") if progress else _nullcontext():
        result = subprocess.run([_ninja(), "-C", str(directory)], capture_output=True, text=True)
        log = result.stdout + result.stderr
        if result.returncode != 0:  # inside the block: the progress line says "(failed)"
            raise BuildError(f"nvcc failed building `{plan.name}` (exit {result.returncode})",
                             log, source, repro)
    (directory / "ptxas.log").write_text(log)
    return library, parse_ptxas(log), log


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


def build(plan: Plan, arch: str | None = None, progress: bool = True) -> Path:
    """The cached library for a plan, building it at most once across processes."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = cache_key(plan, arch)
    final = root / key
    if (final / READY).exists():
        return final / LIBRARY
    from filelock import FileLock  # ~80 ms to import: only when something must be built

    with FileLock(str(root / f"{key}.lock")):
        if (final / READY).exists():  # another process finished while we waited
            return final / LIBRARY
        if final.exists():  # not READY: a rename cannot leave this, but be safe
            shutil.rmtree(final, ignore_errors=True)
        for dead in root.glob(f"{key}.*.tmp"):  # we hold the key's lock: their builder died
            shutil.rmtree(dead, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".tmp", dir=root))
        try:
            compile_source(plan, work, arch, progress)
        except BuildError as exc:
            # keep the failed sources where the error message (and its repro) point
            failed = root / "failed" / key
            shutil.rmtree(failed, ignore_errors=True)
            failed.parent.mkdir(exist_ok=True)
            os.replace(work, failed)
            raise BuildError(str(exc).splitlines()[0], exc.log, failed / exc.source.name,
                             exc.repro.replace(str(work), str(failed))) from None
        (work / READY).write_text(nvcc_version() + "\n")
        os.replace(work, final)
    return final / LIBRARY
