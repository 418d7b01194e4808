"""The `attncc` command line (DESIGN.md §4)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from .errors import SpecError
from .target import GPUS, TARGETS


def _check(args) -> int:
    from pathlib import Path

    from .frontend import check_spec
    from .lower import UnsupportedSpec, lower

    failed = 0
    for path in args.specs:
        try:
            spec = check_spec(Path(path))  # arguments are files, whatever their suffix
            plan = lower(spec)  # the schedule against the kernel families, as compile does
        except UnsupportedSpec as exc:
            plan, note = None, exc.message
        except SpecError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        runs = (f"family {plan.family}" if plan is not None else
                f"CPU reference only: {note}")
        print(f"{path}: ok ({spec.name}: d_k {spec.d_k}, d_v {spec.d_v}, "
              f"{spec.record_bytes} bytes/token; {runs})")
    return 1 if failed else 0


def _explain(args) -> int:
    import attncc

    from pathlib import Path

    kernel = attncc.compile(Path(args.spec))
    print(kernel.explain(batch=args.batch, seqlen=args.seqlen, s_q=args.sq, gpu=args.gpu))
    return 0


def _compile(args) -> int:
    import tempfile
    from pathlib import Path

    import attncc

    from . import families
    from .build import compile_source, nvcc, unfit
    from .render import write_sources

    plan = attncc.compile(Path(args.spec)).plan
    directory = Path(args.output) if args.output else Path("generated") / plan.name
    try:
        written = write_sources(plan, directory)
    except OSError as exc:
        print(f"attncc: error: cannot write the generated sources to {directory}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    if args.no_build:
        return 0
    try:
        nvcc()
    except Exception:
        print("nvcc not found: rendered only")
        return 0
    arch = args.arch or plan.target
    if arch not in families.by_name(plan.family).targets:
        print(f"attncc: error: this plan is the {plan.family} family (lowered for {plan.target}), which "
              f"does not build for {arch}: write `target {arch}` in the schedule to lower for it",
              file=sys.stderr)
        return 1
    limit = TARGETS[arch].smem_per_block
    if plan.config.smem_bytes > limit:
        print(f"attncc: warning: this plan (lowered for {plan.target}) needs {plan.config.smem_bytes} B "
              f"of shared memory, more than {arch} gives a block ({limit}): it will "
              f"compile but not launch there; write `target {arch}` in the schedule to lower for it",
              file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        _, kernels, log = compile_source(plan, Path(tmp), arch, strict=False)  # the table, then the verdict
    print(f"{'kernel':<48} {'regs':>5} {'smem':>8} {'stack':>6} {'spills':>7}")
    for k in kernels:
        short = k.function.replace("(anonymous namespace)::", "").split("(")[0]
        dynamic = "decode_kernel" in short or "decode_parts_kernel" in short  # the plan's smem
        smem = k.smem_bytes + (plan.config.smem_bytes if dynamic else 0)
        spills = k.spill_stores + k.spill_loads
        print(f"{short:<48} {k.registers:>5} {smem:>8} {k.stack_bytes:>6} {spills:>7}")
    problems = unfit(kernels, log)
    for problem in problems:
        print(f"attncc: error: {problem}", file=sys.stderr)
    if problems:
        print("attncc: error: the JIT refuses this build (spills, a stack frame or serialized wgmma: a "
              "lowering bug; please report it with the spec)", file=sys.stderr)
        return 1
    return 0


def _package(args) -> int:
    from pathlib import Path

    from .cache import package
    from .frontend import read_file

    sources = {}
    for path in args.specs:
        source = read_file(Path(path))
        sources[path] = source.text
    for spec, library in zip(args.specs, package(sources, Path(args.output))):
        print(f"{spec}: {library}")
    print(f"package {args.output}: serve it with ATTNCC_CACHE_DIR={args.output} or "
          f"attncc.load_package({args.output!r}) (no CUDA toolkit needed)")
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _test(args) -> int:
    import random
    import warnings
    from pathlib import Path

    import torch

    import attncc

    from . import testing

    if not torch.cuda.is_available():
        print("attncc test needs a CUDA GPU", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = attncc.compile(Path(args.spec))
    spec, rng, failed = kernel.spec, random.Random(args.seed), 0
    for trial in range(args.trials):
        batch = rng.choice([1, 3, 8, 33])
        s_q = rng.randint(1, spec.max_query_len)
        P = spec.page_size
        lengths = [rng.choice([0, 1, P, P + 1, rng.randrange(2, 3000)]) for _ in range(batch)]
        case = testing.random_case(spec, lengths, s_q, seed=rng.randrange(1 << 30))
        out, lse = kernel(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices)
        result = testing.compare(spec, case, out, lse)
        failed += not result.ok
        print(f"{'ok  ' if result.ok else 'FAIL'} batch={batch} s_q={s_q}: {result}")
    print(f"{args.trials - failed} passed, {failed} failed")
    return 1 if failed else 0


def _bench(args) -> int:
    import json
    from pathlib import Path

    import torch

    from . import bench
    from .frontend import check_spec

    spec = check_spec(Path(args.spec))
    if args.ragged and spec.sparse:
        print(f"attncc bench: --ragged varies sequence lengths; `{spec.name}` is sparse "
              "(each query reads its top-k)", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("attncc bench --plot needs matplotlib: pip install 'attncc[plot]'", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("attncc bench needs a CUDA GPU", file=sys.stderr)
        return 2
    grid = bench.default_grid(spec)
    if any((args.batch, args.heads, args.sq, args.seqlen, args.page)):
        grid = [bench.Config(b, s, h, L, p) for b in _ints(args.batch or "128")
                for s in _ints(args.sq or "1") for h in _ints(args.heads or str(spec.heads_q))
                for L in _ints(args.seqlen or "8192") for p in _ints(args.page or str(spec.page_size))]
    if args.ragged:
        grid = [dataclasses.replace(cfg, ragged=True) for cfg in grid]
    results, ceilings = bench.bench(spec, grid, iters=args.iters, check=not args.no_check)
    print(bench.format_table(results, ceilings))
    if args.json:
        Path(args.json).write_text(json.dumps({"ceilings": ceilings, "results": results}, indent=1))
    if args.plot:
        bench.plot(results, args.plot)
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
    compile_ = sub.add_parser("compile", help="render CUDA into DIR and, with nvcc, report "
                              "registers/shared memory/spills")
    compile_.add_argument("spec", metavar="SPEC")
    compile_.add_argument("-o", "--output", metavar="DIR", help="default generated/<name>/")
    compile_.add_argument("--arch", choices=sorted(TARGETS), help="default: the schedule's target")
    compile_.add_argument("--no-build", action="store_true", help="render only")
    compile_.set_defaults(run=_compile)
    package = sub.add_parser("package", help="build specs into DIR, a kernel cache that a process "
                             "without the CUDA toolkit can load (ATTNCC_CACHE_DIR or attncc.load_package)")
    package.add_argument("specs", nargs="+", metavar="SPEC")
    package.add_argument("-o", "--output", metavar="DIR", required=True)
    package.set_defaults(run=_package)
    test = sub.add_parser("test", help="generated op vs reference on random inputs (needs a GPU)")
    test.add_argument("spec", metavar="SPEC")
    test.add_argument("--trials", type=int, default=8)
    test.add_argument("--seed", type=int, default=0)
    test.set_defaults(run=_test)
    bench = sub.add_parser("bench", help="time, GB/s, TFLOP/s and %% of roofline per config")
    bench.add_argument("spec", metavar="SPEC")
    for axis in ("batch", "heads", "sq", "seqlen", "page"):
        bench.add_argument(f"--{axis}", help="comma-separated values (default: FlashMLA's grid)")
    bench.add_argument("--ragged", action="store_true",
                       help="lengths spread over [1, 2 s_k - 1] with mean s_k (dense specs)")
    bench.add_argument("--iters", type=int, default=20)
    bench.add_argument("--no-check", action="store_true", help="skip the reference check")
    bench.add_argument("--json", metavar="FILE", help="write results as JSON")
    bench.add_argument("--plot", metavar="PNG", help="bar chart of %% of the roofline floor")
    bench.set_defaults(run=_bench)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    return f"attncc: warning: {message}\n"  # a user's view: no Python file and line


def main(argv=None) -> int:
    import warnings

    warnings.formatwarning = _format_warning
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"attncc: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # BuildError (nvcc log, source, repro), CUDA errors
        print(f"attncc: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
