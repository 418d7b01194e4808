"""attncc: a compiler from `.attn` decode-attention specs to CUDA kernels."""
from __future__ import annotations

import importlib

from .errors import SpecError

__version__ = "0.1.0"
__all__ = ["SpecError", "compile", "load_package", "reference", "__version__"]


def compile(path_or_text):  # noqa: A001 - the contract's name
    """Check a spec and return its Kernel; CUDA code is built on the first CUDA call.

    A Path, or a str ending in `.attn`, is a file; any other str is source text."""
    from .frontend import check_spec
    from .kernel import Kernel

    return Kernel(check_spec(path_or_text))


def load_package(directory):
    """Serve the kernels of a package (`attncc package SPEC... -o DIR`) to this process, with
    no CUDA toolkit needed; returns the package's specs compiled, {name: Kernel}."""
    from .cache import load_package as load

    return load(directory)


def __getattr__(name):
    # torch is heavy: `import attncc` stays cheap until the reference or a kernel is used
    if name == "reference":
        return importlib.import_module(".reference", __name__)
    raise AttributeError(f"module 'attncc' has no attribute {name!r}")
