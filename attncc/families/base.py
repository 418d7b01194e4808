"""What a kernel family is: a Python class that declares what it can run (targets, knobs it
honours, limits) and lowers a checked spec to a frozen, hashed KernelConfig that holds every
choice its kernel makes. The C++ of a family reads those choices as named constexprs and only
static_asserts them; nothing is re-derived on the device side."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from ..errors import Span
from ..ir import Spec
from ..layout import Layout
from ..target import Target

# Knobs every family honours: the target picks the families, and split_kv is the host's
# split policy (attncc/split.py), which every family's kernels run.
COMMON_KNOBS = frozenset({"target", "split_kv"})


class Refusal(Exception):
    """Why a family cannot run a spec. `knob`: the schedule knob (as written) that it cannot
    honour, where the family would take the spec without it; `span`: where to point."""

    def __init__(self, reason: str, span: Span | None = None, knob: str | None = None):
        super().__init__(reason)
        self.reason, self.span, self.knob = reason, span, knob


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """The choices every family makes; a family's config adds its own fields. `why` says,
    per field, why it has its value (for `explain`): not part of the identity."""

    tile_m: int          # query rows of a CTA (a row block)
    tile_n: int          # tokens of a KV tile
    stages: int          # KV tiles in flight
    threads: int         # per CTA
    smem_bytes: int      # dynamic shared memory of the decode kernel
    registers: int       # register budget per thread (the launch bounds give it)
    compute_bound: bool  # the tensor pipe, not the cache stream, bounds a KV step
    dependent_launch: bool  # the combine is a programmatic dependent of the decode kernel
    ready_words: bool    # part mode: the combine merges a sequence once its pieces' ready words
                         # are set, not after the decode grid (core/ready.cuh)
    combine_blocks: int  # the combine's blocks per SM, its launch bounds (registers a thread:
                         # 65,536 / (256 x this), rounded down to 8)
    whole_parts: bool    # part mode: the parts hold whole sequences where the lengths are even
                         # enough (core/schedule.cuh), or always cut
    whole_tight_rows: int   # rows a sequence (s_q x group; sparse: the group) from which a launch is
                            # compute-bound: its whole parts also within whole_slack_tiles of T / P
    whole_slack_tiles: int  # (core/work.cuh whole_slack_tiles)
    piece_cost_tiles: int   # part mode: a piece's fixed cost in tiles, charged on the line before
                            # each sequence's tiles (core/schedule.cuh line_length)
    why: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def choices(self) -> dict:
        """Every choice, by name (the canonical form: rendered, hashed, explained)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "why"}

    def reason(self, name: str) -> str:
        return dict(self.why).get(name, "")


# Why a config's combine is (or is not) a programmatic dependent of its decode kernel.
DEPENDENT_LAUNCH_WHY = {
    True: ("dependent_launch", "the combine launches while the decode kernel's last CTAs run "
           "and waits for their partials (griddepcontrol)"),
    False: ("dependent_launch", "the target has no programmatic dependent launch"),
}


def ready_words(spec, target: Target) -> tuple[bool, tuple[str, str]]:
    """Whether part mode's combine merges each sequence as soon as its pieces are written
    (core/ready.cuh), and why. Sparse plans, whose sequences (b x s_q queries) outnumber the
    parts at the batches they serve; measured on the H200 (bench/RESULTS.md, session 26,
    same-process A/B, b = 128): sparse fp8 h_q 128 s_q 2 0.981 of the time, s_q 1 0.979, h_q 64
    0.962. Not dense plans: with the words MLA b = 128 measured 1.000, b = 32 1.014, b = 8 1.013
    (a first form, on everywhere)."""
    if not target.dependent_launch:
        return False, ("ready_words", "off: no programmatic dependent launch to start the combine early")
    if not spec.sparse:
        return False, ("ready_words", "off: dense (no gain measured at b = 128; MLA b <= 32 slower)")
    return True, ("ready_words", "on: sparse queries outnumber the parts; the combine merges each as its "
                  "pieces land, while the decode grid's last parts run (where sequences >= parts)")


