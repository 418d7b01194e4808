"""The GPU time of one call, kernel by kernel, of attncc and of FlashMLA on FP8 sparse MLA, or
with --dense on dense bf16 MLA (GPU).

    python3 bench/kernel_split.py [--hq 128 --sq 2 --topk 2048 --sk 32768 --b 128] [--calls 5]
                                  [--systems attncc,flashmla] [--dense [--page 64]]

The inputs, the attncc spec and FlashMLA's call are `.peers/sparse_fp8.py`'s (which
`../shared/tools/peers-prepare` puts there; FlashMLA built by `.peers/build-flashmla.sh` and on
PYTHONPATH): so the kernels timed are those of the figure that script prints. Each system is
called a few times to warm up, then `--calls` times eagerly under torch.profiler (CUDA
activity), L2 flushed and a spin kernel enqueued before each call; prints each kernel's median
duration over the calls and the median span from a call's first kernel start to its last
kernel's end. Eager launches, not graph replay: the durations are the kernels', the span
includes the gaps between them. (bench/RESULTS.md, sessions 24-25: the combine kernels.)
With --dense the inputs, specs and calls are `.peers/sidebyside.py`'s MLA configuration of the
same b, h_q, s_q, s_k and page (each system as that script calls it, attncc with k.plan's
metadata)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = ("elementwise", "fill", "spin_kernel", "sleep")  # the flush and the spin, not the call's


def per_call(events, calls: int):
    """Kernel events [(name, start_us, end_us)] of `calls` identical calls, in any order, with the
    flush and spin kernels among them: the call's kernels in order, each with its median duration,
    and the median span of a call (first start to last end)."""
    kept = sorted((e for e in events if not any(h in e[0].lower() for h in HIDDEN)), key=lambda e: e[1])
    if calls <= 0 or not kept or len(kept) % calls:
        raise ValueError(f"{len(kept)} kernels are not {calls} calls of the same kernels")
    n = len(kept) // calls
    groups = [kept[i * n:(i + 1) * n] for i in range(calls)]
    names = [e[0] for e in groups[0]]
    if any([e[0] for e in g] != names for g in groups):
        raise ValueError("the calls launched different kernels")
    kernels = [(name, statistics.median(g[i][2] - g[i][1] for g in groups)) for i, name in enumerate(names)]
    return kernels, statistics.median(g[-1][2] - g[0][1] for g in groups)


def _sparse_calls(args, dev):
    """{system: call(inputs)}, the inputs and a title: sparse_fp8.py's FP8 sparse MLA."""
    try:
        import sparse_fp8
    except ImportError as e:
        raise SystemExit(f"{e}: run ../shared/tools/peers-prepare (it puts sparse_fp8.py into .peers/)") from e
    inp = sparse_fp8.make_inputs(args.b, args.hq, args.sq, args.topk, args.sk, dev)
    calls = sparse_fp8.systems(args.systems.split(","), args.hq, args.sq, args.topk)
    return calls, inp, f"sparse fp8 b={args.b} h_q={args.hq} s_q={args.sq} topk={args.topk} s_k={args.sk}"


def _dense_calls(args, dev):
    """The same for dense bf16 MLA: sidebyside.py's inputs and each system's call as it makes it."""
    try:
        import sidebyside as sbs
    except ImportError as e:
        raise SystemExit(f"{e}: run ../shared/tools/peers-prepare (it puts sidebyside.py into .peers/)") from e
    cfg = sbs.Cfg("mla", args.b, args.hq, args.sq, args.sk, args.page)
    inp = sbs.make_inputs(cfg, dev, 0, False, False)
    wanted = args.systems.split(",")
    calls = {}
    for name, system in sbs.load_systems(wanted, None).items():
        if name not in wanted:
            continue
        why = system.import_error if not system.available else system.unsupported(cfg)
        if why:
            print(f"== {name}: skipped ({why})")
            continue
        fn = system.prepare(cfg, inp, {})
        calls[name] = lambda _inp, fn=fn: fn()
    return calls, inp, f"dense MLA {cfg.name}"


def main(argv=None) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--hq", type=int, default=128)
    ap.add_argument("--sq", type=int, default=2)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--sk", type=int, default=32768)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--systems", default="attncc,flashmla")
    ap.add_argument("--dense", action="store_true", help="dense bf16 MLA on sidebyside.py's inputs")
    ap.add_argument("--page", type=int, default=64, help="--dense: the page size")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / ".peers"))
    dev = torch.device("cuda")
    calls, inp, what = _dense_calls(args, dev) if args.dense else _sparse_calls(args, dev)
    flush = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    for name, call in calls.items():
        for _ in range(3):
            call(inp)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                flush.zero_()
                torch.cuda._sleep(100_000)
                call(inp)
            torch.cuda.synchronize()
        events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels, span = per_call(events, args.calls)
        print(f"== {name} {what}, {args.calls} eager calls")
        for kernel, us in kernels:
            print(f"    {kernel[:96]:96s} {us:8.1f} us")
        print(f"    a call's first kernel start -> last kernel end: {span:.1f} us ({len(kernels)} kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
