"""The Kernel object of DESIGN.md §3: one checked spec, its cache helpers, its
explanation, and the call (reference math on CPU tensors, the built op on CUDA)."""
from __future__ import annotations

import torch

from . import reference, storage, validate
from .explain import explain
from .ir import Spec


def _capturing_or_compiling() -> bool:
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class Kernel:
    def __init__(self, spec: Spec):
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"<attncc.Kernel {self.name} ({self.spec.digest[:12]})>"

    def explain(self, batch: int = 1, seqlen: int = 4096, s_q: int = 1, gpu: str = "h200") -> str:
        return explain(self.spec, batch, seqlen, s_q, gpu)

    # --- cache -----------------------------------------------------------------------------
    def new_cache(self, num_pages: int, device="cuda"):
        """A zeroed cache: one tensor (packed) or {segment: tensor} (separate)."""
        return storage.new_cache(self.spec, num_pages, device)

    def write_cache(self, cache, slots: torch.Tensor, **segments: torch.Tensor) -> None:
        """Write each token's record at `slots` (page * P + offset); each segment is
        [n, kv_heads, dim] ([n, dim] if shared); fp8 segments are quantized per group."""
        validate.write_arguments(self.spec, cache, slots, segments)
        values = {name: t if not self.spec.segment(name).shared else t[:, None]
                  for name, t in segments.items()}
        storage.write(self.spec, cache, slots, values)

    # --- call ------------------------------------------------------------------------------
    def __call__(self, q, cache, block_table=None, seqlens=None, *, indices=None, scale=None):
        validate.call_arguments(self.spec, q, cache, block_table, seqlens, indices,
                                check_values=not _capturing_or_compiling())
        if q.device.type == "cpu":
            out, lse = reference.attention(self.spec, q, cache, block_table, seqlens, indices, scale)
            return out.to(q.dtype), lse.float()
        raise NotImplementedError("CUDA kernels are not built yet")