SLAB_COLS = 128  # a combine warp's columns of a row (core/combine.cuh kSlabCols)

# A part kernel's work stash in shared memory (both families): the CTA's work (9 ints) at 0,
WALK_OFFSET = 64     # its (the consumers') part walk (12 ints) here,
WHOLE_OFFSET = 112   # then whether the parts hold whole sequences (one int)


WHOLE_PARTS_WHY = (
    "whole_parts", "on: where the lengths are even enough the parts hold whole sequences, nothing to merge "
    "(same-process A/B, H100, b=128 s_k 8192 against cut parts: MLA s_q 1 0.932, h_q 64 0.937, GLA-2 s_q 2 "
    "0.952, s_q 1 0.936, sparse fp8 s_q 1 0.957)")


RIDGE_FLOPS_PER_BYTE = 295   # where a launch turns compute-bound: the H100's 989 TFLOP/s (dense
                              # bf16) over its 3.35 TB/s (the H200's 4.8 TB/s puts it at 206)
WHOLE_SLACK_TOKENS = 1280     # a compute-bound launch's whole parts at most this far over T / P (on the
                              # line: MLA b = 128 s_q 2 whole 0.986 of cut at 15.5 tiles over, plus 4 pieces'
                              # cost since session 43; cut won from 31 over)


