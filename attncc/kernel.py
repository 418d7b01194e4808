"""The Kernel object of DESIGN.md §3: one checked spec, its cache helpers, its
explanation, and the call (reference math on CPU tensors, the built op on CUDA)."""
from __future__ import annotations

import dataclasses

import torch

from . import abi, devicecheck, reference, storage, validate
from .errors import SpecError
from .explain import explain
from .ir import Spec
from .lower import Plan, UnsupportedSpec, lower


def _capturing_or_compiling() -> bool:
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _direct_launch(q) -> bool:
    """A call that may skip the op's dispatch: plain CUDA tensors, nothing tracing it."""
    return type(q) is torch.Tensor and q.is_cuda and not torch.compiler.is_compiling()


def _schedule_of(splits: int, metadata, q):
    """(num_splits, schedule) of a call: num_splits= first, else the count of the metadata made
    for the call's s_q and, on the device, its parts' lines (k.plan(seqlens); the torch.library
    ops, which torch.compile traces, take the count alone)."""
    if splits or metadata is None:
        return splits, None
    if isinstance(q, torch.Tensor) and q.dim() == 4:  # [b, s_q, h_q, d] (another shape: refused by the call's checks)
        metadata = metadata.for_sq(int(q.shape[1]))
    schedule = metadata.schedule
    if schedule is not None and isinstance(q, torch.Tensor) and schedule.device != q.device:
        raise ValueError(f"metadata: made by k.plan on {schedule.device}, the call is on {q.device}")
    return metadata.num_splits, schedule


