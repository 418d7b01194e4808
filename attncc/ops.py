"""Built kernels as torch ops: `torch.ops.attncc.<name>_<hash>` with a fake (meta)
implementation, the reference on CPU and the built library on CUDA. The torch side of
a launch lives here; the library only sees pointers, sizes and a stream (abi.h)."""
from __future__ import annotations

from functools import cache, lru_cache, partial
from typing import NamedTuple, Optional

import torch

from . import devicecheck, launcher, reference, split, storage, validate
from .abi import MAX_SEGMENTS, SCHEDULE_LINE_BYTES, VALUE_DTYPES, AttnccArgs, AttnccWriteArgs, Library
from .cache import build
from .ir import Spec
from .lower import Plan


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _aligned(name: str, t: torch.Tensor) -> torch.Tensor:
    """The kernel moves 16-byte chunks: a view starting mid-chunk cannot be read."""
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned tensor (a view at element "
                         f"offset {t.storage_offset()} is not); pass a copy")
    return t


def _cache_view(spec: Spec, plan: Plan, i: int, t: torch.Tensor) -> torch.Tensor:
    """Cache tensor i in the plan's canonical shape ([pages, P(, heads), dim], a view: any page,
    token and head strides), checked for what the kernels' copies need (validate.py's rule:
    16-byte rows, 4 for fp32 scales)."""
    name = plan.layout.tensors[i].name
    view = storage.canonical(spec, name, t)
    align = validate.SCALE_ALIGN if view.dtype == torch.float32 else validate.ROW_ALIGN
    validate.cache_strides(f"cache tensor {i} (`{name}`)", view, align)
    if view.data_ptr() % align:
        raise ValueError(f"cache tensor {i} (`{name}`): expected a {align}-byte aligned view (one "
                         f"at element offset {t.storage_offset()} is not); pass a copy")
    return view


def _strides(view: torch.Tensor, head_axis: bool) -> tuple[int, int, int]:
    """(page, token, head) strides of a canonical cache view, in bytes (32-bit in AttnccArgs)."""
    size = view.element_size()
    strides = (view.stride(0) * size, view.stride(1) * size, view.stride(2) * size if head_axis else 0)
    if max(strides) >= 2 ** 31:
        raise ValueError(f"cache: a stride of {max(strides)} bytes (strides {tuple(view.stride())}); the "
                         "kernels take page, token and head strides below 2^31 bytes")
    return strides


class Prepared(NamedTuple):
    """A launch's AttnccArgs but its pointers, scale and stream, and the shapes of what it
    allocates: a function of the call's shapes, strides, dtypes and device alone, so the
    compiled launcher (csrc/launcher.cpp) keeps one per signature of its arguments."""

    batch: int
    s_q: int
    num_splits: int
    num_parts: int
    num_pages: int
    page_stride: tuple[int, ...]   # bytes, per cache tensor
    token_stride: tuple[int, ...]
    head_stride: tuple[int, ...]
    block_table_stride: int        # elements
    block_table_cols: int
    flags: int                     # the device flag word's address, or 0
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]
    workspace: Optional[tuple]     # (partial_out, partial_lse) shapes, or None


def prepare(plan: Plan, library: Library, q, views, block_table, requested: int, flags) -> Prepared:
    """Prepare a launch of checked arguments: q contiguous, views the canonical cache views
    (_cache_view), block_table rows with contiguous entries; requested the op's num_splits."""
    batch, s_q = q.shape[:2]
    splits, parts = _schedule(plan, library, batch, s_q, block_table, requested, q.device.index or 0) \
        if batch else (1, 0)
    strides = [_strides(t, tp.head_axis) for t, tp in zip(views, plan.layout.tensors)]
    return Prepared(
        batch, s_q, splits, parts, views[0].shape[0], *(tuple(s[j] for s in strides) for j in range(3)),
        block_table.stride(0) if block_table is not None else 0,
        block_table.shape[1] if block_table is not None else 0,
        _ptr(flags) or 0, (batch, s_q, plan.heads_q, plan.d_v), (batch, plan.heads_q, s_q),
        split.workspace_shapes(plan, batch, s_q, splits, parts))