def whole_slack(spec, tile_n: int) -> tuple[int, int, tuple[tuple[str, str], ...]]:
    """Where whole-sequence parts are also bounded in tiles (core/schedule.cuh): the rows a
    sequence (s_q x group; sparse: the group) from which a launch's FLOPs per cache byte reach
    RIDGE_FLOPS_PER_BYTE, and the slack in tiles there. At or under the ridge the SMs whole parts
    leave idle give their share of HBM to the rest; over it each extra tile costs its time (H100,
    MLA b = 128 s_k 32768 whole against cut parts: s_q 1, 242 FLOPs a byte, 31 tiles over T / P,
    0.981; s_q 2, 484, 62 over, 1.016; s_q 2 s_k 8192, 15.5 over, 0.986; bench/RESULTS.md,
    session 42)."""
    rows = -(-RIDGE_FLOPS_PER_BYTE * spec.group // spec.intensity) if spec.intensity > 0 else 1 << 30
    rows = max(1, int(rows))
    tiles = max(1, WHOLE_SLACK_TOKENS // tile_n)
    return rows, tiles, (("whole_slack_tiles", f"{WHOLE_SLACK_TOKENS} tokens of {tile_n}"), ("whole_tight_rows", f"{rows} rows a sequence ({rows / spec.group:.2f} x the group): "
                         f"{spec.intensity / spec.group * rows:.0f} FLOPs a cache byte, over the ridge "
                         f"({RIDGE_FLOPS_PER_BYTE}, the H100's): there whole parts also at most {tiles} tiles "
                         f"({WHOLE_SLACK_TOKENS} tokens) over the even length (H100, MLA b=128 s_k 32768 whole "
                         "against cut: s_q 1 0.981, s_q 2 1.016)"))


PIECE_COST_TILES = 5  # a piece's fixed cost on a compute-bound plan's line, in 64-token tiles


def piece_cost(measured: bool) -> tuple[int, tuple[str, str]]:
    """A piece's fixed cost in tiles on part mode's line (core/schedule.cuh), and why: Q's load,
    the pipeline's fill and drain and the epilogue's stores. Measured on the Hopper family
    (H100, MLA b = 8 s_k 32768: the parts of two pieces ended ~9.6 us after those of one, ~5
    tiles' time; bench/RESULTS.md session 43); 0 (the line of tiles alone) on a family where
    it was not (`measured` false)."""
    if not measured:
        return 0, ("piece_cost_tiles", "0: not measured on this family (the line is the tiles alone)")
    return PIECE_COST_TILES, ("piece_cost_tiles", f"{PIECE_COST_TILES}: a part holding a sequence's start holds that "
                              "many fewer tiles (MLA b=8 s_k 32768, H100: the parts of two pieces ended ~9.6 us, "
                              "~5 tiles, after those of one)")


def combine_blocks(spec, ready: bool) -> tuple[int, tuple[str, str]]:
    """The combine's blocks per SM (core/combine.cuh's launch bounds), and why. A block's merges
    wait on memory (the sequence's place on the line, then each row's lse, then its partials), so
    the more blocks an SM holds the more of those waits overlap: 3 (80 registers a thread) where
    the kernel fits them (ptxas, session 40: every spec's combine); with the ready words' wait
    compiled in (sparse) it spilled at 80, and with a value of 128 columns (one slab a row) too:
    those keep 2 (128). At 4 (64 registers) it spilled 24-100 bytes."""
    if ready:
        return 2, ("combine_blocks", "2 (128 registers a thread): with the ready words' wait, 3 (80) spilled "
                   "4 bytes (ptxas, sparse_fp8)")
    if spec.d_v <= SLAB_COLS:
        return 2, ("combine_blocks", f"2 (128 registers a thread): a value of {spec.d_v} columns is one slab a "
                   "row, and at 3 (80) the 128-wide ones spilled 16 bytes (ptxas: gqa8, gta4, mqa, gla4)")
    return 3, ("combine_blocks", "3 (80 registers a thread): more of the blocks' memory waits overlap "
               "(same-process A/B against 2, H100, bitwise equal: MLA b=128 s_q 2 0.989, s_q 1 0.994, h_q 64 "
               "0.994, b=1 0.983, b=8 0.999; GLA-2 s_q 2 0.984, s_q 1 0.993, b=8 1.006); 4 (64) spilled "
               "24-100 bytes (ptxas)")


def misaligned(spec: Spec, layout: Layout, src) -> str | None:
    """Why the 16-byte copies of both families cannot take a staged run (layout.SourcePlan)
    where the cache keeps it, or None: its first byte in the record, the distance between two
    tokens' records, or, for a segment with a copy per kv head and more than one kv head, the
    distance between the copies (with one kv head there is no second copy to misalign; an fp8
    run's copies 8 mod 16 apart are copied in 8-byte halves, src.copy_bytes)."""
    tensor = layout.tensors[src.tensor]
    if src.offset_bytes % 16:
        return f"segment `{src.segment}` starts at byte {src.offset_bytes} of the record: needs 16-byte alignment"
    if tensor.token_stride_bytes % 16:
        return (f"segment `{src.segment}`: its tokens are {tensor.token_stride_bytes} bytes apart in cache "
                f"tensor `{tensor.name}`: needs 16-byte alignment")
    if spec.heads_kv > 1 and src.head_stride_bytes % src.copy_bytes:
        return (f"segment `{src.segment}`: its copies (one a kv head) are {src.head_stride_bytes} bytes "
                "apart in the record: needs 16-byte alignment (8 for an fp8 segment)")
    return None


class Family:
    """A kernel family. Subclasses set the class attributes and implement lower()."""

    name: ClassVar[str]
    summary: ClassVar[str]
    targets: ClassVar[tuple[str, ...]]
    honours: ClassVar[frozenset[str]]    # schedule knobs it applies (besides COMMON_KNOBS)
    tolerates: ClassVar[frozenset[str]]  # knobs it runs without applying them (with a note)
    template: ClassVar[str] = "decode.cu.j2"  # its translation unit, under templates/ (one for all)
    limits: ClassVar[tuple[str, ...]]    # what it cannot run, in words (for explain)

    def lower(self, spec: Spec, layout: Layout, target: Target) -> KernelConfig:
        """The family's config for this spec, or Refusal."""
        raise NotImplementedError

    def describe(self, config: KernelConfig) -> list[str]:
        """Lines for `explain`: every choice of the config and why."""
        lines = []
        for name, value in config.choices().items():
            why = config.reason(name)
            lines.append(f"    {name:<22} {value!s:<10}{'  ' + why if why else ''}")
        return lines
