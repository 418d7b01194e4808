"""`attncc explain`: what a spec costs, from the checked IR alone: the record layout,
key/value widths, FLOPs per byte and the roofline floor on a measured GPU."""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Spec
from .target import GPUS


@dataclass(frozen=True)
class Roofline:
    bytes: int
    flops: int
    floor_s: float
    bound: str  # "memory" or "compute"

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def roofline(spec: Spec, batch: int, seqlen: int, s_q: int = 1, gpu: str = "h200") -> Roofline:
    """Fewest bytes (cache read once, q read, out written) and FLOPs of one call."""
    ceil = GPUS[gpu]
    # a sparse query token attends to its own top-k set; a dense one to the sequence
    tokens = s_q * spec.topk if spec.sparse else seqlen
    elem = spec.elem.bytes
    io = batch * s_q * spec.heads_q * (spec.d_k + spec.d_v) * elem + batch * s_q * spec.heads_q * 4
    nbytes = batch * tokens * spec.record_bytes + io
    attended = spec.topk if spec.sparse else seqlen
    flops = batch * s_q * attended * spec.flops_per_token
    memory_s, compute_s = nbytes / ceil.bandwidth, flops / ceil.flops
    return Roofline(nbytes, flops, max(memory_s, compute_s),
                    "memory" if memory_s >= compute_s else "compute")


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= factor:
            return f"{x / factor:.3f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def explain(spec: Spec, batch: int = 1, seqlen: int = 4096, s_q: int = 1, gpu: str = "h200",
            plan_lines: tuple[str, ...] = ()) -> str:
    if gpu not in GPUS:
        raise ValueError(f"gpu: expected one of {sorted(GPUS)}, got {gpu!r}")
    if batch < 1 or seqlen < 0 or not 1 <= s_q <= spec.max_query_len:
        raise ValueError(f"expected batch >= 1, seqlen >= 0, 1 <= s_q <= {spec.max_query_len}")
    packed = spec.packed_dtype
    if spec.separate:
        storage = "separate: one tensor per segment ([num_pages, P, (G,) dim])"
    else:
        kind = packed.name if packed else "uint8 bytes"
        width = spec.record_bytes // (packed.bytes if packed else 1)
        storage = f"packed: one {kind} tensor [num_pages, {spec.page_size}, {width}]"
    lines = [
        f"{spec.name}: {spec.heads_q} query heads over {spec.heads_kv} kv head(s), group {spec.group}",
        f"cache: paged({spec.page_size}), {storage}",
        f"record: {spec.record_bytes} bytes/token",
        "  offset  bytes  segment          dtype  dim  copies",
    ]
    for seg in spec.segments:
        copies = "1 shared" if seg.shared else f"{seg.copies} (per kv head)"
        scales = f", fp32 scale per {seg.scale_group}" if seg.scale_group else ""
        lines.append(f"  {seg.offset:6d} {seg.bytes:6d}  {seg.name:<16} {seg.dtype.name:<5} "
                     f"{seg.dim:4d}  {copies}{scales}")
    key_cols = {(p.segment, c) for p in spec.key for c in range(p.lo, p.hi)}
    shared = sum(1 for p in spec.value for c in range(p.lo, p.hi) if (p.segment, c) in key_cols)
    overlap = f" ({shared} of them shared with the key: loaded once)" if shared else ""
    lines += [
        f"key   = {_describe(spec, spec.key)}   d_k = {spec.d_k}",
        f"value = {_describe(spec, spec.value)}   d_v = {spec.d_v}{overlap}",
        f"query: s_q <= {spec.max_query_len}{', causal' if spec.causal else ''}"
        f"{f', sparse top-{spec.topk}' if spec.sparse else ''}; softmax scale {spec.softmax_scale:.10g}",
        f"FLOPs per cached token per query token: 2*{spec.heads_q}*({spec.d_k}+{spec.d_v}) = "
        f"{spec.flops_per_token}",
        f"intensity: {spec.intensity:.1f} FLOPs/byte at s_q = 1",
    ]
    sched = spec.schedule
    knobs = [f"target {sched.target}", f"split_kv {sched.split_kv}"]
    knobs += ["seesaw"] * sched.seesaw + ["crossover"] * sched.crossover
    if sched.tile_q:
        knobs.append(f"tile q={sched.tile_q} kv={sched.tile_kv}")
    if sched.stages:
        knobs.append(f"stages {sched.stages}")
    lines.append("schedule: " + ", ".join(knobs))
    lines += list(plan_lines)
    roof = roofline(spec, batch, seqlen, s_q, gpu)
    ceil = GPUS[gpu]
    what = f"top-{spec.topk} tokens" if spec.sparse else f"seqlen {seqlen}"
    lines += [
        f"roofline on {ceil.name} ({ceil.bandwidth / 1e12:.1f} TB/s, {ceil.flops / 1e12:.0f} TFLOP/s), "
        f"batch {batch}, {what}, s_q {s_q}:",
        f"  bytes moved {_si(roof.bytes, 'B')}, FLOPs {_si(roof.flops, 'FLOP')}, "
        f"intensity {roof.intensity:.1f} FLOPs/byte",
        f"  floor {roof.floor_s * 1e6:.1f} us ({roof.bound}-bound)",
    ]
    return "\n".join(lines)



def _describe(spec: Spec, parts) -> str:
    """`a ++ b[lo:hi]` as written, whole segments without a slice."""
    return " ++ ".join(
        p.segment if (p.lo, p.hi) == (0, spec.segment(p.segment).dim) else f"{p.segment}[{p.lo}:{p.hi}]"
        for p in parts)
