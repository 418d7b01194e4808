"""Rendered CUDA → a C-ABI shared library: nvcc through ninja, its `-Xptxas -v` report,
and the errors of a failed build (the log, the source, a command to reproduce it). The
library has no Python or torch coupling: it builds wherever nvcc is, and loads under any
Python. cache.py keeps built libraries on disk."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


from .lower import Plan
from .render import INCLUDE_DIR, render, source_name
from .target import TARGETS

ARCH_FLAGS = {name: t.arch_flag for name, t in TARGETS.items()}
NVCC_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-Xptxas", "-v")
LIBRARY = "kernel.so"


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


# ptxas's warnings that wgmma instructions were serialized (a Hopper kernel at a fraction of speed)
_SERIALIZED = re.compile(r"\((C7515|C7511)\)|wgmma\S* instructions are serialized")


def unfit(kernels: list[KernelResources], log: str) -> list[str]:
    """What makes a build unfit to run: register spills, a stack frame (local memory on the hot
    path), wgmma serialized by ptxas. The lowering must not produce them; a build that has
    them is refused (compile_source), not run slowly."""
    problems = [f"{k.function}: {k.spill_stores} bytes spill stores, {k.spill_loads} bytes spill loads"
                for k in kernels if k.spill_stores or k.spill_loads]
    problems += [f"{k.function}: a {k.stack_bytes}-byte stack frame" for k in kernels if k.stack_bytes]
    problems += list(dict.fromkeys(line.strip() for line in log.splitlines() if _SERIALIZED.search(line)))
    return problems


def _demangle(name: str) -> str:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool:
        return name
    out = subprocess.run([tool, name], capture_output=True, text=True)
    return out.stdout.strip() or name


class Progress:
    """One status line with elapsed time while a compiler runs (stderr)."""

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


def compile_source(plan: Plan, directory: Path, arch: str | None = None, progress: bool = True,
                   strict: bool = True) -> tuple[Path, list[KernelResources], str]:
    """Render and compile into `directory` with ninja (no caching): the library, the
    ptxas report and the full compiler log. Raises BuildError carrying the log, also (strict)
    for a build that unfit() refuses."""
    arch = arch or plan.target
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / source_name(plan)
    source.write_text(render(plan))
    library = directory / LIBRARY
    command = nvcc_command(source, library, arch)
    _write_ninja(directory, command)
    repro = shlex.join(command)
    with Progress(f"{plan.name} for {arch}") if progress else Quiet():
        result = subprocess.run([_ninja(), "-C", str(directory)], capture_output=True, text=True)
        log = result.stdout + result.stderr
        if result.returncode != 0:  # inside the block: the progress line says "(failed)"
            raise BuildError(f"nvcc failed building `{plan.name}` (exit {result.returncode})",
                             log, source, repro)
    (directory / "ptxas.log").write_text(log)
    kernels = parse_ptxas(log)
    if strict and (problems := unfit(kernels, log)):
        raise BuildError(f"ptxas: `{plan.name}` for {arch} is refused: " + "; ".join(problems)
                         + " (a lowering bug: please report it with the spec)", log, source, repro)
    return library, kernels, log


class Quiet:
    """Progress's stand-in when none is shown."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False
