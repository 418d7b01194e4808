"""Argument validation for a call of a compiled spec: every mistake is reported with the
argument's name and what was expected, before anything runs."""
from __future__ import annotations

import math
import operator

import torch

from . import storage
from .ir import Spec


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"


def _expect_tensor(name: str, t, shape, dtype: torch.dtype, device) -> None:
    """shape: a tuple of ints and None (any size). Messages are formatted only on failure:
    under torch.compile the sizes are symbolic, and formatting one is a graph break."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {_describe(t)}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {str(dtype).removeprefix('torch.')}, "
                        f"got {_describe(t)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (where q is), got {_describe(t)}")


def softmax_scale(scale) -> float:
    """The call-time softmax scale: a positive finite number, as the spec's `scale` must be
    (the kernels take the row max of raw scores and scale it afterwards)."""
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale: expected a positive finite number, got {scale!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"scale: expected a positive finite number, got {value!r}")
    return value


ROW_ALIGN = 16   # the kernels copy a token's values in 16-byte chunks
SCALE_ALIGN = 4  # and fp32 scales one at a time


def cache_strides(label: str, t: torch.Tensor, align: int) -> None:
    """A cache view: any page, token and head strides, the innermost dimension contiguous and
    every row it holds `align`-byte aligned. (A contiguous tensor is the spec's own layout.)"""
    if t.is_contiguous():
        return
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{label}: expected the innermost dimension contiguous (stride 1), got "
                         f"strides {tuple(t.stride())}")
    size = t.element_size()
    row_strides = [s * size for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1]
    offset = t.storage_offset() * size
    if any(s % align for s in row_strides) or offset % align:
        raise ValueError(f"{label}: expected {align}-byte aligned rows, got strides "
                         f"{tuple(s * size for s in t.stride())} bytes at byte offset {offset} of its "
                         "storage")


def cache_pages(spec: Spec, cache, device=None) -> int:
    """Validate the cache's tensors against the spec; returns the number of pages."""
    if spec.separate:
        if not isinstance(cache, dict):
            raise TypeError(f"cache: spec `{spec.name}` stores segments separately: expected "
                            f"a dict of tensors, got {type(cache).__name__}")
        want = storage.tensor_layouts(spec, 1)
        if set(cache) != set(want):
            raise ValueError(f"cache: expected tensors {sorted(want)}, got {sorted(cache)}")
    elif not isinstance(cache, torch.Tensor):
        raise TypeError(f"cache: spec `{spec.name}` is packed: expected one tensor, got "
                        f"{type(cache).__name__}")
    tensors = storage.cache_tensors(cache)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            label = "cache" if not spec.separate else f"cache[{name!r}]"
            raise TypeError(f"{label}: expected a torch.Tensor, got {type(t).__name__}")
    first = next(iter(tensors.values()))
    pages = first.shape[0] if first.dim() else 0
    for name, (shape, dtype) in storage.tensor_layouts(spec, pages).items():
        label = "cache" if not spec.separate else f"cache[{name!r}]"
        view = storage.canonical(spec, name, tensors[name])
        _expect_tensor(label, view, shape, dtype, device)
        cache_strides(label, view, SCALE_ALIGN if dtype == torch.float32 else ROW_ALIGN)
    if pages < 1:
        raise ValueError("cache: expected at least one page")
    return pages


