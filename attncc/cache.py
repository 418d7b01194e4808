"""The on-disk cache of built kernel libraries, and packages of them.

An entry is `<root>/<key>/` holding the library (kernel.so), the generated source, the
compiler's log and a READY record written last: what built it (nvcc's version), the
library's size and sha256. key hashes the canonical plan, the template sources, attncc's
version, the nvcc version, the arch and the flags (DESIGN.md §5). Beside the entries,
`<root>/<base>.entry` names the newest entry of a plan built by any nvcc (base: the same hash
without the nvcc version), so a process with no nvcc still finds it.

Builds run in a private temp dir under a file lock and are renamed into place when complete,
so concurrent processes build once and a killed build never leaves an entry. Before a library
is loaded its size and sha256 are checked against the record: a corrupted entry is rebuilt
(with a warning) where nvcc is, and an error where it is not; it never reaches dlopen.

Entries and files are created with the process's umask, so a cache shared by a team is
readable by it. `attncc package SPEC... -o DIR` builds a directory of entries (a cache root
with the specs' sources, and the compiled launcher of launcher.py for this torch and Python);
`load_package(DIR)` or `ATTNCC_CACHE_DIR=DIR` serves it. `entry` is the one way an entry is
made, for kernel libraries and the launcher alike."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from . import __version__
from . import build as builder
from .lower import Plan
from .render import template_digest

LIBRARY = builder.LIBRARY
READY = "READY"  # written last inside the temp dir: a directory without it is incomplete
PACKAGE_SPECS = "specs"  # a package's spec sources, one .attn per spec
_PACKAGES: list[Path] = []  # roots added by load_package, searched before the cache


class CacheError(RuntimeError):
    """The cache cannot be used (unwritable, not a directory), or holds no usable library
    where none can be built."""


def packages() -> list[Path]:
    """The roots load_package added, searched (newest first) before the cache."""
    return list(_PACKAGES)


def cache_root() -> Path:
    return Path(os.environ.get("ATTNCC_CACHE_DIR", Path.home() / ".cache" / "attncc"))


def _payload(plan: Plan, arch: str) -> dict:
    return {"plan": plan.canonical_json(), "templates": template_digest(), "attncc": __version__,
            "arch": arch, "flags": [*builder.NVCC_FLAGS, builder.ARCH_FLAGS[arch]]}


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def base_key(plan: Plan, arch: str | None = None) -> str:
    """The entry's identity without the compiler: what a process with no nvcc looks up."""
    return _digest(_payload(plan, arch or plan.target))


def cache_key(plan: Plan, arch: str | None = None) -> str:
    """The entry's directory name: base_key's payload and the nvcc version."""
    return _digest({**_payload(plan, arch or plan.target), "nvcc": builder.nvcc_version()})


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _share(path: Path) -> None:
    """Make a directory mkdtemp created (mode 0700) as readable as the umask allows."""
    os.chmod(path, 0o777 & ~_umask())


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record(entry: Path) -> dict | None:
    try:
        return json.loads((entry / READY).read_text())
    except (OSError, ValueError):
        return None


def verified(entry: Path, name: str = LIBRARY) -> Path | None:
    """The entry's library if its READY record vouches for it (size and sha256), else None."""
    record = _record(entry)
    library = entry / name
    if not isinstance(record, dict):
        return None
    try:
        if library.stat().st_size != record.get("size") or _file_sha256(library) != record.get("sha256"):
            return None
    except OSError:
        return None
    return library


def _find_by_base(root: Path, base: str) -> Path | None:
    try:
        key = (root / f"{base}.entry").read_text().strip()
    except OSError:
        return None
    return verified(root / key) if key else None


def _unusable(root: Path, what: str, exc: OSError) -> CacheError:
    return CacheError(f"cannot {what} the kernel cache at {root}: {exc.strerror or exc}. Set "
                      "ATTNCC_CACHE_DIR to a writable directory (or use attncc.load_package for a "
                      "read-only package)")


def _write_entry_pointer(root: Path, base: str, key: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f"{base}.", suffix=".tmp", dir=root)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, root / f"{base}.entry")


