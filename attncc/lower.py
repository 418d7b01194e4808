"""Checked IR + schedule -> kernel plan: the record layout (layout.py), then the target's
kernel families in preference order (families/): the first that accepts the spec and every
knob the user wrote lowers it to its KernelConfig, which holds every choice its kernel makes.

The plan is the single source of the kernel's constants (rendered as named constexprs) and
of the JIT cache key. A knob no family can honour is a SpecError at the knob, with each
family's reason; a valid spec no family runs is an UnsupportedSpec (the reference still runs
it on CPU tensors)."""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from . import families, split, validate
from .abi import MAX_TENSORS
from .errors import SpecError
from .families import KernelConfig, Refusal
from .ir import Spec
from .layout import Layout, layout as record_layout
from .target import TARGETS


@dataclass(frozen=True)
class Plan:
    name: str
    family: str         # the kernel family that runs it (families/)
    target: str
    elem: str
    heads_q: int
    heads_kv: int
    group: int
    max_sq: int
    causal: bool
    sparse: bool
    topk: int
    page_size: int
    d_k: int
    d_v: int
    layout: Layout
    config: KernelConfig
    split_kv: str | int
    num_sms: int        # the split heuristic's default SM count; launches read the real one
    not_applied: tuple[str, ...] = ()  # knobs the family runs without applying them
    refused: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # families tried first
    # k.plan(seqlens)'s device work where the plan has a built op (ops.plan_schedule): (metadata,
    # seqlens, s_q, num_sms) -> metadata with the parts' lines; not part of the plan's identity
    scheduler: Callable | None = field(default=None, compare=False, repr=False)

    def template_dict(self) -> dict:
        """The plan as the templates read it (also the canonical form for hashing)."""
        data = asdict(self)
        data["config"].pop("why")
        data.pop("refused")
        data.pop("scheduler")
        return data

    def canonical_json(self) -> str:
        return json.dumps(self.template_dict(), sort_keys=True, separators=(",", ":"))

    def __call__(self, seqlens, s_q: int | None = None, num_sms: int | None = None,
                 max_seqlen: int | None = None) -> split.DecodeMetadata:
        """Scheduling metadata for one decode step, shared by all layers of that step
        (`k.plan(seqlens)`; attncc/split.py): from shapes (and max_seqlen when given), never
        from the lengths' values, so it costs no host sync. Lengths in a CUDA tensor of a plan
        with a built op: a part-mode step's parts are cut there too (core/plan.cuh), once for
        every layer's call, with device work only. For the step's s_q (query tokens a
        sequence) or, without it, for every s_q the spec takes, each call taking its own
        (DecodeMetadata.for_sq)."""
        if s_q is None:
            first, *others = (self(seqlens, n, num_sms, max_seqlen) for n in range(1, self.max_sq + 1))
            return replace(first, others=tuple(others))
        s_q = validate.query_len(s_q, self.max_sq)
        meta = split.metadata(self, seqlens, s_q, num_sms or self.num_sms, self.ctas_per_sm, max_seqlen)
        return meta if self.scheduler is None else self.scheduler(meta, seqlens, s_q, num_sms)

    @property
    def schedule_key(self) -> int:
        """A 64-bit digest of the plan (rendered as kScheduleKey): a schedule that k.plan(seqlens)
        made with one plan's kernels is taken by the same plan's decode kernels only."""
        import hashlib

        return int(hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16], 16)

    @property
    def ctas_per_sm(self) -> int:
        """Decode CTAs one SM of the target holds (threads, shared memory, registers); a launch
        asks the built library's occupancy instead."""
        cfg = self.config
        return TARGETS[self.target].ctas_per_sm(cfg.threads, cfg.smem_bytes, cfg.registers)

    def explain_lines(self, batch: int = 1, seqlen: int = 4096, s_q: int = 1) -> tuple[str, ...]:
        """What runs: the family, every choice of its config and why, the launch of one call."""
        family, cfg = families.by_name(self.family), self.config
        lines = [f"plan: {self.target}, family {self.family} ({family.summary})"]
        lines += [f"  not chosen: {name}: {why}" for name, why in self.refused]
        lines.append(f"  staged token row: {self.layout.staged_width} x {self.elem} from "
                     + ", ".join(f"{s.segment}[{s.seg_lo}:{s.seg_lo + s.width}]"
                                 for s in self.layout.sources))
        lines.append("  kernel config (every choice the kernel makes):")
        lines += family.describe(cfg)
        lines += [f"  note: `{k}` is not yet applied on this family (Hopper schedules come later)"
                  for k in self.not_applied]
        pages = -(-seqlen // self.page_size)
        kv_tokens = self.topk if self.sparse else pages * self.page_size
        per_sm = self.ctas_per_sm
        splits, parts = split.launch_schedule(self, batch, s_q, kv_tokens, 0, self.num_sms, per_sm)
        lanes = split.lanes(self, s_q)
        merged = bool(splits > 1 or parts)
        if parts:
            grid = parts * lanes
            how = (f"split_kv {self.split_kv}: balanced, all sequences' KV tiles cut into "
                   f"{parts} equal parts of {lanes} CTAs (row blocks x kv heads)")
            seqs = batch * s_q if self.sparse else batch
            bounds, whole = split.whole_parts([-(-kv_tokens // cfg.tile_n)] * seqs, parts,
                                              split.whole_slack_tiles(self, s_q), cfg.piece_cost_tiles)
            if whole and cfg.whole_parts:  # these equal lengths: the kernels move the cuts to the sequences' starts
                longest = max(b - a for a, b in zip(bounds, bounds[1:]))
                how += (f"; these equal lengths: each cut moved back to its sequence's start, so the parts "
                        f"hold whole sequences (the longest {longest} tiles with its pieces' cost, "
                        f"{longest * parts / bounds[-1]:.3f} of "
                        "the even length; decided on the device from the lengths) and none is merged")
                merged = False
        else:
            grid = batch * splits * split.ctas_per_split(self, s_q)
            why = ("fixed" if self.split_kv != "auto" else "batch x lanes already fill the SMs"
                   if splits == 1 else "enough CTAs to fill the SMs")
            how = f"split_kv {self.split_kv}: {splits} split(s) per sequence ({why})"
        work = split.workspace_bytes(self, batch, s_q, splits, parts)
        lines += [f"  launch at batch {batch}, s_q {s_q}, {kv_tokens} tokens per sequence on "
                  f"{self.num_sms} SMs:",
                  f"    {how}",
                  f"    grid {grid} CTAs of {cfg.threads} threads, {cfg.smem_bytes} B shared "
                  f"memory; {per_sm} CTA(s) per SM (threads, shared memory, {cfg.registers}-register "
                  "budget)",
                  f"    combine: {'yes' if merged else 'launched, nothing to merge' if parts else 'no'}; "
                  f"workspace {work} B"]
        return tuple(lines)


class UnsupportedSpec(SpecError):
    """A valid spec no kernel family can take (widths, alignment): the reference still runs
    it on CPU; a CUDA call reports this."""


def _written_knobs(spec: Spec) -> list[str]:
    return [knob for knob, _ in spec.schedule.spans]


def _no_family(spec: Spec, refusals: list[tuple[str, Refusal]]) -> SpecError:
    reasons = "; ".join(f"{name}: {r.reason}" for name, r in refusals)
    at_knob = [r for _, r in refusals if r.knob]
    if at_knob:
        first = min(at_knob, key=lambda r: (r.span.line, r.span.column) if r.span else (0, 0))
        return SpecError(f"no kernel family runs this schedule on {spec.schedule.target}: {reasons}",
                         spec.source, first.span or spec.span_of("name"))
    # the most general family's reason (the last asked) points at the spec
    span = next((r.span for _, r in reversed(refusals) if r.span), spec.span_of("name"))
    return UnsupportedSpec(f"no kernel family runs this spec on {spec.schedule.target}: {reasons}",
                           spec.source, span)


def lower(spec: Spec, only: str | None = None) -> Plan:
    """Resolve the spec and its schedule to a kernel plan, or raise at the knob. `only`: the
    name of the one family to ask (tests run a spec on every family that takes it)."""
    sched = spec.schedule
    target = TARGETS[sched.target]
    layout = record_layout(spec)
    if len(layout.tensors) > MAX_TENSORS:
        raise UnsupportedSpec(f"separate storage with {len(layout.tensors)} tensors: kernels take "
                              f"at most {MAX_TENSORS} (abi.h)", spec.source, spec.span_of("cache"))
    refusals: list[tuple[str, Refusal]] = []
    written = [k for k in _written_knobs(spec) if k not in families.COMMON_KNOBS]
    for family in families.for_target(sched.target):
        if only is not None and family.name != only:
            continue
        unknown = [k for k in written if k not in family.honours | family.tolerates]
        if unknown:
            refusals.append((family.name, Refusal(f"does not apply `{unknown[0]}`",
                                                  sched.span_of(unknown[0]), unknown[0])))
            continue
        try:
            config = family.lower(spec, layout, target)
        except Refusal as refusal:
            refusals.append((family.name, refusal))
            continue
        not_applied = tuple(k for k in written if k in family.tolerates)
        for knob in not_applied:
            warnings.warn(f"{spec.source.filename}: `{knob}` is not yet applied: attncc runs "
                          f"`{spec.name}` on the {family.name} family ({family.summary})",
                          stacklevel=4)
        return Plan(
            name=spec.name, family=family.name, target=sched.target, elem=spec.elem.name,
            heads_q=spec.heads_q, heads_kv=spec.heads_kv, group=spec.group,
            max_sq=spec.max_query_len, causal=spec.causal, sparse=spec.sparse, topk=spec.topk,
            page_size=spec.page_size, d_k=spec.d_k, d_v=spec.d_v, layout=layout, config=config,
            split_kv=sched.split_kv, num_sms=target.sm_count, not_applied=not_applied,
            refused=tuple((name, r.reason) for name, r in refusals))
    raise _no_family(spec, refusals)