def pack(p: Prepared, q, out, lse, views, block_table, seqlens, indices, partial_out, partial_lse,
         scale: float, stream: int, schedule=None) -> AttnccArgs:
    """The AttnccArgs of a prepared launch (the compiled launcher fills the same fields)."""
    args = AttnccArgs()
    args.q, args.out, args.lse = q.data_ptr(), out.data_ptr(), lse.data_ptr()
    for i, t in enumerate(views):
        args.tensors[i] = t.data_ptr()
        args.page_stride[i], args.token_stride[i], args.head_stride[i] = \
            p.page_stride[i], p.token_stride[i], p.head_stride[i]
    args.num_pages = p.num_pages
    args.block_table = _ptr(block_table)
    args.block_table_stride, args.block_table_cols = p.block_table_stride, p.block_table_cols
    args.flags = p.flags  # 0: none (a null c_void_p)
    args.seqlens, args.indices = _ptr(seqlens), _ptr(indices)
    args.partial_out, args.partial_lse = _ptr(partial_out), _ptr(partial_lse)
    args.batch, args.s_q, args.num_splits, args.num_parts = p.batch, p.s_q, p.num_splits, p.num_parts
    args.schedule = _ptr(schedule) if p.num_parts else None
    args.softmax_scale = scale
    args.stream = stream
    return args