def call_arguments(spec: Spec, q, cache, block_table, seqlens, indices,
                   check_values: bool = True) -> None:
    """Check shapes, dtypes and devices; with check_values also the contents that would
    make the kernel read out of bounds (read back from the device in one copy: a host sync;
    the caller asks for it on CPU tensors and with ATTNCC_CHECK=1, never under capture or
    compilation; the CUDA kernels check the same values themselves, devicecheck.py)."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    elem = storage.torch_dtype(spec.elem)
    _expect_tensor("q", q, (None, None, spec.heads_q, spec.d_k), elem, None)
    batch, s_q = q.shape[:2]
    if not 1 <= s_q <= spec.max_query_len:
        raise ValueError(f"q: expected 1 <= s_q <= {spec.max_query_len} (the spec's "
                         f"`query len`), got s_q = {s_q}")
    pages = cache_pages(spec, cache, q.device)
    slots = pages * spec.page_size
    if spec.sparse:
        if block_table is not None:
            raise TypeError(f"block_table: spec `{spec.name}` is sparse (`tokens topk`); it "
                            "reads the slots named by `indices`, pass block_table=None")
        if indices is None:
            raise TypeError(f"indices: spec `{spec.name}` is sparse: expected indices "
                            f"[{batch}, {s_q}, {spec.topk}] int32")
        _expect_tensor("indices", indices, (batch, s_q, spec.topk), torch.int32, q.device)
        if seqlens is not None:
            _expect_tensor("seqlens", seqlens, (batch,), torch.int32, q.device)
        if check_values and indices.numel():
            low, high = _read_back(indices.min(), indices.max())
            if low < -1 or high >= slots:
                raise ValueError(f"indices: expected slots in [0, {slots}) or -1, got values "
                                 f"in [{low}, {high}]")
        return
    if indices is not None:
        raise TypeError(f"indices: spec `{spec.name}` is dense; indices are for `tokens topk` specs")
    if block_table is None or seqlens is None:
        missing = "block_table" if block_table is None else "seqlens"
        raise TypeError(f"{missing}: required for dense spec `{spec.name}`")
    _expect_tensor("block_table", block_table, (batch, None), torch.int32, q.device)
    _expect_tensor("seqlens", seqlens, (batch,), torch.int32, q.device)
    if block_table.shape[1] * spec.page_size >= 2 ** 31:
        raise ValueError(f"block_table: {block_table.shape[1]} pages of {spec.page_size} tokens a "
                         "sequence: the kernels count positions in 32-bit integers (at most 2^31 - 1)")
    if not check_values or batch == 0:
        return
    used_pages = (seqlens.long().clamp(min=0) + spec.page_size - 1) // spec.page_size
    columns = torch.arange(block_table.shape[1], device=q.device)
    bad = (columns[None, :] < used_pages[:, None]) & ((block_table < 0) | (block_table >= pages))
    no_entry = bad.numel()  # the flat index of the first bad entry, or this when none is
    first_bad = torch.where(bad.flatten(), torch.arange(no_entry, device=q.device), no_entry).min() \
        if no_entry else torch.zeros((), dtype=torch.long, device=q.device)
    shortest, longest, first_bad = _read_back(seqlens.min(), seqlens.max(), first_bad)
    if shortest < 0:
        raise ValueError(f"seqlens: expected lengths >= 0, got {shortest}")
    capacity = block_table.shape[1] * spec.page_size
    if longest > capacity:
        raise ValueError(f"block_table: {block_table.shape[1]} pages of {spec.page_size} hold "
                         f"{capacity} tokens, but seqlens has a sequence of {longest}")
    if first_bad < no_entry:
        b, col = divmod(first_bad, block_table.shape[1])
        raise ValueError(f"block_table: entry [{b}, {col}] = {int(block_table[b, col])} is not "
                         f"a page of the cache (0..{pages - 1})")


def outputs(spec: Spec, q: torch.Tensor, out, lse) -> None:
    """Preallocated outputs (`out=`, `lse=`): shape, dtype, device, and rows the kernels can
    write (contiguous, 16-byte aligned)."""
    batch, s_q = q.shape[:2]
    for name, t, shape, dtype in (("out", out, (batch, s_q, spec.heads_q, spec.d_v), q.dtype),
                                  ("lse", lse, (batch, spec.heads_q, s_q), torch.float32)):
        if t is None:
            continue
        _expect_tensor(name, t, shape, dtype, q.device)
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (the kernels write whole rows), "
                             f"got strides {t.stride()}")
        if t.device.type == "cuda" and t.data_ptr() % 16:
            raise ValueError(f"{name}: expected a 16-byte aligned tensor (a view at element offset "
                             f"{t.storage_offset()} is not)")


def num_splits(value) -> int:
    """The call's `num_splits=`: None (choose) or a positive int."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"num_splits: expected a positive int (splits per sequence) or None, got {value!r}")
    return value


def query_len(value, max_sq: int) -> int:
    """k.plan's `s_q=` (query tokens a sequence): an int of any kind (numpy's, a 0-d tensor's),
    not a bool, within the spec's 1..max_sq."""
    try:
        s_q = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        s_q = None
    if s_q is None or not 1 <= s_q <= max_sq:
        raise ValueError(f"s_q: {value!r} query tokens a sequence; the spec takes 1..{max_sq}")
    return s_q


def _read_back(*scalars: torch.Tensor) -> list[int]:
    """Device scalars to Python ints in one copy: one host sync per call, not one each."""
    return torch.stack([x.long() for x in scalars]).tolist()


def write_arguments(spec: Spec, cache, slots, values: dict) -> int:
    """Check write_cache's arguments from metadata alone; returns the cache's slot count (the
    slots' values are checked where they are used: storage.write skips what is out of range)."""
    pages = cache_pages(spec, cache)
    device = next(iter(storage.cache_tensors(cache).values())).device
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype.is_floating_point \
            or slots.dtype == torch.bool:
        raise TypeError("slots: expected a 1-D integer tensor of page * P + offset")
    if slots.device != device:
        raise ValueError(f"slots: expected a tensor on {device} (where the cache is), got {slots.device}")
    unknown = sorted(set(values) - {s.name for s in spec.segments})
    if unknown:
        raise TypeError(f"write_cache: unknown segment(s) {unknown}; spec `{spec.name}` has "
                        f"{[s.name for s in spec.segments]}")
    missing = [s.name for s in spec.segments if s.name not in values]
    if missing:
        raise TypeError(f"write_cache: missing segment(s) {missing}: every segment of a "
                        "token's record is written together")
    n = slots.shape[0]
    for seg in spec.segments:
        t = values[seg.name]
        shape = (n, seg.dim) if seg.shared else (n, spec.heads_kv, seg.dim)
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{seg.name}: expected a floating-point tensor of shape {list(shape)}")
        _expect_tensor(seg.name, t, shape, t.dtype, device)
    return pages * spec.page_size


def slot_values(slots: torch.Tensor, num_slots: int) -> None:
    """Synchronous check of write_cache's slots (CPU, or ATTNCC_CHECK=1)."""
    bad = (slots < -1) | (slots >= num_slots)
    if bool(bad.any()):
        wrong = slots[bad]
        raise ValueError(f"slots: expected values in [0, {num_slots}) or -1 (skipped), got values in "
                         f"[{int(wrong.min())}, {int(wrong.max())}]")