def build(plan: Plan, arch: str | None = None, progress: bool = True, root: Path | None = None) -> Path:
    """The library for a plan: from a loaded package, else from the cache, else built (at
    most once across processes). Without nvcc, only what is already built is found."""
    arch = arch or plan.target
    base = base_key(plan, arch)
    for package in _PACKAGES:
        if (found := _find_by_base(package, base)) is not None:
            return found
    root = Path(root) if root is not None else cache_root()
    try:
        builder.nvcc_version()
    except (builder.BuildError, OSError, subprocess.CalledProcessError) as exc:
        found = _find_by_base(root, base)
        if found is not None:
            return found
        raise CacheError(f"no built library for `{plan.name}` ({arch}) in {root} and no CUDA "
                         f"compiler here to build one ({exc}). Build it where nvcc is (the first "
                         "call, or `attncc package`), then point ATTNCC_CACHE_DIR at that cache "
                         "or load the package with attncc.load_package(DIR)") from None
    return entry(root, cache_key(plan, arch), base, LIBRARY,
                 lambda work: builder.compile_source(plan, work, arch, progress)[0],
                 {"nvcc": builder.nvcc_version(), "plan": plan.name})


def entry(root: Path, key: str, base: str, name: str, make, record: dict) -> Path:
    """`root/key/name`, verified, or made by make(work_dir) -> path of `name` in it (at most once
    across processes: under the key's lock, in a temp dir renamed into place with a READY record
    of its size and sha256 plus `record`; a failed build's sources are kept in root/failed/key)."""
    final = root / key
    if (final / READY).exists():
        if (library := verified(final, name)) is not None:
            return library
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unusable(root, "create", exc) from None
    from filelock import FileLock  # ~80 ms to import: only when something must be built

    try:
        lock = FileLock(str(root / f"{key}.lock"))
        lock.acquire()
    except OSError as exc:
        raise _unusable(root, "lock an entry of", exc) from None
    try:
        if (library := verified(final, name)) is not None:  # another process finished while we waited
            return library
        if final.exists():  # no READY, or it does not vouch for the library: rebuild it
            if (final / READY).exists():
                warnings.warn(f"attncc: the cached library {final / name} does not match its "
                              "record (size or sha256): rebuilding it", stacklevel=3)
            shutil.rmtree(final, ignore_errors=True)
        for dead in root.glob(f"{key}.*.tmp"):  # we hold the key's lock: their builder died
            shutil.rmtree(dead, ignore_errors=True)
        try:
            work = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".tmp", dir=root))
            _share(work)
        except OSError as exc:
            raise _unusable(root, "write to", exc) from None
        try:
            library = make(work)
        except builder.BuildError as exc:
            # keep the failed sources where the error message (and its repro) point
            failed = root / "failed" / key
            shutil.rmtree(failed, ignore_errors=True)
            failed.parent.mkdir(exist_ok=True)
            os.replace(work, failed)
            raise builder.BuildError(str(exc).splitlines()[0], exc.log, failed / exc.source.name,
                                     exc.repro.replace(str(work), str(failed))) from None
        done = {**record, "size": library.stat().st_size, "sha256": _file_sha256(library), "base": base}
        (work / READY).write_text(json.dumps(done, sort_keys=True) + "\n")
        os.replace(work, final)
        _write_entry_pointer(root, base, key)
    finally:
        lock.release()
    return final / name


# --- packages --------------------------------------------------------------------------------

def package(sources: dict[str, str], directory, progress: bool = True) -> list[Path]:
    """Build every spec (name -> source text) into `directory`, a cache root that a process
    without nvcc can serve (load_package or ATTNCC_CACHE_DIR), with the sources beside it."""
    from .frontend import check_spec
    from .kernel import Kernel

    directory = Path(directory)
    try:
        (directory / PACKAGE_SPECS).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unusable(directory, "create", exc) from None
    built = []
    for name, text in sources.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel = Kernel(check_spec(text))
        built.append(build(kernel.plan, progress=progress, root=directory))
        (directory / PACKAGE_SPECS / f"{kernel.name}.attn").write_text(text)
    from . import launcher  # (imports this module)

    try:  # for this torch and Python: an image with no C++ compiler needs no build either
        built.append(launcher.build(root=directory, progress=progress))
    except builder.BuildError as exc:
        warnings.warn(f"attncc: the package has no compiled launcher ({str(exc).splitlines()[0]}); "
                      "its eager calls will take the Python path", stacklevel=2)
    return built


def load_package(directory) -> dict:
    """Serve the libraries of a package (attncc package -o DIR) to this process, before the
    cache; returns its specs compiled, by name. Needs no CUDA toolkit."""
    from . import compile as compile_spec

    directory = Path(directory).resolve()
    specs = directory / PACKAGE_SPECS
    if not specs.is_dir():
        raise CacheError(f"{directory} is not an attncc package (no {PACKAGE_SPECS}/ in it); "
                         "make one with `attncc package SPEC... -o DIR`")
    if directory not in _PACKAGES:
        _PACKAGES.insert(0, directory)
    kernels = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in sorted(specs.glob("*.attn")):
            kernel = compile_spec(path)
            kernels[kernel.name] = kernel
    return kernels
