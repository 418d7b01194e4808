"""A clock trace of one CTA of the Hopper family's seesaw (GPU): where a pair of tiles' time goes.

    python3 bench/clock_trace.py SPEC [--batch 128 --sq 2 --heads 128 --seqlen 8192 --page 64] [--cta 7]
                                 [--splits N | --schedule] [--spans JSON] [--build-dir DIR [--build-only]]

Builds SPEC's plan with ATTNCC_TRACE_CTA defined (templates/include/attncc/core/trace.cuh: the
SM clock at each phase boundary of each consumer warp group's thread 0 and of the producer's
thread 0, in the traced CTA; the same kernels otherwise, whose timing the stores perturb little),
runs one call on bench's inputs (after warm-up, L2 flushed), reads the clocks back and prints the
median cycles of each phase over the steady pairs (all but the first and last two), the pair's
period, and how long after the producer issues a stage its readers see it land. Part mode walks
pieces: a pair is the CTA's pair in its whole stream (pairs of every piece, in order). Then where
the call's time goes beyond the steady pairs: the SM clock's rate (the traced CTA's cycles over its
global-timer nanoseconds), the grid's balance (every CTA's begin and end, from the first begin),
and the traced CTA's span against its pairs and its pieces' Q loads and epilogues."""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ab  # noqa: E402
from attncc import bench, testing  # noqa: E402
from attncc.build import LIBRARY, nvcc_command  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402
from attncc.render import render, source_name  # noqa: E402

ROLES, SLOTS, EVENTS, CTAS = 5, 1024, 8, 4096  # core/trace.cuh
START = 4  # the role of a CTA's start (core/trace.cuh kTraceStart), slot 0
# seesaw.cuh's events (numbered by meaning), as phases (event -> the next in the group's order)
# of each consumer warp group; WG1's order depends on the plan's value_first
WG0 = ((0, 1, "S: boxes landing"), (1, 2, "S: last k-steps"), (2, 3, "row max, MAX_A"), (3, 4, "exp, P_a, P_A"),
       (4, 5, "O_L += P_a V_a"), (5, 6, "P_B wait"), (6, 7, "O_L += P_b V_b"))
WG1 = ((0, 1, "S: boxes landing"), (1, 2, "S: last k-steps"), (2, 3, "MAX_A wait"), (3, 4, "exp, P_b, P_B"),
       (4, 5, "P_A wait"), (5, 6, "O_R += P_a V_a"), (6, 7, "O_R += P_b V_b"))
WG1_VALUE_FIRST = ((0, 3, "MAX_A wait"), (3, 5, "P_A wait"), (5, 6, "O_R += P_a V_a"), (6, 1, "S_b: boxes landing"),
                   (1, 2, "S_b: last k-steps"), (2, 4, "exp, P_b, P_B"), (4, 7, "O_R += P_b V_b"))
# produce.cuh's, per tile (4 and 5: the fp8 groups' conversions, where the tile has them)
PRODUCER = ((0, 1, "EMPTY early wait"), (1, 2, "early copies, EMPTY late wait"), (2, 3, "late copies"),
            (3, 6, "early landing"), (6, 4, "early conversion"), (4, 7, "late landing"), (7, 5, "late conversion"))


def build(plan, cta: int, directory: Path) -> Path:
    """The traced library of `plan` in `directory`, compiled unless the directory already holds
    one built from the same source (--build-dir: build once, e.g. on the CPU, trace many calls)."""
    source = directory / source_name(plan)
    text = f"#define ATTNCC_TRACE_CTA {cta}\n" + render(plan)
    library = directory / LIBRARY
    if library.exists() and source.exists() and source.read_text() == text:
        return library
    source.write_text(text)
    subprocess.run(nvcc_command(source, library, plan.target), check=True, capture_output=True)
    return library


def check(call: str, status: int) -> None:
    """A trace reader's cudaError_t: anything but success ends the run (a wrong array size is
    cudaErrorInvalidValue, 1: ROLES, SLOTS or EVENTS out of step with core/trace.cuh)."""
    if status != 0:
        raise SystemExit(f"{call}: CUDA error {status}")


def gap(start, end):
    """Cycles from one event to another, None if either was not recorded."""
    return None if start is None or end is None else end - start


