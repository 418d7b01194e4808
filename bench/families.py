"""One spec on every kernel family that takes it, in one process (GPU): the A/B behind the
lowering's preference order.

    python3 bench/families.py SPEC [--batch 128 --sq 2 --heads 128 --seqlen 8192 --page 64]
                              [--rounds 3] [--families hopper,mma_sync]

Each family's kernel gets the same inputs (attncc.bench.inputs, seed 0) and is checked against
the reference; attncc.bench.run_config times it (CUDA-graph replay, L2 flushed, median of 20).
The families alternate for --rounds rounds; the table gives each family's median over rounds,
its host time of an eager call and its time over the first family's."""
from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attncc import bench, testing  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--page", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", help="comma-separated; default: every family that takes the spec")
    args = ap.parse_args()
    fams = args.families.split(",") if args.families else testing.families_of(args.spec)
    spec = check_spec(args.spec)
    cfg = bench.Config(batch=args.batch, s_q=args.sq, heads_q=args.heads or spec.heads_q,
                       seqlen=args.seqlen, page_size=args.page or spec.page_size)
    spec = bench.variant(spec, cfg.heads_q, cfg.page_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # knobs a family does not apply
        kernels = {f: Kernel(spec, f) for f in fams}
    ceilings = bench.measure_ceilings()
    times: dict[str, list[float]] = {f: [] for f in fams}
    host: dict[str, list[float]] = {f: [] for f in fams}
    for r in range(args.rounds):
        for f in (fams if r % 2 == 0 else fams[::-1]):
            res = bench.run_config(kernels[f], cfg, ceilings, check=(r == 0))
            times[f].append(res["us"])
            host[f].append(res["host_us"])
    base = statistics.median(times[fams[0]])
    print(f"# {spec.name} {cfg.label()}, {args.rounds} rounds (GPU us: graph replay, L2 flushed; host us: eager call)")
    for f in fams:
        t = statistics.median(times[f])
        print(f"{f:<10} {t:9.1f} us  host {statistics.median(host[f]):7.1f} us  x{t / base:.3f} of {fams[0]}"
              f"  (rounds: {', '.join(f'{x:.1f}' for x in times[f])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
