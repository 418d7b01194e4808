"""Same-process A/B of two builds of one plan's kernel library (GPU).

    python3 bench/ab.py SPEC A.so B.so [--batch 128 --sq 2 --heads 128 --seqlen 8192 --page 64]
                        [--rounds 15] [--spec-b SPEC_B] [--splits-a N --splits-b N] [--schedule-b]
                        [--ordered-pages]

Both libraries get the same inputs (attncc.bench.inputs: random cache larger than L2, pages
in random order) through the same AttnccArgs; each round times one call of A and one of B
(CUDA events, L2 flushed before each, a spin kernel covering the enqueue), alternating which
goes first. With --spec-b, B is driven by that spec's plan (its split policy and workspace: a
build of another schedule of the same cache layout, e.g. `seesaw` on or off). With --splits-a /
--splits-b each side's num_splits as the op takes it (0 the launch's choice, n splits, -p
balanced parts): one library (A.so = B.so) at two split choices, e.g. b = 1's 66 parts against
44. With --schedule-b, B's call reads the step's schedule (k.plan(seqlens) on the device) and A's
cuts its parts in every CTA: one library (A.so = B.so), the same parts. Prints the median of each, the ratio, whether the outputs are bitwise equal (not expected
across split choices: the sums are cut elsewhere), and each side's outputs checked against
attncc.reference on three sequences of the call.
--heads and --page vary SPEC as bench/ab_build.py does; each library must be a build of that
variant (its TAG_name.json from ab_build, or, without one, SPEC as written), and is driven by the
plan of the kernel family it was built on (ab_build --family: an A/B of two families).
Each library is driven through the AttnccArgs of its own ABI version (1, from before strides
and device flags, 3, from before the step's schedule, or today's), so builds from before a version change can be compared."""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attncc import abi, bench, ops, split, testing  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402
from attncc.ops import cache_list  # noqa: E402


