"""The host's split-KV policy: how one call's KV tiles are spread over CTAs, for any kernel
family (a family's plan gives tile_m, tile_n and compute_bound), and the metadata of
`k.plan(seqlens)`. Two modes (templates/include/attncc/core/schedule.cuh):
  split mode  every sequence cut into num_splits equal tile ranges (memory-bound plans);
  part mode   all sequences' tiles laid end to end and cut into num_parts equal parts, one
              per SM's worth of CTAs (split_kv auto on a compute-bound plan); where the
              sequences are even enough, each cut moves back to the start of its sequence
              (whole-sequence parts: no partials), which the kernels decide from the lengths.
Either leaves partials that the combine kernel merges; workspace_shapes is the one statement
of their shapes on the host."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

WHOLE_SLACK = 16  # core/schedule.cuh kWholeSlack: whole-sequence parts up to 17/16 of the even length
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (prologue, combine) dominates
FULL_WAVE = 0.95  # a grid holding this share of the SMs' CTA slots at once is not split


@dataclass(frozen=True)
class DecodeMetadata:
    num_splits: int        # the launch's num_splits: n >= 1 splits, -p balanced parts, 0 its own choice
    longest: int | None    # the longest length it was planned for, where known on the host
    # part mode, lengths on the device: the parts' lines made there (abi.h AttnccArgs.schedule; a
    # uint8 CUDA tensor of -num_splits lines), which the decode CTAs read instead of cutting the line
    schedule: Any = field(default=None, compare=False, repr=False)
    # the query tokens a sequence it was made for (None: any, a count of the caller's own), and
    # k.plan(seqlens)'s metadata of the spec's other query lengths, which a call at one of them takes
    s_q: int | None = None
    others: tuple = ()

    def for_sq(self, s_q: int) -> DecodeMetadata:
        """The metadata a call of s_q query tokens a sequence takes: the parts of one s_q
        launched at another would be cut for its rows (MLA b = 128 s_q 2 with s_q 1's: 66 parts
        of 4 CTAs, two waves on 132 SMs), so one made for another s_q only is refused."""
        for meta in (self, *self.others):
            if meta.s_q is None or meta.s_q == s_q:
                return meta
        made = ", ".join(str(m.s_q) for m in (self, *self.others))
        raise ValueError(f"metadata: made by k.plan(seqlens, s_q=...) for s_q {made}; this call's q has s_q {s_q} "
                         f"(k.plan(seqlens) without s_q makes it for every s_q the spec takes)")


def balanced(plan) -> bool:
    """split_kv auto on a compute-bound plan: cut the tiles of all sequences into equal
    parts rather than each sequence into equal splits. Memory-bound plans keep splits: they
    run several CTAs per SM, which already evens out the waves."""
    return plan.split_kv == "auto" and plan.config.compute_bound


def lanes(plan, s_q: int) -> int:
    """CTAs that read the same KV tiles: row blocks x kv heads (the kernels' CtaWork::lanes)."""
    rows = plan.group * (1 if plan.sparse else s_q)
    return plan.heads_kv * math.ceil(rows / plan.config.tile_m)


def ctas_per_split(plan, s_q: int) -> int:
    """Decode CTAs per (batch entry, split) in split mode: sparse queries are sequences."""
    return lanes(plan, s_q) * (s_q if plan.sparse else 1)


def num_parts(plan, s_q: int, sms: int, ctas_per_sm: int) -> int:
    """Parts of a balanced launch: as many as fill the SMs once, lanes CTAs each."""
    return max(1, sms * max(ctas_per_sm, 1) // lanes(plan, s_q))


def whole_slack_tiles(plan, s_q: int) -> int:
    """whole_parts' slack in tiles for a launch at s_q (core/work.cuh whole_slack_tiles): the
    plan's whole_slack_tiles where the rows a sequence (s_q x group; sparse: the group) reach
    its whole_tight_rows (the launch is compute-bound), else -1."""
    rows = plan.group * (1 if plan.sparse else s_q)
    return plan.config.whole_slack_tiles if rows >= plan.config.whole_tight_rows else -1


def line_lengths(tiles, piece_cost: int = 0) -> list[int]:
    """Each sequence's length on part mode's line (core/schedule.cuh line_length): its tiles and,
    where it has some, a piece's cost (the plan's piece_cost_tiles)."""
    return [n + piece_cost if n > 0 else 0 for n in tiles]


def whole_parts(tiles, parts: int, slack_tiles: int = -1, piece_cost: int = 0) -> tuple[list[int], bool]:
    """Whole-sequence parts as the kernels decide them on the device from the lengths
    (core/schedule.cuh; tests/test_schedule.py holds the two to each other): each cut p T / P
    of the line (line_lengths) moved back to the start of the sequence it falls in. The parts'
    bounds (P + 1 line positions) and whether a launch takes them: some tiles, and the longest
    part at most 1 + 1 / WHOLE_SLACK of T / P and, with slack_tiles >= 0 (whole_slack_tiles),
    at most that many over it."""
    line = line_lengths(tiles, piece_cost)
    total = sum(line)
    starts, base = [], 0
    for n in line:
        starts += [base] * sum(1 for p in range(parts) if base <= p * total // parts < base + n)
        base += n
    bounds = (starts or [0] * parts) + [total]  # no tiles: every part empty, the last holds all
    longest = max(b - a for a, b in zip(bounds, bounds[1:]))
    return bounds, (total > 0 and longest * parts * WHOLE_SLACK <= total * (WHOLE_SLACK + 1)
                    and (slack_tiles < 0 or longest * parts <= total + slack_tiles * parts))


def num_splits(plan, batch: int, s_q: int, kv_tokens: int, sms: int) -> int:
    """Split-KV count: enough CTAs to fill the SMs when batch x heads x row tiles does
    not, never so many that a split holds fewer than MIN_TOKENS_PER_SPLIT tokens, and none
    where the unsplit grid already holds FULL_WAVE of the CTA slots (ctas_per_sm per SM)."""
    if plan.split_kv == "off":
        return 1
    tile_n = plan.config.tile_n
    tiles = max(1, math.ceil(kv_tokens / tile_n))
    if isinstance(plan.split_kv, int):
        return max(1, min(plan.split_kv, tiles))
    units = batch * (s_q if plan.sparse else 1) * lanes(plan, s_q)
    if units >= FULL_WAVE * sms * plan.ctas_per_sm:
        # one wave that nearly fills every slot: a second split would add a second wave
        # (measured, MQA-256 at 1 CTA per SM, b=128: 128 CTAs 252.5 us, 2 splits 262.8 us)
        return 1
    most = max(1, kv_tokens // max(tile_n, MIN_TOKENS_PER_SPLIT))
    return max(1, min(most, math.ceil(sms / max(units, 1))))


def launch_schedule(plan, batch: int, s_q: int, kv_tokens: int, requested: int, sms: int,
                    ctas_per_sm: int) -> tuple[int, int]:
    """(num_splits, num_parts) of a launch from shapes alone (no host sync, CUDA-graph safe).
    requested: the op's num_splits argument, 0 (choose), n >= 1 (n splits per sequence) or
    -p (p balanced parts)."""
    if requested < 0:
        return 1, -requested
    if requested > 0:
        return requested, 0
    if balanced(plan):
        return 1, num_parts(plan, s_q, sms, ctas_per_sm)
    return num_splits(plan, batch, s_q, kv_tokens, sms), 0


def metadata(plan, seqlens, s_q: int, sms: int, ctas_per_sm: int,
             max_seqlen: int | None = None) -> DecodeMetadata:
    """`k.plan(seqlens)`: one decode step's schedule, shared by its layers, from shapes alone:
    it reads no length (no host sync; a CUDA graph can hold it). Balanced plans keep 0 (parts
    chosen at launch). A split plan takes its split count from `max_seqlen` when the caller
    knows it (engines do, on the host); without it, balanced parts: the kernels then spread
    the step's tiles from the lengths on the device. longest: topk, max_seqlen or None. Made
    for s_q query tokens a sequence (DecodeMetadata.for_sq)."""
    batch = len(seqlens)
    if plan.sparse:
        if balanced(plan):
            return DecodeMetadata(0, plan.topk, s_q=s_q)
        return DecodeMetadata(num_splits(plan, batch, s_q, plan.topk, sms), plan.topk, s_q=s_q)
    if batch == 0:
        return DecodeMetadata(1, 0, s_q=s_q)
    if balanced(plan):
        return DecodeMetadata(0, max_seqlen, s_q=s_q)
    if max_seqlen is not None:
        return DecodeMetadata(num_splits(plan, batch, s_q, max_seqlen, sms), max_seqlen, s_q=s_q)
    return DecodeMetadata(-num_parts(plan, s_q, sms, ctas_per_sm), None, s_q=s_q)


def workspace_shapes(plan, batch: int, s_q: int, splits: int, parts: int):
    """(partial_out, partial_lse) shapes of a launch (abi.h), or None when it needs none.
    Part mode: only a part's first and last pieces can be partial, so 2 slots per part; the
    partial lse is followed by the slots' ready words, one per lane, and the word that says
    whether the parts hold whole sequences (core/ready.cuh), in one flat float32 allocation."""
    if not (splits > 1 or parts):
        return None
    if parts:
        rows = 2 * parts * s_q * plan.heads_q
        return ((2 * parts, 1, s_q, plan.heads_q, plan.d_v), (rows + 2 * parts * lanes(plan, s_q) + 1,))
    return ((splits, batch, s_q, plan.heads_q, plan.d_v), (splits, batch, s_q, plan.heads_q))


def workspace_bytes(plan, batch: int, s_q: int, splits: int, parts: int) -> int:
    shapes = workspace_shapes(plan, batch, s_q, splits, parts)
    return 0 if shapes is None else 4 * sum(math.prod(s) for s in shapes)
