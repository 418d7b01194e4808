"""Helpers shared by the CPU tests."""
from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import attncc
import attncc.build

# small specs of every cache kind: packed, GQA, sparse fp8, separate fp8 with a shared segment
MLA_SMALL = """
attention mla_small {
    heads q = 4, kv = 1
    cache paged(4) {
        latent: bf16[64]
        rope:   bf16[32]
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
    scale 0.125
}
"""

GQA_SMALL = """
attention gqa_small {
    heads q = 8, kv = 2
    cache paged(4) {
        k: fp16[64]
        v: fp16[64]
    }
    key   = k
    value = v
    query len <= 2
}
"""

SPARSE_SMALL = """
attention sparse_small {
    heads q = 4, kv = 1
    cache paged(4) {
        latent: e4m3[64] scale fp32 per 16
        rope:   bf16[32]
    }
    key   = latent ++ rope
    value = latent
    tokens topk 6
    query len <= 2
}
"""

SEPARATE_SMALL = """
attention separate_small {
    heads q = 8, kv = 2
    cache paged(4) separate {
        latent: e5m2[64] scale fp32 per 16
        rope:   bf16[32] shared
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
}
"""


def compile_quiet(source, family=None):
    """attncc.compile without a tolerated knob's "not yet applied" warning (`family`: on that
    kernel family only, attncc.testing.on_family)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if family:
            from attncc import testing

            return testing.on_family(source, family)
        return attncc.compile(source)


def have_nvcc() -> bool:
    """The CUDA toolkit's nvcc is here (compile-only tests run; nothing needs a GPU)."""
    try:
        attncc.build.nvcc()
        attncc.build.nvcc_version()
    except (attncc.build.BuildError, OSError, subprocess.CalledProcessError):
        return False
    return True


def load_script(path: Path, name: str):
    """A script of the repository (examples/, bench/: not a package) as a module named `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def load_example(name: str):
    """examples/<name>.py as a module."""
    return load_script(Path(__file__).resolve().parent.parent / "examples" / f"{name}.py", name)


@contextlib.contextmanager
def no_host_sync():
    """The work enqueued so far finished, then any host sync inside raises (torch's sync
    debug mode): for calls that must not read the device back."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
