"""Random inputs and comparisons against the reference: shared by `attncc test`, the
GPU tests and the benchmark's correctness gate. Inputs are never zeros: caches are
filled with NaN first (unused pages and slots must never be read) and written with
random values only where a sequence (or an index) needs them."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import reference, storage
from .ir import Spec

BF16_REL_TOL = 1e-2   # relative norm error of out vs a float32 reference (DESIGN.md §5)
LSE_ABS_TOL = 5e-3


@dataclass
class Case:
    q: torch.Tensor
    cache: object
    block_table: torch.Tensor | None
    seqlens: torch.Tensor | None
    indices: torch.Tensor | None


def fill_nan(cache) -> None:
    """All-ones bytes are NaN in bf16, fp16, e4m3, e5m2 and fp32 alike."""
    for t in storage.cache_tensors(cache).values():
        t.view(torch.uint8).fill_(0xFF)


def _write_random(spec: Spec, cache, slots: torch.Tensor, gen: torch.Generator) -> None:
    n, device = len(slots), slots.device
    values = {}
    for seg in spec.segments:
        shape = (n, 1 if seg.shared else spec.heads_kv, seg.dim)
        values[seg.name] = torch.randn(shape, generator=gen, device="cpu").to(device)
    storage.write(spec, cache, slots, values)


def written_as_contract(spec: Spec, cache, slots: torch.Tensor, values: dict) -> dict[str, torch.Tensor]:
    """The cache's tensors, copied to the CPU, after write_cache's contract (storage.write, torch
    ops) has written `values` ([n, copies, dim], or [n, dim] shared: as write_cache takes them)
    at the slots inside the cache: what write_cache on the device must leave, byte for byte."""
    tensors = {name: t.cpu().clone() for name, t in storage.cache_tensors(cache).items()}
    keep = ((slots >= 0) & (slots < storage.num_pages(cache) * spec.page_size)).cpu()
    storage.write(spec, tensors if spec.separate else tensors[storage.PACKED_NAME], slots.cpu()[keep].long(),
                  {name: (v if not spec.segment(name).shared else v[:, None]).cpu()[keep] for name, v in values.items()})
    return tensors


def random_case(spec: Spec, seqlens: list[int], s_q: int, device="cuda", seed: int = 0,
                empty_rows: bool = True) -> Case:
    """A call's inputs: pages assigned by a random permutation, spare block-table entries
    pointing at NaN pages; sparse indices distinct per query, some -1 (and, with
    empty_rows, one query with none)."""
    gen = torch.Generator().manual_seed(seed)
    P, batch = spec.page_size, len(seqlens)
    q = (torch.randn(batch, s_q, spec.heads_q, spec.d_k, generator=gen)
         .to(storage.torch_dtype(spec.elem)).to(device))
    if spec.sparse:
        live = max(spec.topk + 7, 2 * P + 3)
        pages = math.ceil(live / P) + 2
        cache = storage.new_cache(spec, pages, device)
        fill_nan(cache)
        written = torch.randperm(pages * P, generator=gen)[:live]
        _write_random(spec, cache, written.to(device), gen)
        idx = torch.full((batch, s_q, spec.topk), -1, dtype=torch.int32)
        for b in range(batch):
            for t in range(s_q):
                picks = written[torch.randperm(live, generator=gen)[: spec.topk]]
                keep = torch.rand(spec.topk, generator=gen) > 0.2  # some -1 holes
                idx[b, t] = torch.where(keep, picks, torch.full_like(picks, -1)).to(torch.int32)
        if empty_rows and batch * s_q > 1:
            idx[-1, -1] = -1
        return Case(q, cache, None, None, idx.to(device))
    need = [math.ceil(L / P) for L in seqlens]
    max_pages = max(need + [1]) + 1
    pages = sum(need) + 3
    cache = storage.new_cache(spec, pages, device)
    fill_nan(cache)
    order = torch.randperm(pages, generator=gen)
    table = torch.empty(batch, max_pages, dtype=torch.int32)
    spare = order[sum(need):]  # never written: NaN pages
    start = 0
    for b, (L, n) in enumerate(zip(seqlens, need)):
        table[b, :n] = order[start: start + n]
        table[b, n:] = spare[torch.randint(len(spare), (max_pages - n,), generator=gen)]
        start += n
        pos = torch.arange(L)
        slots = table[b, pos // P].long() * P + pos % P
        if L:
            _write_random(spec, cache, slots.to(device), gen)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    return Case(q, cache, table.to(device), lens.to(device), None)


@dataclass(frozen=True)
class Comparison:
    out_rel_err: float
    lse_abs_err: float
    nonfinite_out: int
    lse_mismatch: int  # -inf where the reference is finite or the other way round

    @property
    def ok(self) -> bool:
        return (self.nonfinite_out == 0 and self.lse_mismatch == 0
                and self.out_rel_err <= BF16_REL_TOL and self.lse_abs_err <= LSE_ABS_TOL)

    def __str__(self) -> str:
        return (f"out rel err {self.out_rel_err:.2e}, lse abs err {self.lse_abs_err:.2e}, "
                f"non-finite out {self.nonfinite_out}, lse -inf mismatches {self.lse_mismatch}")


def compare(spec: Spec, case: Case, out: torch.Tensor, lse: torch.Tensor,
            scale: float | None = None) -> Comparison:
    # fp8 is compared against the dequantized reference in the 16-bit compute dtype: the
    # kernel stages value × scale in bf16/fp16 shared memory, and that rounding alone moves
    # lse by ~1e-2 (measured), more than the bf16 tolerance the rest of the math meets
    ref_out, ref_lse = reference.attention(spec, case.q, case.cache, case.block_table,
                                           case.seqlens, case.indices, scale,
                                           dequant_dtype=storage.torch_dtype(spec.elem))
    out, lse = out.float(), lse.float()
    diff = (out - ref_out).nan_to_num(nan=math.inf)
    norm = ref_out.norm().item()
    rel = diff.norm().item() / norm if norm > 0 else diff.norm().item()
    finite = torch.isfinite(ref_lse)
    mismatch = int((finite != torch.isfinite(lse)).sum()) + int(torch.isnan(lse).sum())
    both = finite & torch.isfinite(lse)
    lse_err = (lse[both] - ref_lse[both]).abs().max().item() if both.any() else 0.0
    return Comparison(rel, lse_err, int((~torch.isfinite(out)).sum()), mismatch)


def poison_allocator(*shapes_dtypes, device="cuda") -> None:
    """Fill the blocks the caching allocator will hand out next with NaN, so an output
    element the kernel forgets to write shows up as NaN instead of a stale value."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device=device)
              for shape, dtype in shapes_dtypes]
    del blocks


