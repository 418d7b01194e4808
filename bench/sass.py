"""SASS of every spec's kernels from one checkout, and a kernel-by-kernel comparison (CPU).

    python3 bench/sass.py dump REPO OUTDIR         # examples + tests/specs.py, on every family that takes each
    python3 bench/sass.py compare OUTDIR_A OUTDIR_B
    python3 bench/sass.py loops LIB_OR_SASS [MIN]  # each kernel's loops and their instruction mix

dump compiles with REPO's own lowering and templates and writes OUTDIR/<spec>@<family>-<arch>.sass
(cuobjdump -sass: the CUDA toolkit's, or the one Triton's wheel carries in
triton/backends/nvidia/bin; set CUOBJDUMP). compare prints, per kernel (decode, parts,
combine), whether the instructions are identical and, if not, whether each function's main
loop (its longest loop, as `loops` finds them) is. loops lists, per kernel function of a built
library (or of a .sass listing), every loop of at least MIN instructions (default 100): a
backward branch whose body holds no EXIT (ptxas puts an mbarrier wait's retry after the
function's exits and branches back from there: not a loop of the kernel), with its instruction
count, its most frequent opcodes and its costly ones (COSTLY: memory barriers, L1
invalidations, proxy fences). A role's main loop (a consumer warp group's step, the producer's
tile) then reads as the instructions it issues a step: static counts, the branches not taken
included."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def cuobjdump() -> str:
    """The cuobjdump that reads the libraries: CUOBJDUMP, else the toolkit's on PATH."""
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if tool is None:
        raise SystemExit("no cuobjdump: set CUOBJDUMP (Triton's wheel carries one)")
    return tool


def sass_of(library: Path, tool: str) -> str:
    """A built library's `cuobjdump -sass` listing."""
    return subprocess.run([tool, "-sass", str(library)], capture_output=True, text=True, check=True).stdout


def dump(repo: Path, out: Path) -> None:
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(repo / "tests"))
    warnings.simplefilter("ignore")
    import attncc
    from attncc.build import compile_source
    from specs import all_specs

    tool = cuobjdump()  # before any build
    out.mkdir(parents=True, exist_ok=True)
    from attncc import testing

    # every family that takes a spec, on the spec's target (the hopper family's sm_90a code
    # does not assemble for sm_80; the mma_sync family's plans are the ones sm_80 would run)
    jobs = [(f"{name}@{family}", testing.on_family(text, family).plan) for name, text in all_specs().items()
            for family in testing.families_of(text)]

    def one(job):
        name, plan = job
        library, _, _ = compile_source(plan, out / f"build-{name}", progress=False)
        (out / f"{name}-{plan.target}.sass").write_text(sass_of(library, tool))
        shutil.rmtree(out / f"build-{name}")
        return f"{name}-{plan.target}"

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for done in pool.map(one, jobs):
            print(done, flush=True)


def kernels(path: Path) -> dict[str, list[list[tuple[int, str]]]]:
    """A listing's functions by kind of kernel (decode, parts, combine), whitespace collapsed."""
    found = {}
    for name, ins in functions(path.read_text()).items():
        kind = "combine" if "combine" in name else "parts" if "parts" in name else "decode"
        found.setdefault(kind, []).append([(a, re.sub(r"\s+", " ", text)) for a, text in ins])
    return found


def main_loop(ins: list[tuple[int, str]]) -> list[str]:
    """The longest loop of a function (loops() at any size), or [] for none."""
    return max((body for _, _, body in loops(ins, 1)), key=len, default=[])


def functions(listing: str) -> dict[str, list[tuple[int, str]]]:
    """Each function of a cuobjdump -sass listing: its (address, instruction) pairs."""
    found, current = {}, None
    for line in listing.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            current = found.setdefault(m.group(1), [])
        elif current is not None and (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)):
            current.append((int(m.group(1), 16), m.group(2)))
    return found


def opcode(instruction: str) -> str:
    """The opcode without its modifiers or predicate: `@!P0 BRA 0x10` -> BRA."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def loops(ins: list[tuple[int, str]], min_size: int = 100) -> list[tuple[int, int, list[str]]]:
    """(first address, last address, instructions) of each loop of a function: a backward branch
    to an address of the function whose body holds no EXIT, at least min_size instructions."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA (?:\S+, )?0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) > a or int(m.group(1), 16) not in at:
            continue
        body = [t for _, t in ins[at[int(m.group(1), 16)]: i + 1]]
        if len(body) >= min_size and not any(opcode(t) == "EXIT" for t in body):
            found.append((int(m.group(1), 16), a, body))
    return found


# Instructions that cost far more than their count: memory barriers (a GPU-scope one waits for the
# thread's writes to reach L2; the cluster-scope mbarrier forms compile to it), L1 invalidations
# (an acquire at cluster or GPU scope), proxy fences. `loops` names them per loop.
COSTLY = ("MEMBAR.ALL.GPU", "MEMBAR.ALL.SYS", "CCTL.IVALL", "MEMBAR.ALL.CTA", "FENCE.VIEW.ASYNC")


def costly(body: list[str]) -> dict[str, int]:
    """How many of each COSTLY instruction a loop body holds (those present only)."""
    counts = {name: sum(1 for t in body if name in t) for name in COSTLY}
    return {name: n for name, n in counts.items() if n}


def print_loops(path: Path, min_size: int) -> None:
    listing = path.read_text() if path.suffix == ".sass" else sass_of(path, cuobjdump())
    for name, ins in functions(listing).items():
        print(f"{name} ({len(ins)} instructions)")
        for first, last, body in loops(ins, min_size):
            mix = Counter(opcode(t) for t in body).most_common(12)
            dear = costly(body)
            print(f"  {first:#x}..{last:#x}: {len(body)}  " + " ".join(f"{k} {v}" for k, v in mix)
                  + ("  | costly: " + " ".join(f"{k} {v}" for k, v in dear.items()) if dear else ""))


def compare(a: Path, b: Path) -> int:
    same = loops_same = differ = 0
    for fa in sorted(a.glob("*.sass")):
        ka, kb = kernels(fa), kernels(b / fa.name)
        for kind in sorted(ka):
            fns_a, fns_b = ka[kind], kb.get(kind, [])
            if fns_a == fns_b:
                same += 1
            elif len(fns_a) == len(fns_b) and all(main_loop(x) == main_loop(y) for x, y in zip(fns_a, fns_b)):
                loops_same += 1
                print(f"{fa.stem} {kind}: differs outside its main loops")
            else:
                differ += 1
                print(f"{fa.stem} {kind}: DIFFERS ({sum(map(len, fns_a))} vs {sum(map(len, fns_b))} instructions)")
    print(f"{same} kernels identical, {loops_same} with identical main loops, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "dump":
        dump(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve())
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "loops":
        print_loops(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) == 4 else 100)
    else:
        sys.exit(__doc__)
