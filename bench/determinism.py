"""Is one call repeatable? Identical calls of a spec's op on identical inputs, compared bit for bit (GPU).

    python3 bench/determinism.py SPEC [--batch 128 --sq 1 --seqlen 8192 --heads H --page P]
                                 [--splits N] [--calls 3]

The inputs are bench.py's (random cache larger than L2, pages in random order); each call
writes into a fresh output poisoned with NaN. Prints the split count and parts the call ran
with, the largest difference between any call and the first (0.0: bitwise equal), and the
first call against attncc.reference on three of its sequences. Exits 1 when calls differ or a
result is wrong. Run each shape in its own process: a launch failure ends the CUDA context
(session 35's race in the stacked split mode showed as both: differing calls and, at b = 128,
`unspecified launch failure`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attncc import bench, ops, testing  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers of its width (so that NaN == NaN and -0 != +0, as bit for bit means)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def difference(runs) -> tuple[bool, float]:
    """(every run's tensors are the first run's bit for bit, the largest absolute difference of a
    run from the first: inf where only one of them is NaN or inf, 0.0 where only zeros' signs differ)."""
    same, diff = True, 0.0
    for run in runs[1:]:
        for mine, first in zip(run, runs[0]):
            if not torch.equal(bits(mine), bits(first)):
                same = False
                diff = max(diff, (mine.float() - first.float()).abs().nan_to_num(float("inf")).max().item())
    return same, diff


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--heads", type=int, help="h_q (default the spec's)")
    ap.add_argument("--page", type=int, help="page size (default the spec's)")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--splits", type=int, help="a forced split count (default: the launch chooses)")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args(argv)
    if args.calls < 2:
        ap.error("--calls: at least 2 (one call has nothing to be compared with)")

    if not torch.cuda.is_available():
        raise SystemExit("bench/determinism.py: no CUDA device here (it compares calls of the GPU op)")
    spec = check_spec(Path(args.spec))
    spec = bench.variant(spec, args.heads or spec.heads_q, args.page or spec.page_size)
    kernel = Kernel(spec)
    cfg = bench.Config(args.batch, args.sq, spec.heads_q, args.seqlen, spec.page_size)
    case = bench.inputs(spec, cfg)
    out_shape = (cfg.batch, cfg.s_q, spec.heads_q, spec.d_v)
    lse_shape = (cfg.batch, spec.heads_q, cfg.s_q)
    # the (splits, parts) the launch runs with, by the op's own preparation
    views = [ops._cache_view(spec, kernel.plan, i, t) for i, t in enumerate(ops.cache_list(spec, case.cache))]
    flags = torch.zeros(1, dtype=torch.int32, device="cuda")
    launch = ops.prepare(kernel.plan, kernel.op.library(), case.q, views, case.block_table, args.splits or 0, flags)
    runs = []
    for _ in range(args.calls):
        out = torch.full(out_shape, float("nan"), dtype=case.q.dtype, device="cuda")
        lse = torch.full(lse_shape, float("nan"), dtype=torch.float32, device="cuda")
        kernel(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, out=out, lse=lse,
               num_splits=args.splits)
        runs.append((out, lse))
    torch.cuda.synchronize()
    kernel.check()
    same, diff = difference(runs)
    rows = sorted({0, cfg.batch // 2, cfg.batch - 1})[:bench.CHECKED_SEQUENCES]
    check = testing.compare(spec, bench._subset(case, rows), runs[0][0][rows], runs[0][1][rows])
    chosen = "forced" if args.splits else "chosen"
    print(f"{spec.name} {cfg.label()} splits/parts {launch.num_splits}/{launch.num_parts} ({chosen}): {args.calls} calls "
          f"{'bitwise equal' if same else f'DIFFER (largest difference {diff:.3g})'}; "
          f"vs reference: {'ok' if check.ok else 'WRONG'} ({check})")
    return 0 if same and check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