class AttnccArgsV1(ctypes.Structure):
    """AttnccArgs of ABI version 1 (before strides, page counts and flags), field for field:
    so that builds from before version 2 can be timed beside today's."""

    _fields_ = [
        ("q", ctypes.c_void_p), ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("tensors", ctypes.c_void_p * abi.MAX_TENSORS),
        ("block_table", ctypes.c_void_p), ("block_table_stride", ctypes.c_int),
        ("seqlens", ctypes.c_void_p), ("indices", ctypes.c_void_p),
        ("partial_out", ctypes.c_void_p), ("partial_lse", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("s_q", ctypes.c_int), ("num_splits", ctypes.c_int),
        ("num_parts", ctypes.c_int), ("softmax_scale", ctypes.c_float), ("stream", ctypes.c_void_p),
    ]


class AttnccArgsV3(ctypes.Structure):
    """AttnccArgs of ABI version 3 (before the step's schedule): today's fields but `schedule`."""

    _fields_ = [f for f in abi.AttnccArgs._fields_ if f[0] != "schedule"]


def load(path: str):
    """A library of any ABI version this script knows (1: no attncc_abi_version export, or 1;
    3: before the schedule; today's), with the struct its attncc_launch takes."""
    dll = ctypes.CDLL(path)
    version = dll.attncc_abi_version() if hasattr(dll, "attncc_abi_version") else 1
    struct = {1: AttnccArgsV1, 3: AttnccArgsV3, abi.ABI_VERSION: abi.AttnccArgs}.get(version)
    if struct is None:
        raise SystemExit(f"{path}: ABI version {version}, which this script cannot drive")
    lib = abi.Library.__new__(abi.Library)
    lib.path, lib.dll, lib._ctas_per_sm = Path(path), dll, None
    lib.dll.attncc_launch.argtypes = [ctypes.POINTER(struct)]
    lib.dll.attncc_launch.restype = ctypes.c_int
    if hasattr(dll, "attncc_plan_schedule"):
        lib.dll.attncc_plan_schedule.argtypes = [ctypes.POINTER(struct), ctypes.c_void_p]
        lib.dll.attncc_plan_schedule.restype = ctypes.c_int
    lib.struct = struct
    return lib


def make_args(plan, lib, case, spec, stream=None, requested: int = 0):
    """One call's AttnccArgs for `lib` and the tensors they point at (out, lse, the workspace, the
    flag word), and (splits, parts): today's ABI through ops.prepare and ops.pack, the op's own
    preparation; version 1 from the same preparation, without strides, page count and flags."""
    q = case.q
    views = [ops._cache_view(spec, plan, i, t) for i, t in enumerate(cache_list(spec, case.cache))]
    flags = torch.zeros(1, dtype=torch.int32, device=q.device)
    p = ops.prepare(plan, lib, q, views, case.block_table, requested, flags)
    out = torch.empty(p.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(p.lse_shape, dtype=torch.float32, device=q.device)
    po = pl = None
    if p.workspace is not None:
        po, pl = (torch.empty(shape, dtype=torch.float32, device=q.device) for shape in p.workspace)
    stream = torch.cuda.current_stream().cuda_stream if stream is None else stream
    if lib.struct in (abi.AttnccArgs, AttnccArgsV3):
        a = ops.pack(p, q, out, lse, views, case.block_table, case.seqlens, case.indices, po, pl,
                     spec.softmax_scale, stream)
        if lib.struct is AttnccArgsV3:  # the same fields, but the schedule
            old = AttnccArgsV3()
            for name, _ in AttnccArgsV3._fields_:
                setattr(old, name, getattr(a, name))
            a = old
        return a, (out, lse, po, pl, flags), (p.num_splits, p.num_parts)
    a = lib.struct()
    a.q, a.out, a.lse = q.data_ptr(), out.data_ptr(), lse.data_ptr()
    for i, t in enumerate(views):
        a.tensors[i] = t.data_ptr()
    if case.block_table is not None:
        a.block_table, a.block_table_stride = case.block_table.data_ptr(), case.block_table.stride(0)
        a.seqlens = case.seqlens.data_ptr()
    if case.indices is not None:
        a.indices = case.indices.data_ptr()
    a.partial_out = po.data_ptr() if po is not None else None
    a.partial_lse = pl.data_ptr() if pl is not None else None
    a.batch, a.s_q, a.num_splits, a.num_parts = p.batch, p.s_q, p.num_splits, p.num_parts
    a.softmax_scale = spec.softmax_scale
    a.stream = stream
    return a, (out, lse, po, pl, None), (p.num_splits, p.num_parts)


def with_schedule(plan, lib, launch, case, cfg, who: str):
    """Point a part-mode launch (make_args' triple) at the step's schedule, made once as
    k.plan(seqlens) makes it with the lengths on the device (core/plan.cuh), outside the timed
    calls; returns the schedule tensor, which the caller keeps alive."""
    parts = launch[2][1]
    if not parts or not hasattr(lib.dll, "attncc_plan_schedule"):
        raise SystemExit(f"{who} call is not in part mode, or its library makes no schedule")
    lengths = case.seqlens if case.seqlens is not None else \
        torch.zeros(cfg.batch, dtype=torch.int32, device="cuda")  # sparse: the lines need the batch only
    made = ops.plan_schedule(plan, lambda: lib, split.DecodeMetadata(-parts, None), lengths, cfg.s_q, None)
    launch[0].schedule = made.schedule.data_ptr()
    return made.schedule


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--page", type=int)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--spec-b", help="B's spec (the same cache layout, another schedule); default SPEC")
    ap.add_argument("--splits-a", type=int, default=0, help="A's num_splits as the op takes it: 0 the launch's "
                    "choice, n splits, -p balanced parts (A.so and B.so may then be one library)")
    ap.add_argument("--splits-b", type=int, default=0, help="... B's")
    ap.add_argument("--schedule-b", action="store_true", help="B's call reads the step's schedule, made once "
                    "beforehand as k.plan(seqlens) makes it on the device (core/plan.cuh; part mode)")
    ap.add_argument("--ordered-pages", action="store_true", help="each sequence's pages in order (a diagnostic "
                    "of what the random page order costs), not shuffled")
    args = ap.parse_args(argv)

    def record(lib: str) -> dict:
        """What bench/ab_build.py built `lib` as (its TAG_name.json), or {}."""
        sidecar = Path(lib).with_suffix(".json")
        return json.loads(sidecar.read_text()) if sidecar.exists() else {}

    def built_as(lib: str):
        """(h_q, page size) bench/ab_build.py built `lib` with, or None."""
        built = record(lib)
        return (built["heads_q"], built["page_size"]) if built else None

    def variant(path, libs):
        s = check_spec(Path(path))
        want = (args.heads or s.heads_q, args.page or s.page_size)
        # a library is a build of one variant: driving it at other heads or another page size
        # gives timings of garbage (session 20 ran an h_q 128 build at 64 heads)
        for lib in libs:
            built = built_as(lib) or (s.heads_q, s.page_size)  # without a record: the spec as written
            if built != want:
                raise SystemExit(f"{lib} is a build of h_q {built[0]}, page {built[1]}; driven at h_q {want[0]}, "
                                 f"page {want[1]} ({path} {'varied by --heads/--page' if want != (s.heads_q, s.page_size) else 'as written'}): "
                                 "build both at the values you drive")
        return bench.variant(s, *want)

    spec = variant(args.spec, [args.a] if args.spec_b else [args.a, args.b])
    spec_b = variant(args.spec_b, [args.b]) if args.spec_b else spec
    if (spec_b.heads_q, spec_b.heads_kv, spec_b.page_size, spec_b.d_k, spec_b.d_v) != \
            (spec.heads_q, spec.heads_kv, spec.page_size, spec.d_k, spec.d_v):
        raise SystemExit(f"--spec-b {args.spec_b}: not the layout of {args.spec}")
    specs = {"A": spec, "B": spec_b}
    libs = {"A": load(args.a), "B": load(args.b)}
    cfg = bench.Config(args.batch, args.sq, spec.heads_q, args.seqlen, spec.page_size)
    case = bench.inputs(spec, cfg, ordered_pages=args.ordered_pages)
    requested = {"A": args.splits_a, "B": args.splits_b}
    # each library driven by the plan of the family it was built on (ab_build --family), else the lowering's
    paths = {"A": args.a, "B": args.b}
    kernels = {name: Kernel(specs[name], record(paths[name]).get("family")) for name in libs}
    launches = {name: make_args(kernels[name].plan, lib, case, specs[name], requested=requested[name])
                for name, lib in libs.items()}
    if args.schedule_b:
        made = with_schedule(kernels["B"].plan, libs["B"], launches["B"], case, cfg, "--schedule-b: B's")
        launches["B"] = (*launches["B"], made)  # kept alive
    flush = torch.empty(bench.L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    times = {"A": [], "B": []}
    for name, lib in libs.items():  # warm up, and check both run
        for _ in range(3):
            lib.launch(launches[name][0])
    torch.cuda.synchronize()
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for name in order:
            flush.zero_()
            torch.cuda._sleep(200_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            libs[name].launch(launches[name][0])
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3)
    (oa, la, *_), (ob, lb, *_) = launches["A"][1], launches["B"][1]
    same = torch.equal(oa, ob) and torch.equal(la, lb)
    # each build against the reference on a few sequences of the same call (bench's check)
    rows = sorted({0, cfg.batch // 2, cfg.batch - 1})[:bench.CHECKED_SEQUENCES]
    sub = bench._subset(case, rows)
    checks = {n: testing.compare(spec, sub, launches[n][1][0][rows], launches[n][1][1][rows]) for n in libs}
    ma, mb = statistics.median(times["A"]), statistics.median(times["B"])
    flagged = [n for n in libs if launches[n][1][4] is not None and int(launches[n][1][4].item())]
    print(f"{spec.name} {cfg.label()}{' ordered pages' if args.ordered_pages else ''}{', B with the schedule' if args.schedule_b else ''} splits/parts {launches['A'][2]}/{launches['B'][2]}: A {ma:.1f} us, B {mb:.1f} us, "
          f"B/A {mb / ma:.4f}, outputs {'bitwise equal' if same else 'differ'}; "
          + "; ".join(f"{n} vs reference: {'ok' if c.ok else 'WRONG'} ({c})" for n, c in checks.items())
          + (f", FLAGGED a bad value on good inputs: {flagged}" if flagged else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
