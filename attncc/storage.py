"""The cache as torch tensors (DESIGN.md §2 "Storage"): allocation, writing (with fp8
quantization) and reading back (dequantized). Packed caches are handled as raw record
bytes, so one code path serves every dtype mix.

A cache tensor may be a view (DESIGN.md §3a): any page, token and head strides, the innermost
dimension contiguous. Tokens are addressed by (page, offset), never by flattening, so every
view reads and writes where the engine's buffer holds it. A packed cache may carry a
singleton head axis ([pages, P, 1, record], FlashMLA's), and a per-head segment of one kv
head may leave its head axis out ([pages, P, dim], FlashInfer's ckv and kpe)."""
from __future__ import annotations

import torch

from .ir import SCALE_BYTES, Segment, Spec

PACKED_NAME = "cache"


def torch_dtype(dtype) -> torch.dtype:
    return getattr(torch, dtype.torch_name)


def tensor_layouts(spec: Spec, num_pages: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name → (shape, dtype) of every cache tensor the spec stores."""
    P = spec.page_size
    if not spec.separate:
        dtype = spec.packed_dtype
        if dtype is None:
            return {PACKED_NAME: ((num_pages, P, spec.record_bytes), torch.uint8)}
        return {PACKED_NAME: ((num_pages, P, spec.record_bytes // dtype.bytes), torch_dtype(dtype))}
    layouts = {}
    for seg in spec.segments:
        heads = () if seg.shared else (seg.copies,)
        layouts[seg.name] = ((num_pages, P, *heads, seg.dim), torch_dtype(seg.dtype))
        if seg.scale_group:
            layouts[seg.scale_tensor] = ((num_pages, P, *heads, seg.scales_per_copy), torch.float32)
    return layouts


def new_cache(spec: Spec, num_pages: int, device="cuda"):
    """Zero-filled cache: one tensor (packed) or a dict of tensors (separate)."""
    if num_pages < 1:
        raise ValueError(f"num_pages must be at least 1, got {num_pages}")
    tensors = {name: torch.zeros(shape, dtype=dtype, device=device)
               for name, (shape, dtype) in tensor_layouts(spec, num_pages).items()}
    return tensors if spec.separate else tensors[PACKED_NAME]


def cache_tensors(cache) -> dict[str, torch.Tensor]:
    return cache if isinstance(cache, dict) else {PACKED_NAME: cache}


def num_pages(cache) -> int:
    return next(iter(cache_tensors(cache).values())).shape[0]


def canonical(spec: Spec, name: str, t: torch.Tensor) -> torch.Tensor:
    """A cache tensor viewed in the shape tensor_layouts gives (a view, no copy): a packed
    [pages, P, 1, record] loses its singleton axis, a one-head segment [pages, P, dim] gains it."""
    want = len(tensor_layouts(spec, 1)[name][0])
    if t.dim() == want + 1 and t.dim() >= 3 and t.shape[2] == 1 and not spec.separate:
        return t.squeeze(2)
    if t.dim() == want - 1 and spec.separate and spec.heads_kv == 1 and want == 4:
        return t.unsqueeze(2)
    return t


def _tensors(spec: Spec, cache) -> dict[str, torch.Tensor]:
    return {name: canonical(spec, name, t) for name, t in cache_tensors(cache).items()}


def _record_bytes(spec: Spec, cache: torch.Tensor) -> torch.Tensor:
    """Packed cache as a [pages, P, record_bytes] uint8 view sharing its storage."""
    return canonical(spec, PACKED_NAME, cache).view(torch.uint8)


def _at(slots: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot -> (page, offset in the page): the index of a token in any view of the cache."""
    return slots // page_size, slots % page_size


def quantize(values: torch.Tensor, segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values and their fp32 scales, one per `scale_group` values: scale = amax / max_finite."""
    groups = values.float().unflatten(-1, (segment.scales_per_copy, segment.scale_group))
    amax = groups.abs().amax(-1, keepdim=True)
    top = segment.dtype.max_finite
    # a tensor divisor, not a Python float: CUDA divides by a scalar as a multiply by its
    # reciprocal, which can round the scale one ulp away from the CPU's (and the contract's)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, top), torch.ones_like(amax))
    quantized = (groups / scale).clamp(-top, top).to(torch_dtype(segment.dtype))
    return quantized.flatten(-2), scale.squeeze(-1)


def _encode(segment: Segment, values: torch.Tensor):
    """Values [n, copies, dim] → (stored values, scales or None) in the segment's dtype."""
    if segment.scale_group:
        return quantize(values, segment)
    return values.to(torch_dtype(segment.dtype)), None


def write(spec: Spec, cache, slots: torch.Tensor, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """Store every segment's values [n, copies, dim] at the given token slots. A slot outside
    [0, num_pages * P) (-1 is how engines pad) is skipped. Returns the mask of the slots
    written. Reads no value on the host: no sync, so it can be captured in a CUDA graph."""
    slots = slots.long()
    valid = (slots >= 0) & (slots < num_pages(cache) * spec.page_size)
    if slots.numel() == 0:
        return valid
    # A skipped entry writes again what another entry writes: the first valid entry's row to
    # its slot or, when none is valid, slot 0's own content back to slot 0. Duplicate indices
    # with identical values give one result, whatever order the scatter takes.
    # (indices are 1-element tensors, never 0-dim ones: indexing with a 0-dim tensor reads it)
    first = torch.argmax(valid.int()).view(1)
    anything = valid.any()
    fallback = torch.where(anything, slots.index_select(0, first), 0)
    index = torch.where(valid, slots, fallback)

    P = spec.page_size
    at, fallback_at = _at(index, P), _at(fallback, P)

    def put(target: torch.Tensor, rows: torch.Tensor) -> None:  # target[slots] = rows, masked
        again = torch.where(anything, rows.index_select(0, first), target[fallback_at].to(rows.dtype))
        keep = valid.view(-1, *([1] * (rows.dim() - 1)))
        target.index_put_(at, torch.where(keep, rows, again))

    tensors = _tensors(spec, cache) if spec.separate else None
    for seg in spec.segments:
        stored, scales = _encode(seg, values[seg.name])
        if spec.separate:
            # a shared segment's tensor has no head axis: drop the single copy
            put(tensors[seg.name], stored.squeeze(1) if seg.shared else stored)
            if scales is not None:
                put(tensors[seg.scale_tensor], scales.squeeze(1) if seg.shared else scales)
            continue
        record = [stored.contiguous().view(torch.uint8)]
        if scales is not None:
            record.append(scales.contiguous().view(torch.uint8))
        copy_bytes = torch.cat(record, dim=-1)  # [n, copies, values + scales]
        assert copy_bytes.shape[-1] == seg.copy_bytes
        put(_record_bytes(spec, cache)[:, :, seg.offset: seg.offset + seg.bytes], copy_bytes.flatten(1))
    return valid


def read(spec: Spec, cache, slots: torch.Tensor, dtype=torch.float32,
         dequant_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every segment at the given slots, dequantized: name → [n, copies, dim].
    With dequant_dtype, fp8 values × scale are rounded to it (as a kernel that stages
    dequantized values in 16-bit shared memory computes)."""
    at = _at(slots.long(), spec.page_size)
    n = len(slots)
    out = {}
    tensors = _tensors(spec, cache) if spec.separate else None
    for seg in spec.segments:
        if spec.separate:
            values = tensors[seg.name][at].to(dtype)
            values = values.view(n, seg.copies, seg.dim)
            if seg.scale_group:
                scales = tensors[seg.scale_tensor][at].to(dtype)
                values = values * scales.view(n, seg.copies, seg.scales_per_copy).repeat_interleave(
                    seg.scale_group, dim=-1)
                values = _round(values, dequant_dtype)
            out[seg.name] = values
            continue
        raw = _record_bytes(spec, cache)[at][:, seg.offset: seg.offset + seg.bytes]
        raw = raw.view(n, seg.copies, seg.copy_bytes)
        values = raw[..., : seg.values_bytes].contiguous().view(torch_dtype(seg.dtype)).to(dtype)
        if seg.scale_group:
            # a copy, not .contiguous(): the slice may be contiguous at an offset fp32 can't view
            scales = raw[..., seg.values_bytes:].clone(memory_format=torch.contiguous_format)
            scales = scales.view(torch.float32).to(dtype)
            assert scales.shape[-1] * SCALE_BYTES == seg.copy_bytes - seg.values_bytes
            values = _round(values * scales.repeat_interleave(seg.scale_group, dim=-1), dequant_dtype)
        out[seg.name] = values
    return out


def _round(values: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return values if dtype is None else values.to(dtype).to(values.dtype)


def assemble(spec: Spec, segments: dict[str, torch.Tensor], which) -> torch.Tensor:
    """Key or value rows [n, heads_kv, width] from decoded segments: concatenated slices,
    a shared segment broadcast to every kv head."""
    parts = []
    for piece in which:
        values = segments[piece.segment][..., piece.lo: piece.hi]
        parts.append(values.expand(-1, spec.heads_kv, -1))
    return torch.cat(parts, dim=-1)
