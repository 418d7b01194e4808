"""The compiled launcher of eager CUDA calls (csrc/launcher.cpp; DESIGN.md §3a): a small
Python extension that takes a Kernel call's arguments, reads their metadata and enqueues the
launch ops.prepare made of that signature, without running Python; and the same for
k.write_cache (ops.prepare_write).

It is built once per attncc, torch and Python (its key) with the host's C++ compiler (`CXX`,
else `c++`) against torch's headers, into the kernel cache beside the kernel libraries, or
found in a loaded package (`attncc package` adds it). Where it cannot be had (no compiler,
no Python headers, a failed build) eager calls take the Python path, ~100 µs slower, and one
warning says why. ATTNCC_LAUNCHER=0 turns it off."""
from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import warnings
from functools import lru_cache
from pathlib import Path

import torch

from . import __version__, abi
from . import build as builder
from . import cache
from .resources import PACKAGE_DIR
from .render import INCLUDE_DIR

SOURCE = PACKAGE_DIR / "csrc" / "launcher.cpp"
MODULE = "attncc_launcher"
FILE = MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
CXX_FLAGS = ("-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-w")


def enabled() -> bool:
    return os.environ.get("ATTNCC_LAUNCHER", "") != "0"


def _torch_dirs() -> tuple[list[str], str]:
    from torch.utils import cpp_extension

    return cpp_extension.include_paths(), str(Path(torch.__file__).resolve().parent / "lib")


def compiler() -> str:
    found = shutil.which(os.environ.get("CXX", "c++"))
    if found is None:
        raise builder.BuildError(f"no C++ compiler ({os.environ.get('CXX', 'c++')} not on PATH; set CXX)",
                                 "", SOURCE, "-")
    return found


def command(source: Path, output: Path) -> list[str]:
    includes, libdir = _torch_dirs()
    return [compiler(), *CXX_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{d}" for d in includes), f"-I{sysconfig.get_paths()['include']}", f"-I{INCLUDE_DIR}",
            str(source), "-o", str(output), f"-L{libdir}", "-lc10", "-ltorch", "-ltorch_cpu",
            "-ltorch_python", f"-Wl,-rpath,{libdir}"]


def key() -> str:
    """What the built extension depends on: its source, abi.h, attncc, torch and the Python ABI."""
    payload = {"source": SOURCE.read_text(), "abi": abi.HEADER.read_text(), "attncc": __version__,
               "torch": torch.__version__, "python": FILE, "flags": CXX_FLAGS}
    return "launcher-" + hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _compile(work: Path, progress: bool) -> Path:
    source, output = work / SOURCE.name, work / FILE
    shutil.copyfile(SOURCE, source)  # beside the build: a failed one keeps it with its repro
    cmd = command(source, output)
    with builder.Progress(f"the launcher ({FILE})") if progress else builder.Quiet():
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise builder.BuildError(f"the C++ compiler failed building attncc's launcher (exit "
                                     f"{result.returncode})", result.stdout + result.stderr, source,
                                     shlex.join(cmd))
    return output


def build(root: Path | None = None, progress: bool = True) -> Path:
    """The extension: from a loaded package, else from the cache, else built (once)."""
    name = key()
    for package in cache.packages():
        if (found := cache.verified(package / name, FILE)) is not None:
            return found
    root = Path(root) if root is not None else cache.cache_root()
    return cache.entry(root, name, name, FILE, lambda work: _compile(work, progress),
                       {"torch": torch.__version__, "python": sys.version.split()[0]})


def load(path: Path):
    spec = importlib.util.spec_from_file_location(
        MODULE, path, loader=importlib.machinery.ExtensionFileLoader(MODULE, str(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    abi.check_abi(module, path)
    return module


@lru_cache(maxsize=1)
def module():
    """The loaded extension, or None (with one warning) where it cannot be had."""
    try:
        return load(build())
    except (builder.BuildError, cache.CacheError, OSError, ImportError, abi.AbiMismatch) as exc:
        first = str(exc).splitlines()[0]
        warnings.warn(f"attncc: no compiled launcher ({first}); eager CUDA calls take the Python "
                      "path, which costs ~100 us more host time a call (ATTNCC_LAUNCHER=0 says you "
                      "know)", stacklevel=3)
        return None


def make(library: abi.Library, tensor_names: list[str], separate: bool, prepare, stream_of=None):
    """A Launcher driving `library`, or None where the extension cannot be had or is turned off.
    prepare(q, cache, block_table, seqlens, indices, num_splits, out, lse) -> ops.Prepared or None;
    stream_of(device index) -> the current stream (default: torch's current CUDA stream)."""
    if not enabled() or (ext := module()) is None:
        return None
    launch = ctypes.cast(library.dll.attncc_launch, ctypes.c_void_p).value
    return ext.Launcher(launch, list(tensor_names), separate, prepare, stream_of or _current_stream(),
                        library.fail)


def make_write(library: abi.Library, tensor_names: list[str], separate: bool, segments: list[str], prepare,
               stream_of=None):
    """A WriteLauncher driving `library`'s write_cache, or None where the extension cannot be had
    or is turned off. The caller asks it only for records the kernel takes (ops.kernel_writes).
    prepare(cache, slots, values) -> ops.PreparedWrite or None."""
    if not enabled() or (ext := module()) is None:
        return None
    write = ctypes.cast(library.dll.attncc_write_cache, ctypes.c_void_p).value
    return ext.WriteLauncher(write, list(tensor_names), separate, list(segments), prepare,
                             stream_of or _current_stream(), library.fail)


def _current_stream():
    """device index -> the current cudaStream_t: torch's raw getter (what inductor's code calls),
    else through the Stream object."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)
