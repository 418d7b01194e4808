"""Helpers shared by the CPU tests."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import attncc
import attncc.build


def compile_quiet(source):
    """attncc.compile without the `seesaw`/`crossover` "not yet applied" warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return attncc.compile(source)


def have_nvcc() -> bool:
    """The CUDA toolkit's nvcc is here (compile-only tests run; nothing needs a GPU)."""
    try:
        attncc.build.nvcc()
        attncc.build.nvcc_version()
    except (attncc.build.BuildError, OSError, subprocess.CalledProcessError):
        return False
    return True


def load_example(name: str):
    """examples/<name>.py as a module (the examples are scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module