def on_family(path_or_text, family: str):
    """The spec compiled for one kernel family only (the lowering's refusal if it cannot run
    it): how the GPU suite runs a spec on every family that takes it, not just the preferred."""
    from .frontend import check_spec
    from .kernel import Kernel

    return Kernel(check_spec(path_or_text), family)


def with_config(plan, overrides):
    """The plan with fields of its kernel config replaced, each `FIELD=VALUE` (true/false a bool,
    else an int): a kernel-config choice the lowering did not take, built for an A/B or a trace
    (bench/ab_build.py, bench/clock_trace.py). An unknown field is refused by name."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(plan.config)}
    changes = {}
    for text in overrides:
        name, eq, value = text.partition("=")
        if not eq or name not in fields:
            raise ValueError(f"--config {text!r}: expected FIELD=VALUE with FIELD a field of the "
                             f"{plan.family} kernel config ({', '.join(sorted(fields))})")
        try:
            changes[name] = value == "true" if value in ("true", "false") else int(value)
        except ValueError:
            raise ValueError(f"--config {text!r}: VALUE is true, false or an int") from None
    # (without the op's scheduler: its schedule is of the plan as lowered)
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, **changes), scheduler=None) \
        if changes else plan


def families_of(path_or_text) -> list[str]:
    """The families that accept the spec (and its schedule) on its target, most preferred
    first: the lowering asked for each in turn."""
    import warnings

    from . import families
    from .errors import SpecError
    from .frontend import check_spec
    from .lower import lower

    spec = check_spec(path_or_text)
    names = []
    for fam in families.for_target(spec.schedule.target):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a tolerated knob's "not yet applied"
                lower(spec, fam.name)
        except SpecError:
            continue
        names.append(fam.name)
    return names
