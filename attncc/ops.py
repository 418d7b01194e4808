"""Built kernels as torch ops: `torch.ops.attncc.<name>_<hash>` with a fake (meta)
implementation, the reference on CPU and the built library on CUDA. The torch side of
a launch lives here; the library only sees pointers, sizes and a stream (abi.h)."""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

from . import reference, split, storage, validate
from .abi import AttnccArgs, Library
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


def _cache_tensor(i: int, t: torch.Tensor) -> torch.Tensor:
    """The kernels of ABI version 1 take a contiguous cache (strides are compile-time)."""
    if not t.is_contiguous():
        raise ValueError(f"cache tensor {i}: a strided view of a cache (strides {tuple(t.stride())}) runs "
                         "on the CPU reference; the CUDA kernels of this version read contiguous caches "
                         "only (page, token and head strides reach them with the next ABI version): "
                         "pass a contiguous cache")
    return _aligned(f"cache tensor {i}", t)


def cuda_forward(plan: Plan, library: Library, q, cache, block_table, seqlens, indices,
                 scale: float, splits: int = 0, out=None, lse=None):
    """One launch; writes into out and lse when given (checked by the caller), else new ones."""
    scale = validate.softmax_scale(scale)  # the op may be called without the Kernel
    q = _aligned("q", q.contiguous())
    cache = [_cache_tensor(i, t) for i, t in enumerate(cache)]
    if block_table is not None and block_table.stride(-1) != 1:
        block_table = block_table.contiguous()  # rows may be strided, entries may not
    seqlens = None if seqlens is None else seqlens.contiguous()
    indices = None if indices is None else indices.contiguous()
    batch, s_q = q.shape[:2]
    if out is None:
        out = torch.empty(batch, s_q, plan.heads_q, plan.d_v, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(batch, plan.heads_q, s_q, dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    splits, parts = _schedule(plan, library, batch, s_q, block_table, splits, q.device.index or 0)
    partial_out = partial_lse = None
    workspace = split.workspace_shapes(plan, batch, s_q, splits, parts)
    if workspace is not None:
        partial_out = torch.empty(workspace[0], dtype=torch.float32, device=q.device)
        partial_lse = torch.empty(workspace[1], dtype=torch.float32, device=q.device)
    args = AttnccArgs()
    args.q, args.out, args.lse = q.data_ptr(), out.data_ptr(), lse.data_ptr()
    for i, t in enumerate(cache):
        args.tensors[i] = t.data_ptr()
    args.block_table = _ptr(block_table)
    args.block_table_stride = block_table.stride(0) if block_table is not None else 0
    args.seqlens, args.indices = _ptr(seqlens), _ptr(indices)
    args.partial_out, args.partial_lse = _ptr(partial_out), _ptr(partial_lse)
    args.batch, args.s_q, args.num_splits, args.num_parts = batch, s_q, splits, parts
    args.softmax_scale = scale
    args.stream = torch.cuda.current_stream(q.device).cuda_stream
    if q.device.index == torch.cuda.current_device():
        library.launch(args)  # the common case: no device switch on the hot path
    else:
        with torch.cuda.device(q.device):
            library.launch(args)
    return out, lse


def _schedule(plan: Plan, library: Library, batch: int, s_q: int, block_table, requested: int,
              device_index: int) -> tuple[int, int]:
    """(num_splits, num_parts) of a launch, from shapes alone (no host sync, CUDA-graph safe).
    requested: the op's num_splits argument, 0 (choose), n >= 1 (n splits per sequence)
    or -p (p balanced parts)."""
    kv_tokens = plan.topk if plan.sparse else block_table.shape[1] * plan.page_size
    per_sm = library.ctas_per_sm() if requested == 0 and split.balanced(plan) else 1
    return split.launch_schedule(plan, batch, s_q, kv_tokens, requested,
                                 _sm_count(device_index), per_sm)


_OPS: dict[str, object] = {}


def op_for(spec: Spec, plan: Plan):
    """The torch op of a checked spec, registered once per process."""
    qualname = f"attncc::{spec.name}_{spec.digest[:12]}"
    if qualname in _OPS:
        return _OPS[qualname]
    libraries: dict[str, Library] = {}

    def library() -> Library:
        if "lib" not in libraries:
            libraries["lib"] = Library(build(plan))
        return libraries["lib"]

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
        return cuda_forward(plan, library(), q, cache, block_table, seqlens, indices, scale,
                            num_splits)

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
        cuda_forward(plan, library(), q, cache, block_table, seqlens, indices, scale, num_splits,
                     out=out, lse=lse)

    @attention_into.register_fake
    def _(q, cache, block_table, seqlens, indices, scale, num_splits, out, lse):
        return None

    attention.into = attention_into
    attention.library = library  # for build-ahead (Kernel.build) and benchmarks
    _OPS[qualname] = attention
    return attention


def cache_list(spec: Spec, cache) -> list[torch.Tensor]:
    """The cache's tensors in the plan's order (a list, as torch ops take)."""
    tensors = storage.cache_tensors(cache)
    return [tensors[name] for name in storage.tensor_layouts(spec, 1)]
