"""`attncc bench`: time generated ops on the GPU against measured ceilings.

Each configuration: a cache larger than L2 filled with random data, seqlens all s_k (or,
ragged, spread over [1, 2 s_k - 1] with mean exactly s_k), pages in random order; the op is
first checked against the reference on a few sequences of the same call, then timed as the
median of CUDA events around the replay of a CUDA graph of the whole call (split kernel +
combine) with L2 flushed before each. The GPU is kept busy (a spin kernel after the flush)
while the host enqueues the replay, so the events time the GPU work of the call. The host's
cost of one eager call k(...) is reported beside it: the median over calls made back to back
(the host ahead of the GPU, as in a decode loop), without and with metadata from k.plan
(`host md`), and with metadata after a sync each (`md idle`: the GPU idle, the host just woken
from waiting for it). Ceilings are measured in the same run: a device-to-device copy (bytes read +
written) and a bf16 GEMM 8192³."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass

import torch

from . import storage, testing
from .explain import roofline
from .ir import Spec
from .kernel import Kernel

L2_FLUSH_BYTES = 256 << 20
FILL_CHUNK_TOKENS = 1 << 16
CHECKED_SEQUENCES = 3
HOST_CALLS = 100  # eager calls a host time is the median of (the host is noisy)


@dataclass(frozen=True)
class Config:
    batch: int
    s_q: int
    heads_q: int
    seqlen: int
    page_size: int
    ragged: bool = False  # lengths spread over [1, 2 seqlen - 1], mean seqlen (dense specs)

    def label(self) -> str:
        return (f"b={self.batch} s_q={self.s_q} h_q={self.heads_q} s_k={self.seqlen}"
                f"{'~' if self.ragged else ''} page={self.page_size}")

    def lengths(self, seed: int = 0) -> list[int]:
        """Each sequence's cached length. Ragged: pairs s_k - d, s_k + d with d uniform in
        [0, s_k - 1], shuffled, so the total (hence bytes and FLOPs) equals the uniform one."""
        if not self.ragged:
            return [self.seqlen] * self.batch
        gen = torch.Generator().manual_seed(seed)
        half = torch.randint(0, self.seqlen, (self.batch // 2,), generator=gen).tolist()
        lengths = [self.seqlen + d for d in half] + [self.seqlen - d for d in half]
        lengths += [self.seqlen] * (self.batch % 2)
        return [lengths[i] for i in torch.randperm(self.batch, generator=gen).tolist()]


def default_grid(spec: Spec) -> list[Config]:
    """FlashMLA's table (PEERS.md): b=128, h_q {16,32,64,128}, s_q {1,2}, s_k {4096,
    8192,32768}, page 64; plus pages 1 and 16 at two representative points."""
    heads = [h for h in (16, 32, 64, 128) if h % spec.heads_kv == 0] or [spec.heads_q]
    sqs = [s for s in (1, 2) if s <= spec.max_query_len]
    grid = [Config(128, s, h, L, 64) for h in heads for s in sqs for L in (4096, 8192, 32768)]
    for page in (1, 16):
        grid.append(Config(128, sqs[-1], heads[-1], 8192, page))
        grid.append(Config(128, 1, heads[0], 32768, page))
    return grid


def variant(spec: Spec, heads_q: int, page_size: int) -> Spec:
    """The spec with another head count and page size (a benchmark axis). With another
    head count the schedule's tile and stage knobs are dropped: the lowering picks them
    for the new rows, as it would for a spec written with that head count."""
    if (heads_q, page_size) == (spec.heads_q, spec.page_size):
        return spec
    schedule = spec.schedule
    if heads_q != spec.heads_q:  # tile sizes were chosen for the spec's own head count
        schedule = dataclasses.replace(schedule, tile_q=None, tile_kv=None, stages=None)
    return dataclasses.replace(spec, name=f"{spec.name}_h{heads_q}_p{page_size}",
                               heads_q=heads_q, page_size=page_size, schedule=schedule)


def measure_ceilings(device="cuda") -> dict:
    copy_bytes = 2 << 30
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    copy_s = _median_seconds(lambda: dst.copy_(src), flush=None, iters=10)
    del src, dst
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    gemm_s = _median_seconds(lambda: a @ b, flush=None, iters=10)
    return {"copy_GBps": 2 * copy_bytes / copy_s / 1e9, "gemm_TFLOPs": 2 * n ** 3 / gemm_s / 1e12}


WARMUP_SECONDS = 0.3  # the SM clock idles low between configurations: run it up first
# The spin kernel queued before each timed call lasts twice the host's median enqueue time of
# the call (at ~2 GHz), so that the start event does not wait for the host, and not much
# longer (the rest of the GPU idles meanwhile).
SPIN_CYCLES_PER_SECOND = 2e9
SPIN_MIN_CYCLES, SPIN_MAX_CYCLES = 50_000, 1_000_000


def graph_of(call) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one call (warmed up on a side stream, as capture wants)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _median_seconds(fn, flush, iters: int, cover_seconds: float = 0.0) -> float:
    import time

    start = time.perf_counter()
    calls = 0
    while calls < 3 or time.perf_counter() - start < WARMUP_SECONDS:
        fn()
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if flush is not None:
            flush()
        if cover_seconds:
            torch.cuda._sleep(int(min(max(2 * cover_seconds * SPIN_CYCLES_PER_SECOND, SPIN_MIN_CYCLES),
                                      SPIN_MAX_CYCLES)))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def host_seconds(fn, iters: int = 10, back_to_back: bool = False) -> float:
    """Median host time to enqueue one call: with the GPU idle before each (a sync before
    every call, so nothing waits on it), or back_to_back: calls in a row with no sync between,
    as in a decode loop where the host runs ahead of the GPU (each call timed alone; the GPU
    queue holds them all, so no call waits for a slot)."""
    import time

    times = []
    for _ in range(iters):
        if not back_to_back:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times)


def _fill(spec: Spec, cache, tokens: int, device, gen) -> None:
    for lo in range(0, tokens, FILL_CHUNK_TOKENS):
        slots = torch.arange(lo, min(tokens, lo + FILL_CHUNK_TOKENS), device=device)
        values = {s.name: torch.randn(len(slots), 1 if s.shared else spec.heads_kv, s.dim,
                                      device=device, generator=gen) for s in spec.segments}
        storage.write(spec, cache, slots, values)


def inputs(spec: Spec, cfg: Config, device="cuda", seed: int = 0, ordered_pages: bool = False) -> testing.Case:
    """A call's inputs: a random cache larger than L2, its pages in random order (in order, page i
    of sequence s at s * pages_per_seq + i, with ordered_pages: a diagnostic of what the
    scattered pages cost)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    P = spec.page_size
    lengths = cfg.lengths(seed)
    pages_per_seq = math.ceil(max(lengths) / P)
    pages = cfg.batch * pages_per_seq
    cache = storage.new_cache(spec, pages, device)
    _fill(spec, cache, pages * P, device, gen)
    q = torch.randn(cfg.batch, cfg.s_q, spec.heads_q, spec.d_k, device=device, generator=gen)
    q = q.to(storage.torch_dtype(spec.elem))
    order = torch.randperm(pages, device=device, generator=gen).to(torch.int32)  # (drawn either way: the
    if ordered_pages:                                                           # later draws stay the same)
        order = torch.arange(pages, device=device, dtype=torch.int32)
    table = order.view(cfg.batch, pages_per_seq)
    if spec.sparse:
        return testing.Case(q, cache, None, None, _topk_slots(spec, cfg, table, gen))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return testing.Case(q, cache, table, seqlens, None)