def cuda_forward(spec: Spec, plan: Plan, library: Library, q, cache, block_table, seqlens, indices,
                 scale: float, splits: int = 0, out=None, lse=None, flags=None, schedule=None):
    """One launch (the Python path); writes into out and lse when given (checked by the
    caller), else new ones. flags: the device word the kernels' value checks report into
    (devicecheck.py), or None; schedule: the step's parts' lines (k.plan's, split mode ignores
    them), or None."""
    scale = validate.softmax_scale(scale)  # the op may be called without the Kernel
    q = _aligned("q", q.contiguous())
    views = [_cache_view(spec, plan, i, t) for i, t in enumerate(cache)]
    if block_table is not None and block_table.stride(-1) != 1:
        block_table = block_table.contiguous()  # rows may be strided, entries may not
    seqlens = None if seqlens is None else seqlens.contiguous()
    indices = None if indices is None else indices.contiguous()
    p = prepare(plan, library, q, views, block_table, splits, flags)
    if out is None:
        out = torch.empty(p.out_shape, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(p.lse_shape, dtype=torch.float32, device=q.device)
    if p.batch == 0:
        return out, lse
    partial_out = partial_lse = None
    if p.workspace is not None:
        partial_out = torch.empty(p.workspace[0], dtype=torch.float32, device=q.device)
        partial_lse = torch.empty(p.workspace[1], dtype=torch.float32, device=q.device)
    args = pack(p, q, out, lse, views, block_table, seqlens, indices, partial_out, partial_lse, scale,
                torch.cuda.current_stream(q.device).cuda_stream, schedule)
    _on(q.device, library.launch, args)
    return out, lse


def _on(device: torch.device, launch, args) -> None:
    """launch(args) with `device` current (the common case: it is, no device switch on the hot path)."""
    if device.index == torch.cuda.current_device():
        launch(args)
    else:
        with torch.cuda.device(device):
            launch(args)


def _value_dtype(t: torch.Tensor) -> Optional[int]:
    """AttnccWriteArgs.value_dtype of a values tensor, or None for a dtype the kernel does not read."""
    return VALUE_DTYPES.get(str(t.dtype).removeprefix("torch."))


def kernel_writes(spec: Spec) -> bool:
    """Whether write_cache's kernel takes the spec's records: at most MAX_SEGMENTS segments (abi.h;
    more are written by torch ops). The one place of that rule: the Python path and the compiled
    launcher both ask it."""
    return len(spec.segments) <= MAX_SEGMENTS


def writes_on_device(spec: Spec, values: dict[str, torch.Tensor]) -> bool:
    """Whether write_cache's kernel takes these values: kernel_writes(spec), each value in fp32,
    bf16 or fp16 (another dtype is written by torch ops, which round it as the contract does)."""
    return kernel_writes(spec) and all(_value_dtype(t) is not None for t in values.values())


class PreparedWrite(NamedTuple):
    """write_cache's AttnccWriteArgs but its pointers and stream: a function of the call's
    shapes, strides, dtypes and device alone, so the compiled launcher (launcher.cpp) remembers
    it per signature."""
    num_pages: int
    page_stride: list[int]
    token_stride: list[int]
    head_stride: list[int]
    slots_are_64bit: int
    n: int
    value_dtype: list[int]             # per segment in spec order
    value_token_stride: list[int]
    value_head_stride: list[int]
    flags: int                         # the device's flag word, 0 for none


def _write_fields(spec: Spec, plan: Plan, cache, slots, values: dict[str, torch.Tensor], flags) -> PreparedWrite:
    """PreparedWrite of a call whose slots (int32 or int64, contiguous) and values (last dim
    contiguous, a dtype the kernel reads) the kernel takes as they are."""
    views = [_cache_view(spec, plan, i, t) for i, t in enumerate(cache_list(spec, cache))]
    strides = [_strides(t, plan.layout.tensors[i].head_axis) for i, t in enumerate(views)]
    ordered = [values[seg.name] for seg in spec.segments]
    return PreparedWrite(
        num_pages=views[0].shape[0], page_stride=[s[0] for s in strides], token_stride=[s[1] for s in strides],
        head_stride=[s[2] for s in strides], slots_are_64bit=int(slots.dtype == torch.int64), n=slots.shape[0],
        value_dtype=[_value_dtype(t) for t in ordered], value_token_stride=[t.stride(0) for t in ordered],
        value_head_stride=[0 if seg.shared else t.stride(1) for seg, t in zip(spec.segments, ordered)],
        flags=_ptr(flags) or 0)


def _write_ready(slots: torch.Tensor, values: dict[str, torch.Tensor]) -> bool:
    """Whether the kernel reads slots and values as they are (else pack_write copies them)."""
    return slots.dtype in (torch.int32, torch.int64) and slots.is_contiguous() \
        and all(t.stride(-1) == 1 for t in values.values())


def prepare_write(spec: Spec, plan: Plan, flags: devicecheck.DeviceFlags, cache, slots, values) -> Optional[PreparedWrite]:
    """The compiled launcher's preparation of a write_cache signature (launcher.cpp:
    WriteLauncher): the arguments checked (validate.py's errors), then PreparedWrite, or None
    for a call the Python path takes (values the kernel does not read, or copies needed)."""
    validate.write_arguments(spec, cache, slots, values)
    if not writes_on_device(spec, values) or not _write_ready(slots, values):
        return None
    return _write_fields(spec, plan, cache, slots, values, flags.word(slots.device))


def pack_write(spec: Spec, plan: Plan, cache, slots, values: dict[str, torch.Tensor], flags):
    """write_cache's AttnccWriteArgs but its stream, and the tensors they point into (kept alive
    by the caller until the launch is enqueued). Arguments checked by the caller (validate.py),
    values as writes_on_device takes them: [n, copies, dim], or [n, dim] for a shared segment."""
    if slots.dtype not in (torch.int32, torch.int64):
        slots = slots.long()
    slots = slots.contiguous()
    values = {name: t if t.stride(-1) == 1 else t.contiguous() for name, t in values.items()}
    p = _write_fields(spec, plan, cache, slots, values, flags)
    args = AttnccWriteArgs()
    for i, t in enumerate(cache_list(spec, cache)):
        args.tensors[i] = t.data_ptr()
        args.page_stride[i], args.token_stride[i], args.head_stride[i] = p.page_stride[i], p.token_stride[i], p.head_stride[i]
    args.num_pages, args.slots, args.slots_are_64bit, args.n = p.num_pages, slots.data_ptr(), p.slots_are_64bit, p.n
    for i, seg in enumerate(spec.segments):
        args.values[i] = values[seg.name].data_ptr()
        args.value_dtype[i], args.value_token_stride[i], args.value_head_stride[i] = \
            p.value_dtype[i], p.value_token_stride[i], p.value_head_stride[i]
    args.flags = p.flags  # 0: none (a null c_void_p)
    return args, [slots, *values.values()]


def cuda_write_cache(spec: Spec, plan: Plan, library: Library, cache, slots, values: dict[str, torch.Tensor],
                     flags) -> None:
    """write_cache in one kernel (core/write.cuh) on the current stream: no host sync."""
    args, alive = pack_write(spec, plan, cache, slots, values, flags)  # alive: what args points into
    args.stream = torch.cuda.current_stream(slots.device).cuda_stream
    _on(slots.device, library.write_cache, args)


def _schedule(plan: Plan, library: Library, batch: int, s_q: int, block_table, requested: int,
              device_index: int) -> tuple[int, int]:
    """(num_splits, num_parts) of a launch, from shapes alone (no host sync, CUDA-graph safe).
    requested: the op's num_splits argument, 0 (choose), n >= 1 (n splits per sequence)
    or -p (p balanced parts)."""
    kv_tokens = plan.topk if plan.sparse else block_table.shape[1] * plan.page_size
    per_sm = library.ctas_per_sm() if requested == 0 and split.balanced(plan) else 1
    return split.launch_schedule(plan, batch, s_q, kv_tokens, requested,
                                 _sm_count(device_index), per_sm)


def prepare_call(spec: Spec, plan: Plan, library: Library, flags: devicecheck.DeviceFlags,
                 q, cache, block_table, seqlens, indices, num_splits, out, lse) -> Optional[Prepared]:
    """The compiled launcher's first call of an argument signature (launcher.py): checked as
    Kernel's call checks it (raising the argument's error), then prepared; None for a call
    that needs the Python path's copies (q, block-table entries, lengths or indices strided)."""
    validate.call_arguments(spec, q, cache, block_table, seqlens, indices, check_values=False)
    validate.outputs(spec, q, out, lse)
    if not q.is_contiguous() or q.data_ptr() % 16 or (block_table is not None and block_table.stride(-1) != 1) \
            or any(t is not None and not t.is_contiguous() for t in (seqlens, indices)):
        return None
    views = [_cache_view(spec, plan, i, t) for i, t in enumerate(cache_list(spec, cache))]
    return prepare(plan, library, q, views, block_table, num_splits, flags.word(q.device))


def plan_schedule(plan: Plan, library, meta: split.DecodeMetadata, seqlens, s_q: int,
                  num_sms: Optional[int]) -> split.DecodeMetadata:
    """k.plan(seqlens)'s device work (core/plan.cuh): where the step runs in part mode and its
    lengths are a CUDA tensor, the parts' lines, cut once on the device for every layer's call
    (the parts fixed with them: what a launch of these shapes chooses); else `meta` as the host
    made it (library() is the op's Library, built on first use). No host sync: the kernel reads
    the lengths on the stream."""
    if not isinstance(seqlens, torch.Tensor) or not seqlens.is_cuda or meta.num_splits > 0:
        return meta
    if seqlens.dim() != 1 or seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seqlens: expected a 1-d int32 tensor of the batch's lengths, got "
                         f"{tuple(seqlens.shape)} {seqlens.dtype}")
    s_q = validate.query_len(s_q, plan.max_sq)
    batch, device = seqlens.shape[0], seqlens.device
    if batch == 0:
        return meta
    parts = -meta.num_splits if meta.num_splits < 0 else \
        split.num_parts(plan, s_q, num_sms or _sm_count(device.index or 0), library().ctas_per_sm())
    lengths = seqlens.to(torch.int32).contiguous()
    lines = torch.empty(parts * SCHEDULE_LINE_BYTES, dtype=torch.uint8, device=device)
    args = AttnccArgs()
    args.batch, args.s_q, args.num_splits, args.num_parts = batch, s_q, 1, parts
    args.seqlens, args.block_table_cols = lengths.data_ptr(), 0  # no block table: unclamped
    args.stream = torch.cuda.current_stream(device).cuda_stream
    _on(device, lambda a: library().plan_schedule(a, lines.data_ptr()), args)
    return split.DecodeMetadata(-parts, meta.longest, schedule=lines, s_q=s_q)


