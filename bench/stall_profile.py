"""Warp-stall samples and executed instructions of one decode call, split by role (the Hopper
family's producer and consumers): where each warp group's time goes.

    python3 bench/stall_profile.py run SPEC LIB.so OUT.csv.gz [--batch 128 --sq 2 --heads 128
                                   --seqlen 8192 --page 64]                       # GPU, ncu
    python3 bench/stall_profile.py command OUT.csv.gz --kernel REGEX [--skip 1] -- CMD ARGS...  # GPU, ncu
    python3 bench/stall_profile.py summary OUT.csv.gz [--top 12]                  # CPU

run: Nsight Compute (`--set full`, source counters) on the second launch of the decode kernel
(a warm-up first) of bench/ab.py driving LIB.so (a build of SPEC: `attncc compile SPEC -o DIR
--no-build`, then nvcc with -lineinfo) on bench's inputs, exported as ncu's source page (SASS, one
row an instruction) to OUT.csv.gz, then summarized. (ab.py's own line is printed too: its
times are under the profiler, not measurements. Session 23's producer profile: bench/RESULTS.md.)
summary: per role, the share of the samples, the sampled stall reasons, and the opcodes by
executed warp instructions with their samples. The roles are the code between setmaxnreg
instructions, named by the one before (`USETMAXREG.TRY_ALLOC`: the consumers; `.DEALLOC`: the
producer; none: the prologue, one CTA's setup): the order ptxas lays the roles out in, so a
role's code after a shared tail would be counted with the role before it. Only the first kernel
of the export is read. command: the same for the first kernel matching REGEX past `--skip` launches of
any command (a peer's kernel driven by .peers/sidebyside.py, to set beside ours); run and command
also write ncu's details page (speed of light, pipes, warp states) beside OUT as OUT.details.txt."""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Role:
    name: str
    samples: float = 0.0
    stalls: collections.Counter = field(default_factory=collections.Counter)
    executed: collections.Counter = field(default_factory=collections.Counter)   # opcode -> warp instructions
    sampled: collections.Counter = field(default_factory=collections.Counter)    # opcode -> samples


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _opcode(sass: str) -> str:
    """The opcode with its modifiers (`F2FP.BF16.F32.PACK_AB`), past a predicate (`@!P0`)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else "?"


def _role_of(opcode: str, current: str) -> str:
    if opcode.startswith("USETMAXREG"):
        return "producer" if "DEALLOC" in opcode else "consumers"
    return current


def read_rows(text: str) -> list[dict[str, str]]:
    """The instruction rows of the first kernel in ncu's source-page CSV (a `"Kernel Name",...`
    line, then the header, then one row an instruction)."""
    lines = list(csv.reader(io.StringIO(text)))
    starts = [i for i, row in enumerate(lines) if row and row[0] == "Kernel Name"]
    if not starts or starts[0] + 1 >= len(lines):
        raise ValueError("not ncu's source page: no 'Kernel Name' line followed by a header")
    header = lines[starts[0] + 1]
    for needed in ("Source", SAMPLES, EXECUTED):
        if needed not in header:
            raise ValueError(f"ncu's source page lacks the column {needed!r} (export with --set full, "
                             "source counters, --print-source sass)")
    end = starts[1] if len(starts) > 1 else len(lines)
    return [dict(zip(header, row)) for row in lines[starts[0] + 2:end] if len(row) >= len(header)]


def summarize(rows: list[dict[str, str]]) -> dict[str, Role]:
    roles: dict[str, Role] = {}
    current = "prologue"
    stall_columns = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c] if rows else []
    for row in rows:
        opcode = _opcode(row["Source"])
        current = _role_of(opcode, current)
        role = roles.setdefault(current, Role(current))
        samples = _number(row[SAMPLES])
        role.samples += samples
        role.executed[opcode] += _number(row[EXECUTED])
        role.sampled[opcode] += samples
        for column in stall_columns:
            role.stalls[column[len("stall_"):]] += _number(row[column])
    return roles


def report(roles: dict[str, Role], top: int) -> str:
    total = sum(r.samples for r in roles.values()) or 1.0
    out = []
    for role in roles.values():
        out.append(f"{role.name}: {role.samples:.0f} samples ({role.samples / total:.1%} of all), "
                   f"{sum(role.executed.values()) / 1e6:.2f}M warp instructions executed")
        share = role.samples or 1.0
        reasons = ", ".join(f"{k} {v / share:.1%}" for k, v in role.stalls.most_common(top) if v)
        out.append(f"  stalls: {reasons}")
        out.append("  opcodes (executed warp instructions, samples):")
        for opcode, count in role.executed.most_common(top):
            out.append(f"    {opcode:34s} {count / 1e6:8.2f}M {role.sampled[opcode]:8.0f}")
    return "\n".join(out)


def _open(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


def profile(command: list[str], kernel: str, skip: int, out: Path, top: int) -> int:
    """ncu `--set full` with source counters on one launch of `kernel` in `command`; the source page
    to `out` (gzipped CSV), the details page beside it, the summary printed."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("ncu (Nsight Compute) not found: profiling is for the GPU machine")
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "profile"
        subprocess.run([ncu, "--set", "full", "--import-source", "yes", "-k", f"regex:{kernel}", "--launch-skip",
                        str(skip), "-c", "1", "-f", "-o", str(report_path), *command], check=True)
        rep = f"{report_path}.ncu-rep"
        page = subprocess.run([ncu, "-i", rep, "--page", "source", "--csv", "--print-source", "sass"], check=True,
                              capture_output=True, text=True).stdout
        details = subprocess.run([ncu, "-i", rep, "--page", "details"], check=True, capture_output=True,
                                 text=True).stdout
    out.write_bytes(gzip.compress(page.encode()))
    out.with_name(out.name.split(".")[0] + ".details.txt").write_text(details)
    print(report(summarize(read_rows(page)), top))
    return 0


