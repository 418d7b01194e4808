"""Ground-truth decode attention for any checked spec, in plain torch (float32 or
float64), on any device. Written for clarity, not speed: one sequence at a time."""
from __future__ import annotations

import torch

from . import storage
from .ir import Spec


def dense_slots(spec: Spec, block_table: torch.Tensor, seqlen: int) -> torch.Tensor:
    """Cache slots (page * P + offset) of positions 0..seqlen-1 of one sequence."""
    positions = torch.arange(seqlen, device=block_table.device)
    pages = block_table[positions // spec.page_size].long()
    return pages * spec.page_size + positions % spec.page_size


def keys_values(spec: Spec, cache, slots: torch.Tensor, dtype=torch.float32,
                dequant_dtype=None):
    """K [n, heads_kv, d_k] and V [n, heads_kv, d_v] of the given slots, dequantized
    (fp8 × scale rounded to dequant_dtype when given)."""
    segments = storage.read(spec, cache, slots, dtype, dequant_dtype)
    return storage.assemble(spec, segments, spec.key), storage.assemble(spec, segments, spec.value)


def attend(spec: Spec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           visible: torch.Tensor, scale: float):
    """softmax(scale · q kᵀ) v over the visible tokens.

    q [s, h_q, d_k]; k [n, heads_kv, d_k]; v [n, heads_kv, d_v]; visible [s, n] bool.
    Returns out [s, h_q, d_v] and lse [h_q, s] (natural log); a query that sees no
    token gets out 0 and lse -inf."""
    kv_head = torch.arange(spec.heads_q, device=q.device) // spec.group
    k, v = k[:, kv_head], v[:, kv_head]  # one row per query head
    scores = torch.einsum("shd,nhd->hsn", q, k) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    probs = torch.where(torch.isfinite(lse)[..., None], probs, torch.zeros_like(probs))
    return torch.einsum("hsn,nhd->shd", probs, v), lse


def attention(spec: Spec, q: torch.Tensor, cache, block_table=None, seqlens=None,
              indices=None, scale: float | None = None, dtype=torch.float32,
              dequant_dtype=None):
    """Decode attention of DESIGN.md §3. q [b, s_q, h_q, d_k]; dense specs take
    block_table [b, max_pages] and seqlens [b]; sparse specs take indices [b, s_q, topk]
    (-1 = none). Returns out [b, s_q, h_q, d_v] and lse [b, h_q, s_q], both in `dtype`.
    dequant_dtype rounds fp8 × scale to a 16-bit dtype first, as the kernels stage it."""
    scale = spec.softmax_scale if scale is None else float(scale)
    batch, s_q = q.shape[:2]
    q = q.to(dtype)
    out = torch.zeros(batch, s_q, spec.heads_q, spec.d_v, dtype=dtype, device=q.device)
    lse = torch.full((batch, spec.heads_q, s_q), float("-inf"), dtype=dtype, device=q.device)
    for b in range(batch):
        if spec.sparse:
            for t in range(s_q):  # each query token has its own token set
                slots = indices[b, t][indices[b, t] >= 0]
                k, v = keys_values(spec, cache, slots, dtype, dequant_dtype)
                visible = torch.ones(1, len(slots), dtype=torch.bool, device=q.device)
                out[b, t:t + 1], lse[b, :, t:t + 1] = attend(spec, q[b, t:t + 1], k, v, visible, scale)
            continue
        seqlen = int(seqlens[b])
        k, v = keys_values(spec, cache, dense_slots(spec, block_table[b], seqlen), dtype,
                           dequant_dtype)
        positions = torch.arange(seqlen, device=q.device)
        visible = torch.ones(s_q, seqlen, dtype=torch.bool, device=q.device)
        if spec.causal:  # query token t sees positions < seqlen - s_q + t + 1
            limit = seqlen - s_q + 1 + torch.arange(s_q, device=q.device)
            visible = positions[None, :] < limit[:, None]
        out[b], lse[b] = attend(spec, q[b], k, v, visible, scale)
    return out, lse
