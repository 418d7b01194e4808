"""Where the host's time of one eager call goes (GPU; a benchmark, not a test).

    python3 bench/host_profile.py [SPEC] [--batch 1 --sq 1 --seqlen 32768] [--calls 200]

Times, as the median over `calls` calls with the GPU idle before each (so nothing waits on
it), the whole eager call k(...) (the compiled launcher, launcher.py) with and without the
step's metadata, the launcher alone, and the Python path's stages one by one: the argument
checks with and without the value checks, the torch op (dispatch + launch), the launch body
without the dispatcher, and parts of that body (cache views, output allocation, the split
schedule, the stream). Then the wall time per call of `calls` eager calls back to back
against the replay of a CUDA graph of the same call (DESIGN.md §3a: eager within 15 us)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import attncc  # noqa: E402
from attncc import bench, ops, validate  # noqa: E402
from attncc.ops import cache_list  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", nargs="?", default="examples/mla.attn")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args(argv)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = attncc.compile(Path(args.spec))
    spec = k.spec
    case = bench.inputs(spec, bench.Config(args.batch, args.sq, spec.heads_q, args.seqlen, spec.page_size))
    cache = cache_list(spec, case.cache)
    lib = k.op.library()
    call = lambda **kw: k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, **kw)  # noqa: E731
    metadata = k.plan(case.seqlens if case.seqlens is not None else [0] * args.batch, s_q=args.sq)
    call()
    fast = k.op.fast()
    if fast is None:
        print("no compiled launcher here: the eager rows are the Python path's", file=sys.stderr)
    rows = [
        ("eager call k(...)", call),
        ("eager call k(..., metadata=k.plan(seqlens))", lambda: call(metadata=metadata)),
        ("  the compiled launcher alone", (lambda: fast(case.q, case.cache, case.block_table,
                                                        case.seqlens, case.indices, spec.softmax_scale, 0, None,
                                                        None)) if fast else call),
        ("Python path: validate.call_arguments, value checks", lambda: validate.call_arguments(
            spec, case.q, case.cache, case.block_table, case.seqlens, case.indices, True)),
        ("  validate.call_arguments, metadata only", lambda: validate.call_arguments(
            spec, case.q, case.cache, case.block_table, case.seqlens, case.indices, False)),
        ("  k.op(...): dispatcher + launch", lambda: k.op(case.q, cache, case.block_table, case.seqlens,
                                                        case.indices, spec.softmax_scale, 0)),
        ("  ops.cuda_forward: launch body", lambda: ops.cuda_forward(
            k.spec, k.plan, lib, case.q, cache, case.block_table, case.seqlens, case.indices, spec.softmax_scale, 0)),
        # parts of the launch body (the rest: argument packing, ctypes, the C launcher, the kernels' enqueue)
        ("    cache views and stride checks", lambda: [ops._cache_view(spec, k.plan, i, t) for i, t in enumerate(cache)]),
        ("    out and lse (two torch.empty)", lambda: (
            torch.empty(args.batch, args.sq, spec.heads_q, spec.d_v, dtype=case.q.dtype, device=case.q.device),
            torch.empty(args.batch, spec.heads_q, args.sq, dtype=torch.float32, device=case.q.device))),
        ("    split schedule (ops._schedule)", lambda: ops._schedule(
            k.plan, lib, args.batch, args.sq, case.block_table, 0, case.q.device.index or 0)),
        ("    current stream", lambda: torch.cuda.current_stream(case.q.device).cuda_stream),
    ]
    results = [(label, bench.host_seconds(fn, args.calls) * 1e6) for label, fn in rows]
    results.insert(2, ("eager call k(..., metadata), back to back (no sync)",
                       bench.host_seconds(lambda: call(metadata=metadata), args.calls, back_to_back=True) * 1e6))
    print(f"{spec.name} b={args.batch} s_q={args.sq} s_k={args.seqlen}: host us per call (median of {args.calls})")
    for label, us in results:
        print(f"  {label:<52} {us:8.1f}")
    eager, graph = back_to_back(call, args.calls)
    print(f"wall us per call, {args.calls} back to back: eager {eager:.1f}, CUDA-graph replay {graph:.1f}, "
          f"eager - graph {eager - graph:.1f}")
    return 0


def back_to_back(call, n: int) -> tuple[float, float]:
    """Wall time per call of n eager calls in a row, and of n replays of a graph of one call."""
    import time

    def per_call(fn) -> float:
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    return per_call(call), per_call(bench.graph_of(call).replay)


if __name__ == "__main__":
    sys.exit(main())
