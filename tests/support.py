"""Helpers shared by the CPU tests."""
from __future__ import annotations

import subprocess
import warnings

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