class Kernel:
    def __init__(self, spec: Spec, family: str | None = None):
        """`family`: run the spec on that kernel family only (attncc.testing.on_family)."""
        self.spec = spec
        self._op = self._plan = self._plan_error = None
        self._flags = devicecheck.DeviceFlags()
        try:
            self._plan = lower(spec, family)
        except SpecError as exc:
            if spec.schedule.spans and not isinstance(exc, UnsupportedSpec):
                raise  # the user wrote this schedule and it cannot run: tell them now
            # a valid spec the CUDA path cannot take (yet): CPU calls still run the
            # reference; CUDA calls, k.plan and k.op raise this error
            self._plan_error = exc
        if self._plan is not None:
            from .ops import op_for

            # registered now: a first use inside torch.compile could not register it
            self._op = op_for(spec, self._plan, f"_{family}" if family else "")
            self._flags = self._op.flags  # shared with the op's kernels
            # k.plan(seqlens) cuts a part-mode step's parts on the device with the op's library
            self._plan = dataclasses.replace(self._plan, scheduler=self._op.schedule)

    @property
    def plan(self) -> Plan:
        """The lowered kernel plan; also callable: k.plan(seqlens) -> DecodeMetadata."""
        if self._plan_error is not None:
            raise self._plan_error
        return self._plan

    @property
    def op(self):
        """torch.ops.attncc.<name>_<hash>(q, cache_list, block_table, seqlens, indices,
        scale, num_splits) -> (out, lse); num_splits 0 lets the launch choose, n >= 1 gives
        each sequence n splits, -p cuts all sequences' tiles into p balanced parts. Raises
        the plan's error for a spec the CUDA path cannot take."""
        if self._plan_error is not None:
            raise self._plan_error
        return self._op

    def build(self):
        """Build (or load from the JIT cache) the CUDA library now; returns its path."""
        return self.op.library().path

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"<attncc.Kernel {self.name} ({self.spec.digest[:12]})>"

    def explain(self, batch: int = 1, seqlen: int = 4096, s_q: int = 1, gpu: str = "h200") -> str:
        lines = (self._plan.explain_lines(batch, seqlen, s_q) if self._plan is not None
                 else (f"plan: none on this kernel path: {self._plan_error.message}",))
        return explain(self.spec, batch, seqlen, s_q, gpu, lines)

    # --- cache -----------------------------------------------------------------------------
    def new_cache(self, num_pages: int, device="cuda"):
        """A zeroed cache: one tensor (packed) or {segment: tensor} (separate)."""
        return storage.new_cache(self.spec, num_pages, device)

    def write_cache(self, cache, slots: torch.Tensor, /, **segments: torch.Tensor) -> None:
        """Write each token's record at `slots` (page * P + offset); each segment is
        [n, kv_heads, dim] ([n, dim] if shared); fp8 segments are quantized per group.
        A slot of -1 is skipped. No host sync on the device (a slot out of range is skipped
        and flagged for k.check()); on CPU, or with ATTNCC_CHECK=1, it raises at once. On the
        device it is one kernel (the spec's library, built on first use). Two entries with one
        slot store one of them or a mix of both.
        cache and slots are positional: a segment may be named `cache`, `slots` or `self`."""
        fast = self._write_launcher(slots)
        if fast is not None and fast(cache, slots, segments):  # an eager write on plain CUDA tensors
            return
        num_slots = validate.write_arguments(self.spec, cache, slots, segments)
        if slots.device.type == "cpu" or devicecheck.synchronous():
            validate.slot_values(slots, num_slots)
        from .ops import writes_on_device

        if slots.device.type == "cuda" and self._op is not None and not torch.compiler.is_compiling() \
                and writes_on_device(self.spec, segments):
            self._op.write_cache(cache, slots, segments)  # one kernel (core/write.cuh)
            return
        # torch ops: CPU tensors, a spec the CUDA path cannot take, torch.compile tracing it
        values = {name: t if not self.spec.segment(name).shared else t[:, None]
                  for name, t in segments.items()}
        written = storage.write(self.spec, cache, slots, values)
        if slots.device.type != "cpu" and slots.numel():
            self._flags.record((~written & (slots != -1)).any(), abi.FLAG_SLOT)

    def _write_launcher(self, slots):
        """write_cache's compiled launcher for this call, or None: the Python path."""
        return self._op.fast_write() if self._compiled_path(slots) else None

    def _compiled_path(self, t) -> bool:
        """Whether a call on `t` may go through a compiled launcher: an op, plain CUDA tensors,
        eager, no synchronous checks (decode and write_cache alike)."""
        return self._op is not None and _direct_launch(t) and not devicecheck.synchronous()

    def check(self) -> None:
        """Raise (ValueError naming the argument) the first bad value a call on the device
        found and skipped since the last check; then clear. Reads the device: a host sync."""
        self._flags.check()

    # --- call ------------------------------------------------------------------------------
    def _launcher(self, q):
        """The compiled launcher for this call, or None: the Python path below."""
        return self._op.fast() if self._compiled_path(q) else None

    def __call__(self, q, cache, block_table=None, seqlens=None, *, indices=None, scale=None,
                 metadata=None, out=None, lse=None, return_lse=True, num_splits=None):
        """out [b, s_q, h_q, d_v], lse [b, h_q, s_q] (just out with return_lse=False).
        `out=` and `lse=` are written instead of new tensors. `metadata` from k.plan(seqlens)
        fixes the split count for a decode step (and, made from lengths on the device, holds its
        parts, cut once for every layer), `num_splits=` sets it; without either it comes from
        shapes."""
        fast = self._launcher(q)
        if fast is not None:  # an eager call on plain CUDA tensors: the compiled launcher
            splits, schedule = _schedule_of(validate.num_splits(num_splits), metadata, q)
            result = fast(q, cache, block_table, seqlens, indices, self.spec.softmax_scale if scale is None
                          else validate.softmax_scale(scale), splits, out, lse, schedule)
            if result is not None:  # None: a call it leaves to the path below (copies, another device)
                return result if return_lse else result[0]
        # values are checked on the host on CPU tensors and with ATTNCC_CHECK=1 (a sync); on
        # the device the kernels check them (never dereferenced, flagged for k.check())
        on_cpu = not isinstance(q, torch.Tensor) or q.device.type == "cpu"  # (a non-tensor q: refused)
        check_values = (on_cpu or self._plan is None or devicecheck.synchronous()) and not _capturing_or_compiling()
        validate.call_arguments(self.spec, q, cache, block_table, seqlens, indices,
                                check_values=check_values)
        validate.outputs(self.spec, q, out, lse)
        splits = validate.num_splits(num_splits)
        if scale is not None:
            scale = validate.softmax_scale(scale)
        from .ops import cache_list

        if q.device.type == "cpu" and self._plan is None:
            ref_out, ref_lse = reference.attention(self.spec, q, cache, block_table, seqlens, indices, scale)
            ref_out, ref_lse = ref_out.to(q.dtype), ref_lse.float()
            if out is not None:
                ref_out = out.copy_(ref_out)
            if lse is not None:
                ref_lse = lse.copy_(ref_lse)
            return (ref_out, ref_lse) if return_lse else ref_out
        scale = self.spec.softmax_scale if scale is None else scale
        splits, schedule = _schedule_of(splits, metadata, q)
        if _direct_launch(q):
            # eager (or under graph capture) on real CUDA tensors: straight to the launch, without
            # the torch.library dispatch that torch.compile needs (measured: ~28 of 65 us)
            result_out, result_lse = self._op.launch(q, cache_list(self.spec, cache), block_table, seqlens,
                                                     indices, scale, splits, out, lse, schedule)
            return (result_out, result_lse) if return_lse else result_out
        args = (q, cache_list(self.spec, cache), block_table, seqlens, indices, scale, splits)
        if out is None and lse is None:
            result_out, result_lse = self.op(*args)
        else:
            if out is None:
                out = q.new_empty(q.shape[0], q.shape[1], self.spec.heads_q, self.spec.d_v)
            if lse is None:  # the kernels always write an lse: a scratch one
                lse = q.new_empty(q.shape[0], self.spec.heads_q, q.shape[1], dtype=torch.float32)
            self.op.into(*args, out, lse)
            result_out, result_lse = out, lse
        return (result_out, result_lse) if return_lse else result_out