def median(values) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):7.0f}" if values else "      -"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sq", type=int, default=2)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--page", type=int)
    ap.add_argument("--cta", type=int, default=7, help="the block index traced")
    ap.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a field of the plan's kernel config (an int or true/false), e.g. "
                         "value_first=false: the trace of a lowering choice not taken")
    ap.add_argument("--splits", type=int, default=0,
                    help="num_splits as the op takes it: 0 the launch's choice, n splits, -p balanced parts")
    ap.add_argument("--schedule", action="store_true",
                    help="the part-mode call reads the step's schedule (k.plan(seqlens) on the device), as the "
                         "side-by-side calls it, instead of each CTA walking the lengths itself")
    ap.add_argument("--build-dir", type=Path, metavar="DIR",
                    help="build the traced library into DIR, or take the one DIR holds from the same source")
    ap.add_argument("--build-only", action="store_true", help="with --build-dir: build, trace nothing (no GPU)")
    ap.add_argument("--spans", type=Path, metavar="JSON",
                    help="also write every CTA's [begin, end] (global timer, ns from the first begin) there")
    args = ap.parse_args(argv)
    spec = check_spec(Path(args.spec))
    spec = bench.variant(spec, args.heads or spec.heads_q, args.page or spec.page_size)
    plan = Kernel(spec).plan
    try:
        plan = testing.with_config(plan, args.config)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if plan.family != "hopper" or not plan.config.seesaw:
        raise SystemExit(f"{args.spec}: the trace reads the seesaw's events; this plan is "
                         f"{plan.family}{'' if plan.family != 'hopper' else ' (stacked)'}")
    if args.build_only:
        if not args.build_dir:
            raise SystemExit("--build-only needs --build-dir")
        args.build_dir.mkdir(parents=True, exist_ok=True)
        print(build(plan, args.cta, args.build_dir))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.build_dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        lib = ab.load(str(build(plan, args.cta, directory)))
        cfg = bench.Config(args.batch, args.sq, spec.heads_q, args.seqlen, spec.page_size)
        case = bench.inputs(spec, cfg)
        made = ab.make_args(plan, lib, case, spec, requested=args.splits)
        launch, _, parts = made
        # the schedule's tensor held until the traced call has run
        schedule = ab.with_schedule(plan, lib, made, case, cfg, "--schedule: the") if args.schedule else None
        flush = torch.empty(bench.L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        for _ in range(3):
            lib.launch(launch)
        torch.cuda.synchronize()
        check("attncc_trace_clear", lib.dll.attncc_trace_clear())
        flush.zero_()
        lib.launch(launch)
        torch.cuda.synchronize()
        raw = (ctypes.c_ulonglong * (ROLES * SLOTS * EVENTS))()
        check("attncc_trace_read", lib.dll.attncc_trace_read(raw, ctypes.c_size_t(ctypes.sizeof(raw))))
        span = (ctypes.c_ulonglong * (CTAS * 4))()
        check("attncc_trace_read_span", lib.dll.attncc_trace_read_span(span, ctypes.c_size_t(ctypes.sizeof(span))))
    title = f"{spec.name} {cfg.label()} splits/parts {parts}{' with the schedule' if args.schedule else ''}"
    report(list(raw), list(span), args.cta, plan.config.value_first, title)
    if args.spans:
        args.spans.write_text(json.dumps({"title": title, "spans": spans_ns(list(span))}))
    return 0


def spans_ns(span) -> dict:
    """Every recorded CTA's [begin, end] on the global timer, ns from the grid's first begin."""
    ctas = {i: span[4 * i: 4 * i + 4] for i in range(CTAS) if span[4 * i] and span[4 * i + 2]}
    t0 = min((c[0] for c in ctas.values()), default=0)
    return {i: [c[0] - t0, c[2] - t0] for i, c in ctas.items()}


def role_events(flat, role: int, first: int, events: int = EVENTS):
    """Role `role`'s first `events` events of each slot, cycles from `first` (None: not recorded)."""
    at = lambda i, e: flat[(role * SLOTS + i) * EVENTS + e]  # noqa: E731
    return [[at(i, e) - first if at(i, e) > 0 else None for e in range(events)] for i in range(SLOTS)]


def report(flat, span, cta: int, value_first: bool, title: str) -> None:
    """The trace's tables from the arrays read back (core/trace.cuh's trace_clock and trace_span,
    flattened): the steady pairs' phases, then the timeline."""
    if not any(flat):
        raise SystemExit(f"CTA {cta} recorded nothing (a grid of fewer blocks?)")
    first = min(v for v in flat if v > 0)  # cycles from the CTA's first event; None: not recorded
    w0, w1, pr = (role_events(flat, r, first) for r in range(3))
    pairs = sum(row[0] is not None for row in w0)
    steady = [i for i in range(2, pairs - 2) if None not in w0[i] and None not in w1[i] and w0[i + 1][0] is not None]
    print(f"{title}: CTA {cta}, {pairs} pairs, {len(steady)} steady; "
          f"median cycles")
    wg1 = WG1_VALUE_FIRST if value_first else WG1
    for name, wg, phases in (("WG0", w0, WG0), ("WG1", w1, wg1)):
        cells = [f"{p} {median([gap(wg[i][e], wg[i][f]) for i in steady])}" for e, f, p in phases]
        print(f"  {name}: " + " | ".join(cells) + f" | to the next pair {median([gap(wg[i][7], wg[i + 1][0]) for i in steady])}")
    print(f"  period (WG0's pair to pair) {median([gap(w0[i][0], w0[i + 1][0]) for i in steady])}")
    # the producer's slots are tiles, two a pair: those of the pairs past SLOTS / 2 are not recorded
    held = [i for i in steady if 2 * (i + 1) + 1 < SLOTS]
    if len(held) < len(steady):
        print(f"  (the producer's lines: the {len(held)} steady pairs whose tiles fit the trace's {SLOTS} slots)")
    for half, name in ((0, "a"), (1, "b")):
        cells = [f"{p} {median([gap(pr[2 * i + half][e], pr[2 * i + half][f]) for i in held])}"
                 for e, f, p in PRODUCER]
        print(f"  producer, tile {name}: " + " | ".join(cells))
    print("  issue -> landed: next a's late copies -> WG0's S landed "
          f"{median([gap(pr[2 * (i + 1)][2], w0[i + 1][1]) for i in held])}; next b's late copies -> WG1's "
          f"{median([gap(pr[2 * (i + 1) + 1][2], w1[i + 1][1]) for i in held])}")
    print("  release -> producer: WG0's O_L += P_a V_a -> EMPTY early of the next a "
          f"{median([gap(w0[i][5], pr[2 * (i + 1)][1]) for i in held])}; WG1's O_R += P_a V_a -> EMPTY late "
          f"{median([gap(w1[i][6], pr[2 * (i + 1)][2]) for i in held])}")
    pieces = role_events(flat, 3, first, events=3)
    timeline(span, cta, first, w0, pieces, pairs, [gap(w0[i][0], w0[i + 1][0]) for i in steady])
    start(span, cta, first, role_events(flat, START, first)[0], pr[0], pieces[0], w0[0])


def start(span, cta, first, begun, tile0, piece0, pair0) -> None:
    """The traced CTA's start, cycles from its begin (core/trace.cuh: the start's role,
    then the first tile's and the first piece's events): what comes before its first products."""
    begin = span[4 * cta + 1] - first
    at = lambda v: "-" if v is None else f"{v - begin}"  # noqa: E731
    print(f"  start, cycles from the CTA's begin: barriers {at(begun[0])} | walk started {at(begun[1])} | "
          f"CTA met {at(begun[2])} | producer {at(begun[3])}, consumers {at(begun[4])} past setmaxnreg | "
          f"producer: piece 0's length read {at(begun[5])}, tile 0's page numbers read {at(begun[6])} | "
          f"tile 0: EMPTY wait {at(tile0[0])}, early passed {at(tile0[1])}, late passed {at(tile0[2])}, "
          f"copies issued {at(tile0[3])} | piece 0: Q issued {at(piece0[0])}, "
          f"Q landed {at(piece0[1])} | WG0's first S: boxes landed {at(pair0[1])}")


def timeline(span, cta, first, w0, pieces, pairs, periods) -> None:
    """Where the call's time goes beyond the steady pairs: core/trace.cuh's spans (every CTA's
    begin and end: global ns, SM clock) and role 3 (the traced CTA's pieces), cycles from `first`."""
    ctas = spans_ns(span)
    mine = span[4 * cta: 4 * cta + 4]
    if cta not in ctas:
        print("  timeline: no spans recorded")
        return
    begins = sorted(b / 1e3 for b, _ in ctas.values())
    ends = sorted(e / 1e3 for _, e in ctas.values())
    ns, cycles = mine[2] - mine[0], mine[3] - mine[1]
    print(f"  grid: {len(ctas)} CTAs, the last begins {begins[-1]:.1f} us after the first; they end "
          f"{ends[0]:.1f} (min) / {statistics.median(ends):.1f} (median) / {ends[-1]:.1f} (max) us after it; "
          f"SM clock {cycles / ns:.3f} GHz (CTA {cta})")
    listed = [(i, p) for i, p in enumerate(pieces) if None not in p]  # (first pair, events)
    steady = statistics.median(periods) if periods else 0
    print(f"  CTA {cta}: {cycles} cycles begin to end; {pairs} pairs x the steady period = {pairs * steady:.0f} "
          f"({pairs * steady / cycles:.1%})")
    if not listed:
        return
    q_wait = [p[1] - p[0] for _, p in listed]
    between = [b[0] - a[2] for (_, a), (_, b) in zip(listed, listed[1:])]
    lasts = [j - 1 for j, _ in listed[1:]] + [pairs - 1]  # each piece's last pair
    epilogue = [p[2] - max(v for v in w0[last] if v is not None) for (_, p), last in zip(listed, lasts)]
    print(f"  {len(listed)} pieces ({[j for j, _ in listed]} their first pairs): the CTA's begin -> the first piece "
          f"{listed[0][1][0] - (mine[1] - first)}; Q wait (piece begins -> Q landed) {sum(q_wait)} in all, "
          f"{statistics.median(q_wait):.0f} median; WG0's last event -> results written {sum(epilogue)} in all; "
          f"results written -> the next piece begins {sum(between)} in all; the last results -> the CTA's end "
          f"{(mine[3] - first) - listed[-1][1][2]}")

if __name__ == "__main__":
    sys.exit(main())