_OPS: dict[str, object] = {}


def op_for(spec: Spec, plan: Plan, tag: str = ""):
    """The torch op of a checked spec, registered once per process (`tag`: a plan of a
    family the caller chose, registered beside the default one)."""
    qualname = f"attncc::{spec.name}_{spec.digest[:12]}{tag}"
    if qualname in _OPS:
        return _OPS[qualname]
    libraries: dict[str, Library] = {}
    flags = devicecheck.DeviceFlags()  # what the kernels' value checks found (k.check())

    def library() -> Library:
        if "lib" not in libraries:
            libraries["lib"] = Library(build(plan))
        return libraries["lib"]

    def launch(q, cache, block_table, seqlens, indices, scale, num_splits, out=None, lse=None, schedule=None):
        """The CUDA launch behind both ops (and Kernel's eager calls, which skip the dispatch)."""
        return cuda_forward(spec, plan, library(), q, cache, block_table, seqlens, indices, scale,
                            num_splits, out=out, lse=lse, flags=flags.word(q.device), schedule=schedule)

    @cache
    def fast():
        """The op's compiled launcher (launcher.py), made on first use; None where there is none."""
        return launcher.make(library(), [t.name for t in plan.layout.tensors], spec.separate,
                             partial(prepare_call, spec, plan, library(), flags))

    def cpu(q, cache, block_table, seqlens, indices, scale):
        cache_arg = dict(zip(storage.tensor_layouts(spec, 1), cache)) if spec.separate else cache[0]
        out, lse = reference.attention(spec, q, cache_arg, block_table, seqlens, indices, scale)
        return out.to(q.dtype), lse.float()

    @torch.library.custom_op(qualname, mutates_args=())
    def attention(q: torch.Tensor, cache: list[torch.Tensor], block_table: Optional[torch.Tensor],
                  seqlens: Optional[torch.Tensor], indices: Optional[torch.Tensor],
                  scale: float, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        return cpu(q, cache, block_table, seqlens, indices, scale)

    @attention.register_kernel("cuda")
    def _(q, cache, block_table, seqlens, indices, scale, num_splits):
        return launch(q, cache, block_table, seqlens, indices, scale, num_splits)

    @attention.register_fake
    def _(q, cache, block_table, seqlens, indices, scale, num_splits):
        batch, s_q = q.shape[:2]
        return (q.new_empty(batch, s_q, spec.heads_q, spec.d_v),
                q.new_empty(batch, spec.heads_q, s_q, dtype=torch.float32))

    # the same call into preallocated outputs (k(..., out=, lse=))
    @torch.library.custom_op(qualname + "_into", mutates_args=("out", "lse"))
    def attention_into(q: torch.Tensor, cache: list[torch.Tensor], block_table: Optional[torch.Tensor],
                       seqlens: Optional[torch.Tensor], indices: Optional[torch.Tensor],
                       scale: float, num_splits: int, out: torch.Tensor, lse: torch.Tensor) -> None:
        ref_out, ref_lse = cpu(q, cache, block_table, seqlens, indices, scale)
        out.copy_(ref_out)
        lse.copy_(ref_lse)

    @attention_into.register_kernel("cuda")
    def _(q, cache, block_table, seqlens, indices, scale, num_splits, out, lse):
        launch(q, cache, block_table, seqlens, indices, scale, num_splits, out, lse)

    @attention_into.register_fake
    def _(q, cache, block_table, seqlens, indices, scale, num_splits, out, lse):
        return None

    attention.into = attention_into
    attention.library = library  # for build-ahead (Kernel.build) and benchmarks
    attention.flags = flags      # the Kernel's k.check() reads them
    attention.launch = launch    # the Kernel's eager calls on plain CUDA tensors
    attention.fast = fast        # ... through the compiled launcher, where there is one
    # write_cache's kernel (Kernel.write_cache, where ops.writes_on_device takes the values)
    attention.write_cache = lambda cache, slots, values: cuda_write_cache(spec, plan, library(), cache, slots, values,
                                                                          flags.word(slots.device))
    @cache
    def fast_write():
        """write_cache's compiled launcher (launcher.py), made on first use; None where there is none
        (no extension, or records the kernel does not take)."""
        if not kernel_writes(spec):
            return None
        return launcher.make_write(library(), [t.name for t in plan.layout.tensors], spec.separate,
                                   [s.name for s in spec.segments], partial(prepare_write, spec, plan, flags))

    attention.fast_write = fast_write
    # k.plan(seqlens)'s device work (Plan.scheduler; a plain function, as the plan is a dataclass)
    attention.schedule = lambda meta, seqlens, s_q, num_sms: plan_schedule(plan, library, meta, seqlens, s_q, num_sms)
    _OPS[qualname] = attention
    return attention


def cache_list(spec: Spec, cache) -> list[torch.Tensor]:
    """The cache's tensors in the plan's order (a list, as torch ops take)."""
    tensors = storage.cache_tensors(cache)
    return [tensors[name] for name in storage.tensor_layouts(spec, 1)]