def run(args) -> int:
    ab = Path(__file__).resolve().parent / "ab.py"
    shape = ["--batch", str(args.batch), "--sq", str(args.sq), "--seqlen", str(args.seqlen)]
    shape += [f"--{k}={v}" for k, v in (("heads", args.heads), ("page", args.page)) if v is not None]
    return profile([sys.executable, str(ab), args.spec, args.lib, args.lib, "--rounds", "1", *shape], "decode", 1,
                   Path(args.out), args.top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="profile one call on the GPU (ncu), export, summarize")
    r.add_argument("spec")
    r.add_argument("lib")
    r.add_argument("out")
    r.add_argument("--batch", type=int, default=128)
    r.add_argument("--sq", type=int, default=2)
    r.add_argument("--heads", type=int)
    r.add_argument("--seqlen", type=int, default=8192)
    r.add_argument("--page", type=int)
    r.add_argument("--top", type=int, default=12)
    c = sub.add_parser("command", help="profile one launch of a kernel in any command (ncu), export, summarize")
    c.add_argument("out")
    c.add_argument("--kernel", required=True, help="regex of the kernel's name")
    c.add_argument("--skip", type=int, default=1, help="launches of it to skip first (warm-up)")
    c.add_argument("--top", type=int, default=12)
    s = sub.add_parser("summary", help="summarize an export (CSV, gzipped or not)")
    s.add_argument("csv")
    s.add_argument("--top", type=int, default=12)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)  # `command`'s command, after --
    args, cmd = ap.parse_args(argv[:split]), argv[split + 1:]
    if args.command == "run":
        return run(args)
    if args.command == "command":
        if not cmd:
            ap.error("command: give the command to profile after --")
        return profile(cmd, args.kernel, args.skip, Path(args.out), args.top)
    try:
        rows = read_rows(_open(Path(args.csv)))
    except (OSError, ValueError) as e:
        raise SystemExit(f"{args.csv}: {e}")
    print(report(summarize(rows), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
