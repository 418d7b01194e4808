"""Build, on this machine (nvcc, no GPU), the kernel libraries a device call will load, into
the JIT cache (ATTNCC_CACHE_DIR, e.g. $PWD/.attncc_cache, carried to the device):

    ATTNCC_CACHE_DIR=$PWD/.attncc_cache python3 bench/prebuild.py [--jobs 2] [--no-tests]
        [--no-peers] [--bench]

every spec of the GPU suite (tests/specs.py) on every family that takes it, the examples, the
side-by-side configurations of .peers/sidebyside.py (when .peers/ is there) and, with --bench,
the plans `attncc bench` and `bench/ab.py` make of the examples (other head counts, pages).
The libraries are C-ABI shared objects: the device loads them as they are (its nvcc agreeing
on the key), so a device call spends no time building."""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from attncc import bench, cache, testing  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402


def plans(tests: bool, peers: bool, benches: bool) -> dict:
    found = {}
    texts = {p.stem: p.read_text() for p in sorted((REPO / "examples").glob("*.attn"))}
    if tests:
        from specs import all_specs

        texts.update(all_specs())
    if peers and (REPO / ".peers" / "sidebyside.py").exists():
        sys.path.insert(0, str(REPO / ".peers"))
        import sidebyside

        extra = [line.split(None, 1)[1] for line in (REPO / "bench" / "flashmla_table.args").read_text().splitlines()
                 if line.startswith("--extra ")]  # device.sh table's rows
        configs = sidebyside.default_configs() + [sidebyside.parse_extra(e.strip()) for e in extra]
        texts.update({c.name: sidebyside.spec_text(c) for c in configs})
    for name, text in texts.items():
        for family in testing.families_of(text):
            plan = testing.on_family(text, family).plan
            found[cache.base_key(plan, plan.target)] = plan
    if benches:
        for path in sorted((REPO / "examples").glob("*.attn")):
            spec = check_spec(path)
            for cfg in bench.default_grid(spec):
                plan = Kernel(bench.variant(spec, cfg.heads_q, cfg.page_size)).plan
                if plan is not None:
                    found[cache.base_key(plan, plan.target)] = plan
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-tests", action="store_true", help="not the GPU suite's specs")
    ap.add_argument("--no-peers", action="store_true", help="not the side-by-side configurations")
    ap.add_argument("--bench", action="store_true", help="also the plans of `attncc bench`'s grid")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # knobs a family does not yet apply
        todo = plans(not args.no_tests, not args.no_peers, args.bench)
    start = time.perf_counter()
    print(f"{len(todo)} plans into {cache.cache_root()}", flush=True)

    def one(plan):
        path = cache.build(plan, progress=False)
        print(f"  {plan.name} ({plan.family}): {path.parent.name}", flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, todo.values()))
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
