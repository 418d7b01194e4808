"""Count compute-sanitizer racecheck reports by their pair of source sites (GPU logs, any machine).

    python3 bench/hazard_sites.py LOG...        # e.g. the sanitize_racecheck_*.log of bench/sanitize.py

Each report names a hazard kind and the write and read (or write) accesses with their functions
and file:line; one line per distinct (kind, first access, second access), most frequent first:
which code the reports are about, when there are thousands."""
import collections
import re
import sys

HAZARD = re.compile(r"Potential (\w+) hazard detected")
ACCESS = re.compile(r"(Write|Read) Thread \S+ at (.+?)\+0x[0-9a-f]+ in (\S+)")


def sites(lines):
    counts = collections.Counter()
    kind, accesses = None, []
    for line in lines:
        if m := HAZARD.search(line):
            kind, accesses = m[1], []
        elif kind and (m := ACCESS.search(line)):
            accesses.append(f"{m[1].lower()} {m[2]} ({m[3]})")
            if len(accesses) == 2:
                counts[(kind, *accesses)] += 1
                kind = None
    return counts


def main(paths) -> int:
    counts = collections.Counter()
    for path in paths:
        with open(path, errors="replace") as f:
            counts += sites(f)
    for (kind, first, second), n in counts.most_common():
        print(f"{n:8d}  {kind}: {first} / {second}")
    print(f"{sum(counts.values())} reports, {len(counts)} distinct site pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