def _topk_slots(spec: Spec, cfg: Config, table: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A sparse call's indices as a top-k selection makes them (and as .peers/sparse_fp8.py
    measures FlashMLA): each query's topk distinct positions of its own sequence, in random
    order, mapped through the sequence's pages (in random order) to cache slots; -1 past the
    sequence's length when it is shorter than topk."""
    P, L, k = spec.page_size, cfg.seqlen, spec.topk
    keys = torch.rand(cfg.batch, cfg.s_q, L, device=table.device, generator=gen)
    pos = keys.argsort(-1)[..., :k]                                   # distinct, random order
    b = torch.arange(cfg.batch, device=table.device).view(-1, 1, 1)
    slots = table.long()[b, pos // P] * P + pos % P
    if k > L:
        slots = torch.cat([slots, slots.new_full((cfg.batch, cfg.s_q, k - L), -1)], -1)
    return slots.to(torch.int32)


def _subset(case: testing.Case, rows: list[int]) -> testing.Case:
    pick = lambda t: None if t is None else t[rows]  # noqa: E731
    return testing.Case(case.q[rows], case.cache, pick(case.block_table), pick(case.seqlens),
                        pick(case.indices))


def run_config(kernel: Kernel, cfg: Config, ceilings: dict, iters: int = 20,
               check: bool = True) -> dict:
    spec = kernel.spec
    case = inputs(spec, cfg)
    call = lambda **kw: kernel(case.q, case.cache, case.block_table, case.seqlens,  # noqa: E731
                               indices=case.indices, **kw)
    out, lse = call()
    result = {"config": dataclasses.asdict(cfg), "spec": spec.name}
    if check:
        rows = sorted({0, cfg.batch // 2, cfg.batch - 1})[:CHECKED_SEQUENCES]
        cmp = testing.compare(spec, _subset(case, rows), out[rows], lse[rows])
        result["check"] = str(cmp)
        if not cmp.ok:
            raise AssertionError(f"{spec.name} {cfg.label()}: wrong result: {cmp}")
    flush_buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    # the host's cost of the user's eager call (the compiled launcher where there is one),
    # without and with the step's metadata reused (k.plan(seqlens) once per step)
    metadata = kernel.plan(case.seqlens if case.seqlens is not None else [0] * cfg.batch, s_q=cfg.s_q)
    host_s = host_seconds(call, HOST_CALLS, back_to_back=True)
    host_md_s = host_seconds(lambda: call(metadata=metadata), HOST_CALLS, back_to_back=True)
    host_idle_s = host_seconds(lambda: call(metadata=metadata), HOST_CALLS)
    seconds = _median_seconds(graph_of(call).replay, flush=flush_buf.zero_, iters=iters,
                              cover_seconds=host_s)
    roof = roofline(spec, cfg.batch, cfg.seqlen, cfg.s_q)
    gbps, tflops = roof.bytes / seconds / 1e9, roof.flops / seconds / 1e12
    floor = max(roof.bytes / (ceilings["copy_GBps"] * 1e9), roof.flops / (ceilings["gemm_TFLOPs"] * 1e12))
    result.update(us=seconds * 1e6, host_us=host_s * 1e6, host_md_us=host_md_s * 1e6, host_idle_us=host_idle_s * 1e6, GBps=gbps, TFLOPs=tflops, bound=roof.bound,
                  pct_copy=100 * gbps / ceilings["copy_GBps"],
                  pct_gemm=100 * tflops / ceilings["gemm_TFLOPs"],
                  pct_floor=100 * floor / seconds)
    del case, call, out, lse, flush_buf
    torch.cuda.empty_cache()
    return result


def format_table(results: list[dict], ceilings: dict) -> str:
    lines = [f"ceilings (this run): copy {ceilings['copy_GBps']:.0f} GB/s, bf16 GEMM "
             f"{ceilings['gemm_TFLOPs']:.0f} TFLOP/s",
             f"{'spec':<22} {'config':<44} {'us':>8} {'GB/s':>7} {'TFLOP/s':>8} "
             f"{'%copy':>6} {'%gemm':>6} {'%floor':>7} {'host us':>8} {'host md':>8} {'md idle':>8}"]
    for r in results:
        cfg = Config(**r["config"])
        lines.append(f"{r['spec']:<22} {cfg.label():<44} {r['us']:8.1f} {r['GBps']:7.0f} "
                     f"{r['TFLOPs']:8.1f} {r['pct_copy']:6.1f} {r['pct_gemm']:6.1f} {r['pct_floor']:7.1f} "
                     f"{r['host_us']:8.1f} {r.get('host_md_us', float('nan')):8.1f} "
                     f"{r.get('host_idle_us', float('nan')):8.1f}")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [Config(**r["config"]).label().replace(" ", "\n", 2) for r in results]
    fig, ax = plt.subplots(figsize=(max(8, len(results) * 0.6), 4))
    ax.bar(range(len(results)), [r["pct_floor"] for r in results])
    ax.set_xticks(range(len(results)), labels, rotation=90, fontsize=6)
    ax.set_ylabel("% of roofline floor")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def bench(spec: Spec, configs: list[Config], iters: int = 20, check: bool = True,
          progress=print) -> tuple[list[dict], dict]:
    import warnings

    ceilings = measure_ceilings()
    progress(f"ceilings: {json.dumps({k: round(v) for k, v in ceilings.items()})}")
    kernels: dict[tuple[int, int], Kernel] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cfg in configs:
            key = (cfg.heads_q, cfg.page_size)
            if key not in kernels:
                kernels[key] = Kernel(variant(spec, *key))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:  # nvcc runs are subprocesses
        list(pool.map(lambda k: k.build(), kernels.values()))
    results = []
    for cfg in configs:
        r = run_config(kernels[(cfg.heads_q, cfg.page_size)], cfg, ceilings, iters, check)
        progress(f"{r['spec']:<22} {cfg.label():<44} {r['us']:8.1f} us {r['GBps']:6.0f} GB/s "
                 f"{r['TFLOPs']:6.1f} TFLOP/s")
        results.append(r)
    return results, ceilings
