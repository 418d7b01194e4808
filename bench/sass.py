"""SASS of every spec's kernels from one checkout, and a kernel-by-kernel comparison (CPU).

    python3 bench/sass.py dump REPO OUTDIR         # examples + tests/specs.py, sm_90a and sm_80
    python3 bench/sass.py compare OUTDIR_A OUTDIR_B

dump compiles with REPO's own lowering and templates and writes OUTDIR/<spec>-<arch>.sass
(cuobjdump -sass: the CUDA toolkit's, or the one Triton's wheel carries in
triton/backends/nvidia/bin; set CUOBJDUMP). compare prints, per kernel (decode, parts,
combine), whether the instructions are identical and, if not, whether the main loop (the
longest backward branch) is."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def dump(repo: Path, out: Path) -> None:
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(repo / "tests"))
    warnings.simplefilter("ignore")
    import attncc
    from attncc.build import compile_source
    from specs import all_specs

    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if tool is None:
        raise SystemExit("no cuobjdump: set CUOBJDUMP (Triton's wheel carries one)")
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, arch, attncc.compile(text).plan) for name, text in all_specs().items()
            for arch in ("sm90a", "sm80")]

    def one(job):
        name, arch, plan = job
        library, _, _ = compile_source(plan, out / f"build-{name}-{arch}", arch, progress=False)
        sass = subprocess.run([tool, "-sass", str(library)], capture_output=True, text=True, check=True).stdout
        (out / f"{name}-{arch}.sass").write_text(sass)
        shutil.rmtree(out / f"build-{name}-{arch}")
        return name, arch

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for name, arch in pool.map(one, jobs):
            print(f"{name}-{arch}")


def kernels(path: Path) -> dict[str, list[str]]:
    found, current = {}, None
    for line in path.read_text().splitlines():
        if m := re.search(r"Function : (\S+)", line):
            n = m.group(1)
            current = found.setdefault("combine" if "combine" in n else "parts" if "parts" in n else "decode", [])
        elif current is not None and re.match(r"\s+/\*[0-9a-f]{4,}\*/", line):
            current.append(re.sub(r"\s+", " ", line.split(";")[0].split("*/", 1)[1].strip()))
    return found


def main_loop(ins: list[str]) -> list[str]:
    best = (0, -1)
    for i, x in enumerate(ins):
        if "BRA" in x and (m := re.search(r"0x([0-9a-f]+)", x)):
            target = int(m.group(1), 16) // 16
            if target < i and i - target > best[1] - best[0]:
                best = (target, i)
    return ins[best[0]: best[1] + 1]


def compare(a: Path, b: Path) -> int:
    same = loops = differ = 0
    for fa in sorted(a.glob("*.sass")):
        ka, kb = kernels(fa), kernels(b / fa.name)
        for kind in sorted(ka):
            if ka[kind] == kb.get(kind):
                same += 1
            elif main_loop(ka[kind]) == main_loop(kb.get(kind, [])):
                loops += 1
                print(f"{fa.stem} {kind}: differs outside its main loop")
            else:
                differ += 1
                print(f"{fa.stem} {kind}: DIFFERS ({len(ka[kind])} vs {len(kb.get(kind, []))} instructions)")
    print(f"{same} kernels identical, {loops} with identical main loops, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "dump":
        dump(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve())
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
