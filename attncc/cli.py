"""The `attncc` command line (DESIGN.md §4)."""
from __future__ import annotations

import argparse
import sys

from .errors import SpecError
from .explain import GPUS


def _check(args) -> int:
    from pathlib import Path

    from .frontend import check_spec

    failed = 0
    for path in args.specs:
        try:
            spec = check_spec(Path(path))  # arguments are files, whatever their suffix
        except SpecError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: ok ({spec.name}: d_k {spec.d_k}, d_v {spec.d_v}, "
              f"{spec.record_bytes} bytes/token)")
    return 1 if failed else 0


def _explain(args) -> int:
    import attncc

    from pathlib import Path

    kernel = attncc.compile(Path(args.spec))
    print(kernel.explain(batch=args.batch, seqlen=args.seqlen, s_q=args.sq, gpu=args.gpu))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attncc", description="compile .attn decode-attention specs")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="parse and check specs; errors as file:line:col")
    check.add_argument("specs", nargs="+", metavar="SPEC")
    check.set_defaults(run=_check)
    explain = sub.add_parser("explain", help="layout, FLOPs/byte and the roofline floor")
    explain.add_argument("spec", metavar="SPEC")
    explain.add_argument("--batch", type=int, default=1)
    explain.add_argument("--seqlen", type=int, default=4096)
    explain.add_argument("--sq", type=int, default=1, help="query tokens per sequence")
    explain.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    explain.set_defaults(run=_explain)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"attncc: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
