"""Lowering (attncc/lower.py, attncc/layout.py, attncc/families/): checked spec + schedule
-> kernel plan, on CPU.

The plan must be one the mma.sync kernel can run (the properties below; its C++ static_asserts
check the same at build time), stage every cache run once, honour the schedule's knobs, and
turn an impossible schedule into a positioned SpecError at the knob."""
from __future__ import annotations

import dataclasses
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attncc
from attncc import split
from attncc.ir import DTYPES
from attncc.lower import Plan, UnsupportedSpec
from attncc.render import render
from attncc.split import DecodeMetadata, num_splits
from attncc.target import TARGETS
from attncc.testing import with_config

from specs import EXTRA, gla, mla, separate_kv
from support import compile_quiet

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.attn"))
SMEM_CAP = 232448  # the largest dynamic shared memory of a CTA on sm_90 (227 KB)




def example(name: str):
    return compile_quiet(REPO / "examples" / f"{name}.attn")


def with_schedule(text: str, name: str, *knobs: str) -> str:
    return text + f"\nschedule {name} {{\n" + "".join(f"    {k}\n" for k in knobs) + "}\n"


GQA8_TEXT = (REPO / "examples" / "gqa8.attn").read_text()
MLA_ATTENTION = (REPO / "examples" / "mla.attn").read_text().split("schedule mla")[0]


# --- what the mma.sync kernel needs of a plan ---------------------------------------------

FP8 = ("e4m3", "e5m2")


def assert_rows_conflict_free(rows, cols: int) -> None:
    """A shared-memory row layout holds `cols` 16-bit values a row, and 8 consecutive rows'
    chunk c lands in 8 different 16-byte bank groups (what ldmatrix reads at once)."""
    assert rows.cols == cols and rows.pitch_bytes % 16 == 0 and rows.pitch_bytes >= 2 * cols
    chunks, pitch = cols // 8, rows.pitch_bytes // 16
    if rows.swizzle:
        assert chunks % 8 == 0 and pitch == chunks
    for c in range(chunks):
        groups = {(r * pitch + ((c ^ (r % 8)) if rows.swizzle else c)) % 8 for r in range(8)}
        assert len(groups) == 8, (rows, c)


def assert_regions(plan: Plan) -> None:
    """Shared memory: every region 16-byte aligned, inside the total, disjoint from the others,
    and as large as what the kernel keeps there."""
    cfg, lay = plan.config, plan.layout
    raw = lay.fp8
    regions = {
        "q": (cfg.q_off, cfg.q_rows.bytes(cfg.tile_m), cfg.tile_m * plan.d_k * 2),
        "kv": (cfg.kv_off, cfg.kv_buffers * cfg.kv_tile_bytes,
               (1 if raw else cfg.stages) * cfg.tile_n * lay.staged_width * 2),
        "raw": (cfg.raw_off, cfg.stages * cfg.raw_tile_bytes if raw else 0,
                cfg.stages * cfg.tile_n * lay.raw_pitch if raw else 0),
        "p": (cfg.p_off, cfg.p_rows.bytes(cfg.tile_m), cfg.tile_m * cfg.tile_n * 2),
        "slots": (cfg.slot_off, (cfg.stages + 1) * cfg.tile_n * 4, (cfg.stages + 1) * cfg.tile_n * 4),
        "red": (cfg.red_off, cfg.warps_n * cfg.tile_m * 4, cfg.warps_n * cfg.tile_m * 4),
        "work": (cfg.work_off, cfg.work_bytes, 21 * 4),
    }
    spans = []
    for name, (off, size, need) in regions.items():
        assert off % 16 == 0, name
        assert size >= need, (name, size, need)
        assert off + size <= cfg.smem_bytes, name
        if size:
            spans.append((off, off + size, name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        assert end <= start, f"{a} overlaps {b}"
    assert cfg.kv_tile_bytes == cfg.kv_rows.bytes(cfg.tile_n)
    assert cfg.raw_tile_bytes == lay.raw_pitch * cfg.tile_n
    assert cfg.walk_off >= 9 * 4 and cfg.work_bytes - cfg.walk_off >= 12 * 4
    assert_rows_conflict_free(cfg.q_rows, plan.d_k)
    assert_rows_conflict_free(cfg.kv_rows, lay.staged_width)
    assert_rows_conflict_free(cfg.p_rows, cfg.tile_n)


def assert_raw_row(plan: Plan) -> None:
    """fp8 staging: each run's bytes, then its scales, 16-byte padded, back to back."""
    at = 0
    for s in plan.layout.sources:
        elem_bytes = 1 if s.dtype in FP8 else 2
        assert s.raw_offset == at and s.raw_offset % 16 == 0
        assert s.raw_scale_offset == s.raw_offset + -(-s.width * elem_bytes // 16) * 16
        at = s.raw_scale_offset
        if s.scale:
            g = s.scale.group
            assert s.scale.first_group == s.seg_lo // g
            assert s.scale.count == (s.seg_lo + s.width - 1) // g - s.seg_lo // g + 1
            at += -(-s.scale.count * 4 // 16) * 16
    assert plan.layout.raw_pitch == at


def assert_hopper_legal(plan: Plan) -> None:
    """Every constraint the Hopper kernel states (hopper/traits.cuh's static_asserts)."""
    cfg, lay = plan.config, plan.layout
    assert plan.elem == "bf16"
    if plan.sparse or lay.fp8:  # the producer reads slots by cp.async / dequantizes in registers
        assert cfg.tma_rows == 0
    if cfg.seesaw:  # 64 rows, each consumer warp group half of the output; pairs of tiles
        assert (cfg.tile_m, cfg.tile_n, cfg.threads) == (64, 64, 384)
        assert cfg.stages >= 2 and cfg.stages % 2 == 0  # sets of a pair's two stages
        assert plan.d_v == 64 * cfg.value_boxes == 128 * cfg.out_boxes and cfg.early_boxes == cfg.out_boxes
        assert cfg.value_boxes <= cfg.p_box < cfg.boxes
        assert lay.key_runs == ((0, plan.d_k),) and (cfg.value_box, cfg.key_boxes) == (0, cfg.boxes)  # key = value ++ more
    else:  # stacked: 128 rows, each group 64 of them (or alternate tiles) and the whole output
        assert (cfg.tile_m, cfg.tile_n, cfg.threads) == (128, 64, 384) and plan.d_v <= 256
        assert cfg.stages >= 2 and plan.d_v == 64 * cfg.value_boxes == 64 * cfg.out_boxes
        assert cfg.early_boxes == cfg.boxes
        # the split mode's merge goes through the Q tile's region: O's two halves and (m, l) per thread
        assert 2 * (plan.d_v // 4) * 128 * 4 + 2 * 128 * 16 <= cfg.q_bytes
    # the key runs of whole staged boxes, the value one; a Q row is the key's boxes
    assert lay.staged_width == 64 * cfg.boxes and plan.d_k == 64 * cfg.key_boxes
    assert all(c % 64 == 0 and w % 64 == 0 and c + w <= 64 * cfg.boxes for c, w in lay.key_runs)
    assert lay.value_runs == ((64 * cfg.value_box, plan.d_v),) and cfg.value_box + cfg.value_boxes <= cfg.boxes
    assert plan.group >= 64
    for s in lay.sources:
        assert s.smem_col % 64 == 0 and s.width % 64 == 0
        if DTYPES[s.dtype].is_fp8:  # box pairs, 16-value chunks in one scale group, in one group of boxes
            assert s.width % 128 == 0 and s.scale.group % 16 == 0 and s.seg_lo % 16 == 0
            early = 64 * cfg.early_boxes
            assert not (s.smem_col < early < s.smem_col + s.width) or (early - s.smem_col) % 128 == 0
            assert cfg.producer_registers >= 72
    assert cfg.box_bytes == 64 * 128 and cfg.q_box_bytes == cfg.tile_m * 128
    assert cfg.kv_tile_bytes == cfg.boxes * cfg.box_bytes
    assert cfg.q_bytes >= cfg.key_boxes * cfg.q_box_bytes and cfg.q_bytes % 1024 == 0
    assert cfg.q_off % 1024 == 0 and cfg.kv_off == cfg.q_off + cfg.q_bytes
    assert cfg.bar_off == cfg.kv_off + cfg.stages * cfg.kv_tile_bytes
    assert cfg.flags_off >= cfg.bar_off + 8 * (cfg.stages * (cfg.boxes + 3) + 3) and cfg.flags_off % 16 == 0
    assert cfg.flags_pitch >= 80
    assert cfg.rows_off >= cfg.flags_off + cfg.stages * cfg.flags_pitch and cfg.rows_off % 16 == 0
    assert cfg.work_off >= cfg.rows_off + 5 * 64 * 4 and cfg.smem_bytes <= TARGETS[plan.target].smem_per_block
    # setmaxnreg trades within the launch's registers (an increase past them never returns); the
    # relay's WG1 its own budget, anything else both consumer groups the same
    assert 128 * (cfg.consumer_registers + cfg.wg1_registers + cfg.producer_registers) <= cfg.registers * cfg.threads
    assert cfg.relay or cfg.wg1_registers == cfg.consumer_registers
    assert not cfg.relay or (cfg.seesaw and cfg.stages == 2 and not cfg.crossover and not cfg.value_first)
    assert len({cfg.consumer_barrier, cfg.producer_barrier}) == 2 and 0 not in (
        cfg.consumer_barrier, cfg.producer_barrier) and cfg.barriers <= 16


def assert_legal(plan: Plan) -> None:
    """Every constraint the plan's kernel states (its traits.cuh's static_asserts)."""
    if plan.family == "hopper":
        return assert_hopper_legal(plan)
    cfg, lay = plan.config, plan.layout
    assert plan.family == "mma_sync"
    assert plan.elem in ("bf16", "fp16")
    assert plan.d_k % 16 == 0 and plan.d_v % 16 == 0
    for runs, width in ((lay.key_runs, plan.d_k), (lay.value_runs, plan.d_v)):
        assert sum(w for _, w in runs) == width
        for col, w in runs:
            assert col % 8 == 0 and w % 8 == 0 and w > 0
            assert col + w <= lay.staged_width
    assert lay.staged_width % 8 == 0
    assert lay.staged_width == sum(s.width for s in lay.sources)
    strides = [t.token_stride_bytes for t in lay.tensors]
    assert 1 <= len(lay.tensors) <= 8
    col = 0
    for s in lay.sources:
        assert s.smem_col == col, "sources are staged back to back in record order"
        col += s.width
        assert s.smem_col % 8 == 0 and s.smem_col + s.width <= lay.staged_width
        elem_bytes = 1 if s.dtype in FP8 else 2
        assert s.offset_bytes % 16 == 0
        assert s.copy_bytes == 16 or (s.copy_bytes == 8 and s.dtype in FP8)  # 8-byte halves: fp8 runs only
        assert s.head_stride_bytes % s.copy_bytes == 0
        assert strides[s.tensor] % 16 == 0
        assert (s.width * elem_bytes) % 16 == 0
        if s.dtype in FP8:
            assert s.scale is not None
            assert s.seg_lo % 16 == 0 and s.scale.group % 16 == 0
            assert s.scale.offset_bytes % 4 == 0 and s.scale.head_stride_bytes % 4 == 0
            assert strides[s.scale.tensor] % 4 == 0
        else:
            assert s.scale is None
            assert s.dtype == plan.elem
    assert_raw_row(plan)
    assert lay.fp8 == any(s.dtype in FP8 for s in lay.sources) == cfg.raw_staging
    assert 2 <= cfg.stages <= 8
    assert cfg.warps in (4, 8) and cfg.threads == 32 * cfg.warps
    assert cfg.tile_m % 16 == 0 and cfg.tile_n % 16 == 0
    assert cfg.tile_n <= cfg.threads
    # the warp layout: WM x WN warps cover the rows, the tokens and the value columns
    wr, wm, wn = cfg.warp_rows, cfg.warps_m, cfg.warps_n
    assert wr in (16, 32) and wm * wr == cfg.tile_m and wm * wn == cfg.warps
    assert cfg.m_tiles * 16 == wr
    assert cfg.tokens_per_warp * wn == cfg.tile_n and cfg.score_n_tiles * 8 == cfg.tokens_per_warp
    assert cfg.value_cols_per_warp * wn == plan.d_v and cfg.value_n_tiles * 8 == cfg.value_cols_per_warp
    assert cfg.value_n_tiles % 2 == 0, "O += P V takes value columns in pairs of n8 tiles"
    assert cfg.acc_registers == cfg.m_tiles * cfg.value_n_tiles * 4 <= 128
    assert wr * cfg.tokens_per_warp // 32 <= 32
    # policy flags, where they are legal
    if cfg.qk_split:
        assert wn % 2 == 0 and wr * 2 * cfg.tokens_per_warp // 32 <= 32
        assert all(c % 32 == 0 and w % 32 == 0 for c, w in lay.key_runs)
        assert wn * cfg.pair_slot_bytes <= cfg.p_rows.bytes(wr)
    assert cfg.qk_n_tiles == (2 if cfg.qk_split else 1) * cfg.score_n_tiles
    assert cfg.qk_steps * (32 if cfg.qk_split else 16) == plan.d_k
    assert cfg.qk_chains >= 1
    if cfg.ping_pong:
        assert wm == 2 and cfg.stages == 2 and not cfg.raw_staging and cfg.tile_n <= 32 * wn
        assert cfg.compute_bound
    assert cfg.copy_threads == (32 * wn if cfg.ping_pong else cfg.threads)
    assert 1 <= cfg.copy_steps <= cfg.qk_steps
    if cfg.copy_token_major:
        assert cfg.tile_n * 8 % cfg.copy_threads == 0
        assert cfg.raw_staging or all((s.smem_col // 8) % 8 == 0 for s in lay.sources)
    # named barriers: distinct ids below 16
    ids = [0] + list(range(cfg.row_group_barrier0, cfg.row_group_barrier0 + wm))
    ids += list(range(cfg.pair_barrier0, cfg.pair_barrier0 + (cfg.warps // 2 if cfg.qk_split else 0)))
    ids += list(range(cfg.full_barrier0, cfg.full_barrier0 + 4)) if cfg.ping_pong else []
    assert len(ids) == len(set(ids)) and max(ids) < cfg.barriers <= 16
    assert_regions(plan)
    assert cfg.smem_bytes <= SMEM_CAP
    assert cfg.smem_bytes <= TARGETS[plan.target].smem_per_block


def staged_columns(plan: Plan, runs) -> list[tuple[str, int]]:
    """(segment, index in segment) of every staged column a run list reads."""
    where = {}
    for s in plan.layout.sources:
        for i in range(s.width):
            where[s.smem_col + i] = (s.segment, s.seg_lo + i)
    return [where[c] for col, w in runs for c in range(col, col + w)]


def spec_columns(pieces) -> list[tuple[str, int]]:
    return [(p.segment, i) for p in pieces for i in range(p.lo, p.hi)]


ALL_SPECS = {p.stem: p for p in EXAMPLES} | EXTRA


@pytest.mark.parametrize("name", list(ALL_SPECS))
def test_plan_is_legal_and_reads_the_spec(name):
    k = compile_quiet(ALL_SPECS[name])
    plan = k.plan
    assert_legal(plan)
    spec = k.spec
    # key and value, as staged columns, are exactly the spec's concatenations
    assert staged_columns(plan, plan.layout.key_runs) == spec_columns(spec.key)
    assert staged_columns(plan, plan.layout.value_runs) == spec_columns(spec.value)
    # each cache element is staged at most once (MLA's latent feeds both products)
    staged = staged_columns(plan, [(0, plan.layout.staged_width)])
    assert len(staged) == len(set(staged))
    assert set(staged) == set(spec_columns(spec.key)) | set(spec_columns(spec.value))
    # numbers straight from the spec
    assert (plan.heads_q, plan.heads_kv, plan.group) == (spec.heads_q, spec.heads_kv, spec.group)
    assert (plan.d_k, plan.d_v, plan.page_size) == (spec.d_k, spec.d_v, spec.page_size)
    assert (plan.max_sq, plan.causal, plan.sparse, plan.topk) == (
        spec.max_query_len, spec.causal, spec.sparse, spec.topk)
    assert plan.num_sms == TARGETS[plan.target].sm_count
    # one tensor per storage tensor, token strides as DESIGN.md §2 lays them out
    layouts = attncc.storage.tensor_layouts(spec, 1)
    assert [t.name for t in plan.layout.tensors] == list(layouts)
    for t in plan.layout.tensors:
        shape, dtype = layouts[t.name]
        assert t.token_stride_bytes == math.prod(shape[2:]) * dtype.itemsize


def test_plan_canonical_json_round_trips():
    import json

    plan = example("mla_fp8_sparse").plan
    data = json.loads(plan.canonical_json())
    assert data == json.loads(json.dumps(plan.template_dict()))
    assert data["name"] == "mla_fp8_sparse" and data["layout"]["sources"][0]["scale"]["group"] == 128
    assert data["family"] == plan.family and "why" not in data["config"] and "refused" not in data


# --- sources per variant --------------------------------------------------------------

def source(plan, segment):
    found = [s for s in plan.layout.sources if s.segment == segment]
    assert len(found) == 1, plan.layout.sources
    return found[0]


def test_mla_latent_and_rope_staged_once_value_overlaps_key():
    plan = example("mla").plan
    assert [s.segment for s in plan.layout.sources] == ["latent", "rope"]
    latent, rope = source(plan, "latent"), source(plan, "rope")
    assert (latent.tensor, latent.offset_bytes, latent.width, latent.seg_lo, latent.smem_col) == (0, 0, 512, 0, 0)
    assert (rope.tensor, rope.offset_bytes, rope.width, rope.seg_lo, rope.smem_col) == (0, 1024, 64, 0, 512)
    assert plan.layout.staged_width == 576
    assert plan.layout.key_runs == ((0, 576),)
    assert plan.layout.value_runs == ((0, 512),)
    assert plan.layout.tensors[0].token_stride_bytes == 1152
    assert latent.scale is None and rope.scale is None


def test_gqa_k_and_v_sources_side_by_side():
    plan = example("gqa8").plan
    k, v = source(plan, "k"), source(plan, "v")
    assert (k.offset_bytes, k.head_stride_bytes, k.width, k.smem_col) == (0, 256, 128, 0)
    assert (v.offset_bytes, v.head_stride_bytes, v.width, v.smem_col) == (8 * 256, 256, 128, 128)
    assert plan.layout.key_runs == ((0, 128),) and plan.layout.value_runs == ((128, 128),)
    assert plan.layout.staged_width == 256
    assert plan.layout.tensors[0].token_stride_bytes == 8 * 2 * 256


def test_mqa_k_and_v_sources():
    plan = example("mqa").plan
    assert (source(plan, "v").offset_bytes, source(plan, "v").smem_col) == (256, 128)
    assert plan.layout.key_runs == ((0, 128),) and plan.layout.value_runs == ((128, 128),)


def test_gta4_key_runs_skip_the_rotated_half():
    plan = example("gta4").plan
    tied, rope = source(plan, "tied"), source(plan, "rope")
    assert (tied.width, tied.smem_col, tied.head_stride_bytes) == (128, 0, 256)
    assert (rope.width, rope.smem_col, rope.head_stride_bytes, rope.offset_bytes) == (64, 128, 0, 4 * 256)
    assert [list(r) for r in plan.layout.key_runs] == [[0, 64], [128, 64]]
    assert [list(r) for r in plan.layout.value_runs] == [[0, 128]]
    assert plan.d_k == 128 and plan.d_v == 128


def test_gla2_rope_is_shared_with_head_stride_zero():
    plan = example("gla2").plan
    latent, rope = source(plan, "latent"), source(plan, "rope")
    assert latent.head_stride_bytes == 512 and latent.offset_bytes == 0
    assert rope.head_stride_bytes == 0 and rope.offset_bytes == 2 * 512
    assert plan.layout.key_runs == ((0, 320),) and plan.layout.value_runs == ((0, 256),)
    assert plan.layout.tensors[0].token_stride_bytes == 2 * 512 + 128


def test_fp8_scales_follow_their_values():
    plan = example("mla_fp8_sparse").plan
    latent, rope = source(plan, "latent"), source(plan, "rope")
    assert latent.dtype == "e4m3" and plan.elem == "bf16"
    assert latent.scale is not None
    assert (latent.scale.tensor, latent.scale.offset_bytes, latent.scale.group) == (0, 512, 128)
    assert latent.scale.head_stride_bytes == latent.head_stride_bytes == 512 + 4 * 4
    assert rope.offset_bytes == 528 and rope.scale is None
    assert plan.layout.tensors[0].token_stride_bytes == 656  # FlashMLA's 656 bytes/token
    assert plan.sparse and plan.topk == 2048


def test_fp8_per_64_has_eight_scales_per_head():
    plan = compile_quiet(EXTRA["mla_fp8_per64"]).plan
    latent = source(plan, "latent")
    assert latent.scale.group == 64 and latent.scale.offset_bytes == 512
    assert latent.head_stride_bytes == 512 + 8 * 4
    assert source(plan, "rope").offset_bytes == 544
    assert plan.layout.tensors[0].token_stride_bytes == 544 + 128


SEPARATE_FP8 = """
attention sep_fp8 {
    heads q = 16, kv = 2
    cache paged(16) separate {
        c: e5m2[256] scale fp32 per 64
        r: bf16[64] shared
    }
    key   = c ++ r
    value = c
}
"""


def test_separate_storage_one_tensor_per_segment_plus_scales():
    plan = compile_quiet(SEPARATE_FP8).plan
    assert [(t.name, t.token_stride_bytes) for t in plan.layout.tensors] == [
        ("c", 2 * 256), ("c_scale", 2 * 4 * 4), ("r", 64 * 2)]
    c, r = source(plan, "c"), source(plan, "r")
    assert (c.tensor, c.offset_bytes, c.head_stride_bytes) == (0, 0, 256)
    assert (c.scale.tensor, c.scale.offset_bytes, c.scale.head_stride_bytes, c.scale.group) == (1, 0, 16, 64)
    assert (r.tensor, r.offset_bytes, r.head_stride_bytes, r.scale) == (2, 0, 0, None)
    assert plan.layout.key_runs == ((0, 320),) and plan.layout.value_runs == ((0, 256),)


def test_scale_tensor_needs_only_a_4_byte_token_stride():
    """The mma.sync kernel asks the scale tensor's token stride to be a multiple of 4 (scales are
    copied 4 bytes at a time); 2 scales per token (8 bytes) is a valid separate layout."""
    text = """
attention sep_two_scales {
    heads q = 16, kv = 1
    cache paged(16) separate {
        c: e4m3[256] scale fp32 per 128
        r: bf16[64]
    }
    key   = c ++ r
    value = c
}
"""
    plan = compile_quiet(text).plan
    assert [(t.name, t.token_stride_bytes) for t in plan.layout.tensors] == [("c", 256), ("c_scale", 8), ("r", 128)]
    assert_legal(plan)


def test_separate_bf16_gqa():
    plan = compile_quiet(EXTRA["gqa8_separate"]).plan
    assert [(t.name, t.token_stride_bytes) for t in plan.layout.tensors] == [("k", 8 * 256), ("v", 8 * 256)]
    k, v = source(plan, "k"), source(plan, "v")
    assert (k.tensor, k.offset_bytes, k.head_stride_bytes) == (0, 0, 256)
    assert (v.tensor, v.offset_bytes, v.head_stride_bytes) == (1, 0, 256)


def test_partial_slice_stages_only_what_is_read():
    text = """
attention part {
    heads q = 8, kv = 2
    cache paged(16) {
        big: bf16[256]
    }
    key   = big[32:96]
    value = big[128:192]
}
"""
    plan = compile_quiet(text).plan
    assert [(s.seg_lo, s.width, s.smem_col) for s in plan.layout.sources] == [(32, 64, 0), (128, 64, 64)]
    assert [s.offset_bytes for s in plan.layout.sources] == [64, 256]
    assert plan.layout.key_runs == ((0, 64),) and plan.layout.value_runs == ((64, 64),)
    assert_legal(plan)


# --- schedule knobs -------------------------------------------------------------------

def test_schedule_knobs_honoured():
    k = compile_quiet(with_schedule(GQA8_TEXT, "gqa8", "tile q = 32, kv = 32", "stages 3", "split_kv 4"))
    plan = k.plan
    assert (plan.config.tile_m, plan.config.tile_n, plan.config.stages, plan.split_kv) == (32, 32, 3, 4)
    assert_legal(plan)


def test_split_kv_off_and_target_sm80():
    plan = compile_quiet(with_schedule(GQA8_TEXT, "gqa8", "split_kv off", "target sm80")).plan
    assert plan.split_kv == "off" and plan.target == "sm80" and plan.num_sms == 108
    assert_legal(plan)


def test_sm80_target_fits_its_smaller_shared_memory():
    plan = compile_quiet(MLA_ATTENTION + "schedule mla {\n    target sm80\n}\n").plan
    assert plan.config.smem_bytes <= TARGETS["sm80"].smem_per_block == 163 * 1024
    assert_legal(plan)


def test_mla_example_schedule():
    plan = example("mla").plan
    assert (plan.config.tile_m, plan.config.tile_n, plan.config.stages, plan.split_kv) == (64, 64, 2, "auto")


@pytest.mark.parametrize("name, tile_n", [("gta4", 64), ("gqa8", 32), ("mla_h16", 32)])
def test_a_16_row_tile_streams_64_tokens_of_a_narrow_record(name, tile_n):
    # GTA-4 stages 192 columns: 32 tokens would stage 12 KB a tile, under STREAM_TILE_BYTES;
    # GQA-8's 256 and MLA's 576 columns stage 16 and 36 KB in 32 tokens and keep 32
    from attncc.families.mma_sync import STREAM_TILE_BYTES
    k = example(name) if name != "mla_h16" else compile_quiet(MLA_ATTENTION.replace("q = 128", "q = 16"))
    cfg = k.plan.config
    assert cfg.tile_m == 16 and cfg.tile_n == tile_n
    assert (cfg.kv_rows.bytes(32) < STREAM_TILE_BYTES) == (tile_n == 64)
    if tile_n == 64:
        assert "staging < 16 KB" in k.explain(batch=8, seqlen=1024)
    assert_legal(k.plan)


def knob_line(text: str, knob: str) -> tuple[int, int]:
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        if stripped.startswith(knob):
            return number, len(line) - len(stripped) + 1
    raise AssertionError(knob)


@pytest.mark.parametrize("knobs, knob, words", [
    (("tile q = 24, kv = 64",), "tile", "tile q = 24"),
    (("tile q = 80, kv = 64",), "tile", "tile q = 80"),
    (("tile q = 64, kv = 200",), "tile", "tile kv = 200"),
    (("tile q = 64, kv = 24",), "tile", "tile kv = 24"),
    (("stages 1",), "stages", "stages 1"),
    (("stages 9",), "stages", "stages 9"),
])
def test_impossible_schedule_is_an_error_at_the_knob(knobs, knob, words):
    text = with_schedule(MLA_ATTENTION, "mla", "split_kv auto", *knobs)
    with pytest.raises(attncc.SpecError) as info:
        attncc.compile(text)
    exc = info.value
    assert not isinstance(exc, UnsupportedSpec)
    line, col = knob_line(text, knob)
    assert (exc.span.line, exc.span.column) == (line, col)
    assert str(exc).startswith(f"<string>:{line}:{col}: ")
    assert words in exc.message
    assert "^" in str(exc)


def test_tile_overflowing_shared_memory_is_an_error_at_a_knob():
    text = with_schedule(MLA_ATTENTION, "mla", "tile q = 64, kv = 128", "stages 4")
    with pytest.raises(attncc.SpecError) as info:
        attncc.compile(text)
    exc = info.value
    tile, stages = knob_line(text, "tile"), knob_line(text, "stages")
    assert (exc.span.line, exc.span.column) in (tile, stages)
    assert str(exc).startswith(f"<string>:{exc.span.line}:{exc.span.column}: ")
    assert "shared memory" in exc.message and str(SMEM_CAP) in exc.message


def test_deep_pipeline_shrinks_the_default_tile():
    plan = compile_quiet(with_schedule(MLA_ATTENTION, "mla", "stages 8")).plan
    assert plan.config.stages == 8 and plan.config.tile_n < 64
    assert_legal(plan)


def test_too_many_stages_for_any_tile_is_an_error_at_stages():
    text = with_schedule(MLA_ATTENTION, "mla", "target sm80", "stages 8")
    with pytest.raises(attncc.SpecError) as info:
        attncc.compile(text)
    line, col = knob_line(text, "stages")
    assert (info.value.span.line, info.value.span.column) == (line, col)
    assert "shared memory" in info.value.message


def test_every_tile_q_the_error_message_offers_is_accepted():
    """The `tile q` error lists the row counts the kernel path takes: each must work."""
    with pytest.raises(attncc.SpecError) as info:
        attncc.compile(with_schedule(GQA8_TEXT, "gqa8", "tile q = 24, kv = 64"))
    offered = [int(n) for n in re.findall(r"\b(\d+)\b", info.value.message.split(":", 1)[1])
               if int(n) % 16 == 0 and 16 <= int(n) <= 64]
    assert offered, info.value.message
    for rows in offered:
        plan = compile_quiet(with_schedule(GQA8_TEXT, "gqa8", f"tile q = {rows}, kv = 64")).plan
        assert plan.config.tile_m == rows
        assert_legal(plan)


# --- specs the kernel path cannot take ------------------------------------------------

NARROW = """
attention narrow {
    heads q = 4, kv = 2
    cache paged(4) {
        k: bf16[8]
        v: bf16[8]
    }
    key   = k
    value = v
}
"""


def test_width_not_multiple_of_16_compiles_runs_on_cpu_and_plan_raises():
    k = attncc.compile(NARROW)  # no error: the reference can run it
    cache = k.new_cache(2, device="cpu")
    gen = torch.Generator().manual_seed(0)
    k.write_cache(cache, torch.arange(6), k=torch.randn(6, 2, 8, generator=gen),
                  v=torch.randn(6, 2, 8, generator=gen))
    q = torch.randn(1, 1, 4, 8, generator=gen).to(torch.bfloat16)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    seqlens = torch.tensor([6], dtype=torch.int32)
    out, lse = k(q, cache, table, seqlens)
    ref_out, ref_lse = attncc.reference.attention(k.spec, q, cache, table, seqlens)
    assert out.shape == (1, 1, 4, 8) and out.dtype == torch.bfloat16
    assert torch.equal(out, ref_out.to(torch.bfloat16)) and torch.equal(lse, ref_lse)
    for access in (lambda: k.plan, lambda: k.op):
        with pytest.raises(attncc.SpecError) as info:
            access()
        key_line = NARROW.split("\n").index("    key   = k") + 1
        assert str(info.value).startswith(f"<string>:{key_line}:5: ")
        assert "multiple of 16" in info.value.message and "8" in info.value.message
    assert "plan: none on this kernel path" in k.explain()


def test_misaligned_slice_is_unsupported_but_valid():
    text = """
attention odd {
    heads q = 4, kv = 1
    cache paged(4) {
        c: bf16[64]
    }
    key   = c[4:36]
    value = c[0:32]
}
"""
    k = attncc.compile(text)
    with pytest.raises(UnsupportedSpec) as info:
        k.plan
    assert info.value.span is not None and "16 bytes" in info.value.message


def test_unsupported_spec_with_a_schedule_still_compiles():
    text = with_schedule(NARROW, "narrow", "tile q = 16, kv = 64")
    k = attncc.compile(text)
    with pytest.raises(UnsupportedSpec):
        k.plan


SMALL_MLA = """
attention small_mla {
    heads q = 4, kv = 1
    cache paged(4) {
        latent: bf16[32]
        rope:   bf16[16]
    }
    key   = latent ++ rope
    value = latent
}
"""


def test_small_value_width_gets_a_legal_tile():
    """d_k 48, d_v 32 and 4 query heads meet every width/alignment rule; a legal layout
    exists (tile 32 x 64, 4 warps of 16 rows: WM 2, WN 2), so lowering must find one
    instead of reporting that no schedule fits."""
    k = attncc.compile(SMALL_MLA)
    assert_legal(k.plan)


# --- seesaw / crossover ---------------------------------------------------------------

def test_a_tolerated_knob_warns_not_yet_applied():
    """`seesaw` on a spec only mma_sync runs (a group of 16): run without it, with a warning
    at the caller and a line in explain."""
    source = mla(heads=16, extra="schedule mla_p64_h16 {\n    seesaw\n}\n")
    with pytest.warns(UserWarning, match="not yet applied") as record:
        k = attncc.compile(source)
    messages = [str(w.message) for w in record if "not yet applied" in str(w.message)]
    assert any("`seesaw`" in m and "mma_sync" in m for m in messages), messages
    assert all(w.filename == __file__ for w in record if "not yet applied" in str(w.message)), \
        "the warning points at the caller of attncc.compile"
    assert k.plan.not_applied == ("seesaw",)
    lines = [line for line in k.explain().splitlines() if "not yet applied" in line]
    assert len(lines) == 1 and "`seesaw`" in lines[0]


def test_crossover_is_applied_by_the_hopper_family_and_explained():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not yet applied"
        k = attncc.compile(REPO / "examples" / "mla_fp8_sparse.attn")
    cfg = k.plan.config
    assert k.plan.family == "hopper" and k.plan.not_applied == () and cfg.crossover and cfg.seesaw
    assert re.search(r"^\s+crossover\s+True\s+`crossover`: clusters of two CTAs", k.explain(), re.M)
    # no barrier of its own: EMPTY counts both CTAs' consumers (FULL per box, EMPTY early / late
    # and FLAGS per stage, three handoffs, Q_FULL and Q_EMPTY)
    barriers = cfg.stages * cfg.boxes + 3 * cfg.stages + 5
    assert cfg.bar_off + 8 * barriers <= cfg.flags_off < cfg.bar_off + 8 * barriers + 16
    plain = compile_quiet(EXTRA["sparse_fp8_h128"])
    assert plain.plan.family == "hopper" and not plain.plan.config.crossover
    assert re.search(r"^\s+crossover\s+False\s+not chosen: each CTA converts", plain.explain(), re.M)


def test_the_paged_16bit_seesaw_has_a_value_first_form_for_calls_of_few_rows():
    """The seesaw's 16-bit cp.async plans (a page TMA cannot take) carry a second, value-first form
    of their kernels (WG1's product of tile a before S_b) for calls of at most 128 query rows a
    kv head, and explain says so; the plan's own form keeps the plain seesaw order. A TMA page,
    the stacked schedule, sparse bf16 and the fp8 plans (value first in their own form) have none."""
    for name, source in (("mla_page1_h128", EXTRA["mla_page1_h128"]), ("mla page 8", mla(page=8, heads=128))):
        plan = compile_quiet(source).plan
        cfg = plan.config
        assert plan.family == "hopper" and cfg.seesaw and cfg.tma_rows == 0, name
        assert cfg.value_first_rows == 128 and not cfg.value_first and not cfg.relay, name
        source_text = render(plan)
        assert "static constexpr int kValueFirstRows = 128;" in source_text, name
        assert "static constexpr bool kValueFirst = false;" in source_text, name
        text = plan.explain_lines(1, 4096, 1)
        assert any(re.search(r"value_first_rows\s+128\s+a second form, value first, for calls of at most 128 "
                             r"query rows a kv head", line) for line in text), name
    for name in ("mla_page16", "gla2_page5", "sparse_bf16_h128", "sparse_fp8_h128", "mla_fp8_crossover"):
        assert compile_quiet(EXTRA[name]).plan.config.value_first_rows == 0, name
    page64 = compile_quiet(mla(heads=128)).plan
    assert page64.config.value_first_rows == 0
    assert any(re.search(r"value_first_rows\s+0\s+no second form: the value first measured slower where TMA", line)
               for line in page64.explain_lines(1, 4096, 1))


def test_the_fp8_seesaw_is_paced_by_its_producer_and_says_so():
    """Where the seesaw's producer converts fp8 tiles itself (no TMA), the lowering loads slots a
    tile ahead and runs the relay (WG0 alone computes S and hands P to WG1: 192 / 160 / 152
    registers); with crossover it keeps the seesaw, WG1's products value first; explain says why
    each way. Not for bf16 MLA (the seesaw) or the stacked schedule."""
    crossed = compile_quiet((REPO / "examples" / "mla_fp8_sparse.attn").read_text()).plan
    assert crossed.config.crossover and not crossed.config.relay
    assert crossed.config.value_first and crossed.config.slots_ahead and crossed.config.tma_rows == 0
    text = crossed.explain_lines(1, 4096, 1)
    assert any(re.search(r"value_first\s+True\s+the producer's fp8 conversion sets the pace", line) for line in text)
    assert any(re.search(r"relay\s+False\s+not chosen: `crossover` pairs the seesaw's stages", line) for line in text)
    rendered = render(crossed)
    assert "static constexpr bool kValueFirst = true;" in rendered and "static constexpr bool kRelay = false;" in rendered
    for name in ("sparse_fp8_h128", "sparse_fp8_h64", "mla_fp8_page1_h64", "mla_fp8_per128_h64"):
        relay = compile_quiet(EXTRA[name]).plan
        cfg = relay.config
        assert relay.family == "hopper" and cfg.relay and cfg.slots_ahead and not cfg.value_first, name
        assert (cfg.consumer_registers, cfg.wg1_registers, cfg.producer_registers) == (192, 160, 152), name
        text = relay.explain_lines(1, 4096, 1)
        assert any(re.search(r"relay\s+True\s+chosen: the producer's fp8 conversion sets the pace", line) for line in text)
        assert any(re.search(r"slots_ahead\s+True\s+the next tile's page numbers / indices", line) for line in text)
        assert any(re.search(r"value_first\s+False\s+relay: WG1 computes no S", line) for line in text)
    rendered = render(relay)
    for line in ("static constexpr bool kRelay = true;", "static constexpr bool kSlotsAhead = true;",
                 "static constexpr int kConsumerRegisters = 192;", "static constexpr int kWg1Registers = 160;",
                 "static constexpr int kProducerRegisters = 152;"):
        assert line in rendered, line
    for source in (mla(heads=128), EXTRA["gla_fp8_e5m2"]):
        cfg = compile_quiet(source).plan.config
        assert not cfg.value_first and not cfg.slots_ahead and not cfg.relay, source[:60]
        assert cfg.wg1_registers == cfg.consumer_registers
    bf16 = compile_quiet(mla(heads=128)).explain()
    assert re.search(r"^\s+relay\s+False\s+not chosen: both consumer warp groups compute scores", bf16, re.M)
    # `seesaw` written on an fp8 MLA whose producer converts: the seesaw itself, not the relay
    knob = compile_quiet(EXTRA["mla_fp8_page1_h64"] + "\nschedule mla_fp8_page1_h64 {\n    seesaw\n}\n")
    assert (knob.plan.config.relay, knob.plan.config.value_first, knob.plan.config.consumer_registers) == (False, True, 216)
    assert re.search(r"^\s+relay\s+False\s+not chosen: `seesaw` asks for the seesaw", knob.explain(), re.M)
    # ... and on GLA's 256-wide fp8 latent (two sets of stages fit there, which the relay would
    # not take either: the only way to two sets with a converting producer is this knob)
    sets = compile_quiet(EXTRA["gla_fp8_e5m2"] + "\nschedule gla_fp8_e5m2 {\n    seesaw\n}\n")
    assert (sets.plan.config.stages, sets.plan.config.relay, sets.plan.config.value_first) == (4, False, True)
    assert re.search(r"^\s+relay\s+False\s+not chosen: `seesaw` asks for the seesaw", sets.explain(), re.M)


def test_measured_choices_say_where_they_are_taken_and_a_config_override_flips_them():
    """skip_unmoved (the seesaw's rescales of O skipped by a warp vote) is taken on every seesaw
    plan but the relay's; producer_fences (the producer lands and fences its 16-bit boxes) on TMA
    plans (their rare cp.async tiles) and group-fenced fp8 plans (the rope rides the group's
    fence), not on bf16 cp.async plans (measured slower) nor crossover; explain gives the reason
    or the A/B's figures each way. testing.with_config (bench/ab_build.py's, sanitize.py's and
    clock_trace.py's --config) flips a choice in the rendered config and refuses unknown fields
    and values by name."""
    k = compile_quiet(mla(heads=128))
    seesaw = k.plan
    assert seesaw.config.seesaw and not seesaw.config.relay and seesaw.config.skip_unmoved
    assert re.search(r"^\s+skip_unmoved\s+True\s+chosen: a warp skips a rescale of O .* s_q 2 0.973", k.explain(), re.M)
    relay = compile_quiet(EXTRA["sparse_fp8_h128"])
    assert not relay.plan.config.skip_unmoved
    assert re.search(r"^\s+skip_unmoved\s+False\s+not with the relay", relay.explain(), re.M)
    stacked = compile_quiet((REPO / "examples" / "gla2.attn").read_text())
    assert not stacked.plan.config.skip_unmoved and not stacked.plan.config.seesaw
    assert re.search(r"^\s+skip_unmoved\s+False\s+not chosen \(stacked\): where it fits .* s_q 2 1.020", stacked.explain(), re.M)
    assert stacked.plan.config.overlap
    assert re.search(r"^\s+overlap\s+True\s+chosen \(rows mode; FA3's order\)", stacked.explain(), re.M)
    page5 = compile_quiet(gla("g", heads=128, kv=2, page=5))  # a cp.async producer: fits 40 registers
    assert page5.plan.config.overlap and page5.plan.config.tma_rows == 0
    assert (page5.plan.config.consumer_registers, page5.plan.config.producer_registers) == (232, 40)
    page16 = compile_quiet(gla("g", heads=128, kv=2, page=16))  # four page numbers a tile: more than 40
    assert not page16.plan.config.overlap and not page16.plan.config.seesaw and page16.plan.config.tma_rows == 16
    assert (page16.plan.config.consumer_registers, page16.plan.config.producer_registers) == (224, 56)
    assert re.search(r"^\s+overlap\s+False\s+not chosen: at 224 registers its parts kernels spilled", page16.explain(), re.M)
    page1 = compile_quiet(mla(heads=128, page=1))
    assert page1.plan.config.tma_rows == 0 and not page1.plan.config.producer_fences
    assert re.search(r"^\s+producer_fences\s+False\s+not chosen: .* MLA s_q 2 1.037", page1.explain(), re.M)
    assert seesaw.config.tma_rows and seesaw.config.producer_fences
    assert re.search(r"^\s+producer_fences\s+True\s+a TMA plan's rare cp.async tiles", k.explain(), re.M)
    assert relay.plan.config.group_fence and relay.plan.config.producer_fences
    assert re.search(r"^\s+producer_fences\s+True\s+chosen: the producer lands and fences each group .* h_q 64 0.994",
                     relay.explain(), re.M)
    fp8_stacked = compile_quiet(EXTRA["gla_fp8_e5m2"]).plan.config
    assert fp8_stacked.group_fence and fp8_stacked.producer_fences
    knob = compile_quiet(EXTRA["mla_fp8_page1_h64"] + "\nschedule mla_fp8_page1_h64 {\n    seesaw\n}\n").plan.config
    assert not knob.group_fence and not knob.producer_fences and knob.skip_unmoved  # the fp8 seesaw: a fence a pair
    crossed = compile_quiet((REPO / "examples" / "mla_fp8_sparse.attn").read_text())
    assert crossed.plan.config.crossover and not crossed.plan.config.producer_fences and crossed.plan.config.skip_unmoved
    assert re.search(r"^\s+producer_fences\s+False\s+crossover: the producer fences what it shares", crossed.explain(), re.M)
    assert "static constexpr bool kProducerFences = true;" in render(with_config(page1.plan, ["producer_fences=true"]))
    off = with_config(seesaw, ["skip_unmoved=false", "stages=2"])
    assert not off.config.skip_unmoved and off.config.stages == 2 and off.config.tile_n == seesaw.config.tile_n
    assert "static constexpr bool kSkipUnmoved = false;" in render(off)
    assert "static constexpr bool kSkipUnmoved = true;" in render(seesaw)
    with pytest.raises(ValueError, match="'skip_unmovd=true': expected FIELD=VALUE with FIELD a field of the hopper kernel config"):
        with_config(seesaw, ["skip_unmovd=true"])
    with pytest.raises(ValueError, match="'skip_unmoved=yes': VALUE is true, false or an int"):
        with_config(seesaw, ["skip_unmoved=yes"])
    with pytest.raises(ValueError, match="expected FIELD=VALUE"):
        with_config(seesaw, ["skip_unmoved"])


CROSSOVER_REFUSALS = [
    # (spec without the knob, what the refusal says)
    (mla(heads=128), "this cache has no fp8 run"),
    (EXTRA["gla_fp8_e5m2"], "this plan is stacked"),
    (EXTRA["mla_fp8_page1_h64"], "a group of a multiple of 128 query heads; this one is 64"),
]


@pytest.mark.parametrize("source, words", CROSSOVER_REFUSALS, ids=["bf16", "stacked", "group64"])
def test_crossover_where_it_cannot_apply_is_an_error_at_the_knob(source, words):
    name = re.search(r"^attention (\w+)", source, re.M)[1]
    text = source.rstrip() + f"\nschedule {name} {{\n    crossover\n}}\n"
    knob_line = text.splitlines().index("    crossover") + 1
    with pytest.raises(attncc.SpecError) as err:
        attncc.compile(text)
    message = str(err.value)
    assert f":{knob_line}:5:" in message and words in message, message
    assert "mma_sync: does not apply `crossover`" in message, message


def test_seesaw_is_applied_by_the_hopper_family_and_explained():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not yet applied"
        k = attncc.compile(REPO / "examples" / "mla.attn")
    assert k.plan.family == "hopper" and k.plan.not_applied == () and k.plan.config.seesaw
    text = k.explain()
    assert re.search(r"family hopper \(sm_90a warp-specialized wgmma, seesaw, relay or stacked schedule\)", text)
    assert re.search(r"^\s+seesaw\s+True\s+`seesaw`", text, re.M)


def test_the_hopper_family_picks_the_seesaw_without_the_knob_and_says_so():
    k = attncc.compile(mla(heads=64))
    assert k.plan.family == "hopper" and k.plan.config.seesaw
    assert re.search(r"^\s+seesaw\s+True\s+chosen: a 512-wide value splits", k.explain(), re.M)


def test_the_hopper_family_runs_gla2_stacked_and_says_why_not_the_seesaw():
    k = attncc.compile(REPO / "examples" / "gla2.attn")
    cfg = k.plan.config
    assert k.plan.family == "hopper" and not cfg.seesaw and cfg.tile_m == 128 and cfg.out_boxes == 4
    assert (cfg.consumer_registers, cfg.producer_registers) == (232, 40)  # the overlap's 232 (STACKED_OVERLAP_REGISTERS)
    text = k.explain()
    assert re.search(r"^\s+seesaw\s+False\s+not chosen: a 256-wide value fits one warp group's accumulators", text, re.M)
    assert re.search(r"^\s+tile_m\s+128\s+stacked: one wgmma M \(64 rows\) per consumer warp group, each token "
                     r"read once for 128 rows", text, re.M)
    assert "family hopper (sm_90a warp-specialized wgmma, seesaw, relay or stacked schedule)" in text


def test_the_seesaw_knob_keeps_gla2_on_the_seesaw_with_halves_of_128():
    k = attncc.compile(gla("g", heads=128, kv=2, extra="schedule g {\n    seesaw\n}\n"))
    cfg = k.plan.config
    assert k.plan.family == "hopper" and cfg.seesaw and cfg.tile_m == 64
    assert cfg.out_boxes == 2 and cfg.early_boxes == 2 and cfg.p_box == 4
    assert (cfg.consumer_registers, cfg.producer_registers) == (216, 72)
    assert re.search(r"^\s+seesaw\s+True\s+`seesaw`", k.explain(), re.M)


@pytest.mark.parametrize("latent, stacked", [(64, True), (128, True), (256, True), (512, False)])
def test_the_stacked_schedule_takes_values_one_warp_group_holds(latent, stacked):
    k = attncc.compile(gla("g", heads=128, kv=2, latent=latent))
    assert k.plan.family == "hopper" and k.plan.config.seesaw is not stacked
    assert k.plan.config.tile_m == (128 if stacked else 64)


@pytest.mark.parametrize("d_k, d_v, order, key_box, value_box", [
    (256, 256, "kv", 0, 4), (128, 128, "kv", 0, 2), (64, 64, "vk", 1, 0), (128, 64, "vk", 1, 0), (64, 256, "kv", 0, 1)])
def test_the_stacked_schedule_takes_a_key_and_value_of_their_own(d_k, d_v, order, key_box, value_box):
    """MQA / GQA: S = Q K^T reads the key's boxes and O += P V the value's, wherever each is staged
    (hopper/tile.cuh scores_issue, stacked.cuh); a Q row is the key's boxes."""
    k = attncc.compile(separate_kv("s", heads=128, d_k=d_k, d_v=d_v, order=order))
    cfg = k.plan.config
    assert k.plan.family == "hopper" and not cfg.seesaw
    assert k.plan.layout.key_runs == ((64 * key_box, d_k),)
    assert (cfg.key_boxes, cfg.value_box, cfg.value_boxes) == (d_k // 64, value_box, d_v // 64)
    assert cfg.boxes == (d_k + d_v) // 64 and cfg.kv_tile_bytes == cfg.boxes * 8192
    assert_hopper_legal(k.plan)


def test_the_q_region_holds_the_split_merge_where_the_key_is_narrower():
    """A key of 128 columns is a 32 KB Q tile; the split mode's merge (s_q 1, 64 rows: half of
    each group's O and its (m, l)) needs 36 KB, so the region is the merge's, rounded to 1 KB."""
    cfg = attncc.compile(separate_kv("s", heads=64, d_k=128, d_v=128)).plan.config
    assert cfg.key_boxes * cfg.q_box_bytes == 32768
    assert cfg.q_bytes == 2 * 32 * 128 * 4 + 2 * 128 * 16 == cfg.kv_off - cfg.q_off == 36864


def test_the_overlap_of_a_narrow_value_leaves_the_producer_72_registers():
    k = attncc.compile(separate_kv("s", heads=128, kv=2, page=5))
    cfg = k.plan.config
    assert cfg.overlap and (cfg.consumer_registers, cfg.producer_registers) == (216, 72)
    assert "a value of at most 128 columns with the overlap: 216" in k.explain()
    wide = attncc.compile(separate_kv("w", heads=128, d_k=256, d_v=256, page=5)).plan.config
    assert wide.overlap and (wide.consumer_registers, wide.producer_registers) == (232, 40)


def test_the_seesaw_knob_on_a_key_and_value_of_their_own_is_not_applied_and_says_why():
    text = separate_kv("s", heads=128, extra="schedule s {\n    seesaw\n}\n")
    with pytest.warns(UserWarning, match="`seesaw` is not yet applied: attncc runs `s` on the mma_sync family"):
        k = attncc.compile(text)
    why = dict(k.plan.refused)["hopper"]
    assert "the seesaw needs the value to be the first staged columns" in why and "takes separate ones" in why


def test_the_stacked_schedule_takes_a_key_of_several_runs_gta_shaped():
    """GTA: key = tied[0:64] ++ rope, value = tied: the key's boxes 0 and 2 of the staged row
    (tied, rope), read in that order against the Q tile's columns 0 and 64."""
    text = """attention g {
    heads q = 128, kv = 2
    cache paged(16) { tied: bf16[128]  rope: bf16[64] shared }
    key = tied[0:64] ++ rope
    value = tied
}"""
    k = attncc.compile(text)
    cfg = k.plan.config
    assert k.plan.family == "hopper" and not cfg.seesaw and k.plan.layout.key_runs == ((0, 64), (128, 64))
    assert (cfg.boxes, cfg.key_boxes, cfg.value_box, cfg.value_boxes) == (3, 2, 0, 2)
    assert_hopper_legal(k.plan)


def test_hopper_refuses_a_key_off_whole_boxes_and_says_where():
    k = compile_quiet(separate_kv("s", heads=128).replace("key = k", "key = k ++ v[0:32]"))
    assert k.plan.family == "mma_sync"
    assert "needs a key of whole 64-column boxes; it has a run of 160 from staged column 0" in dict(k.plan.refused)["hopper"]


def test_the_stacked_schedule_refuses_a_value_of_no_wgmma_n():
    k = compile_quiet(gla("g", heads=128, kv=2, latent=192))
    assert k.plan.family == "mma_sync"
    assert "the stacked schedule holds a value of 64, 128, 256 columns" in dict(k.plan.refused)["hopper"]
    assert "this value is 192 wide" in dict(k.plan.refused)["hopper"]


@pytest.mark.parametrize("heads, sq, causal", [(64, 2, True), (128, 1, False)])
def test_the_hopper_family_takes_mla_with_a_group_of_64_or_more(heads, sq, causal):
    assert attncc.compile(mla(heads=heads, sq=sq, causal=causal)).plan.family == "hopper"


@pytest.mark.parametrize("heads", [16, 32])
def test_the_hopper_family_leaves_a_group_under_64_to_mma_sync(heads):
    k = attncc.compile(mla(heads=heads))
    assert k.plan.family == "mma_sync"
    refused = dict(k.plan.refused)
    assert "memory-bound" in refused["hopper"], refused


@pytest.mark.parametrize("page, rows, words", [
    (64, 64, "TMA: a tile's 64 tokens are one run of a page"), (128, 64, "TMA"),
    (256, 64, "TMA"), (16, 16, "TMA: a tile's 64 tokens are 4 whole pages, a copy a page and box, each page's by a producer warp"),
    (32, 32, "TMA: a tile's 64 tokens are 2 whole pages"),
    (8, 0, "cp.async: page 8 splits a tile's 64 tokens over more than 4 pages"),
    (1, 0, "cp.async: page 1"), (5, 0, "cp.async: page 5 splits a tile's 64 tokens over pages unevenly"),
    (96, 0, "cp.async: page 96")])
def test_the_hopper_family_copies_by_tma_where_a_tile_is_whole_pages(page, rows, words):
    k = attncc.compile(mla(page=page))
    assert k.plan.family == "hopper" and k.plan.config.tma_rows == rows
    assert re.search(r"^\s+tma_rows\s+" + str(rows) + r"\s+" + re.escape(words), k.explain(), re.M)


def test_the_stacked_schedule_spreads_a_one_page_tiles_copies_over_the_producer_warps():
    """spread_copies: box b of a one-page TMA tile issued by warp b % 4 where measured faster
    (stacked), by thread 0 on the seesaw (measured even or slower), off where no tile is one
    page (page 16's tile is four pages, page 1's goes by cp.async); explain gives the A/B's
    figures each way."""
    stacked = attncc.compile(REPO / "examples" / "gla2.attn")
    assert not stacked.plan.config.seesaw and stacked.plan.config.tma_rows == 64 and stacked.plan.config.spread_copies
    assert re.search(r"^\s+spread_copies\s+True\s+chosen \(stacked\): .* GLA-2 s_q 2 0.985", stacked.explain(), re.M)
    seesaw = attncc.compile(mla(heads=128))
    assert seesaw.plan.config.seesaw and not seesaw.plan.config.spread_copies
    assert re.search(r"^\s+spread_copies\s+False\s+not chosen: .* MLA b=128 s_q 1 0.999", seesaw.explain(), re.M)
    for k in (attncc.compile(gla("g", heads=128, kv=2, page=16)), attncc.compile(mla(heads=128, page=1))):
        assert not k.plan.config.spread_copies
        assert re.search(r"^\s+spread_copies\s+False\s+no one-page TMA tile", k.explain(), re.M)


def test_the_hopper_family_keeps_two_pairs_of_tiles_in_flight_where_they_fit():
    seesaw = "schedule g {\n    seesaw\n}\n"
    gla2 = attncc.compile(gla("g", heads=128, kv=2, extra=seesaw))  # Q 40 KB + 4 stages of 40 KB
    assert gla2.plan.family == "hopper" and gla2.plan.config.stages == 4
    assert re.search(r"^\s+stages\s+4\s+2 sets of a pair's 2 stages: the producer runs up to two pairs ahead",
                     gla2.explain(), re.M)
    mla_ = attncc.compile(mla())  # Q 72 KB + 2 stages of 72 KB: no room for a second set
    assert mla_.plan.family == "hopper" and mla_.plan.config.stages == 2
    assert re.search(r"^\s+stages\s+2\s+1 set of a pair's 2 stages: a second set \(4 x 73728 B\) does not fit",
                     mla_.explain(), re.M)
    knob = attncc.compile(gla("g", heads=128, kv=2, extra="schedule g {\n    seesaw\n    stages 2\n}\n"))
    assert knob.plan.family == "hopper" and knob.plan.config.stages == 2
    assert re.search(r"^\s+stages\s+2\s+`stages`", knob.explain(), re.M)


def test_the_stacked_schedule_keeps_as_many_tiles_in_flight_as_fit():
    gla2 = attncc.compile(REPO / "examples" / "gla2.attn")  # Q 80 KB + 3 stages of 40 KB (4: 240 KB)
    assert gla2.plan.family == "hopper" and gla2.plan.config.stages == 3
    assert re.search(r"^\s+stages\s+3\s+as many tiles in flight as fit beside the 128-row Q tile", gla2.explain(), re.M)
    small = attncc.compile(gla("g", heads=128, kv=2, latent=128))  # Q 48 KB + 4 of 24 KB
    assert small.plan.config.stages == 4
    odd = attncc.compile(gla("g", heads=128, kv=2, extra="schedule g {\n    stages 3\n}\n"))  # any count
    assert odd.plan.family == "hopper" and odd.plan.config.stages == 3


@pytest.mark.parametrize("extra, words", [
    ("seesaw\n    stages 3", "`stages 3`: the seesaw keeps pairs of tiles in sets of 2 stages"),
    ("stages 6", "shared memory (Q and 6 stages of 40960 B)")])
def test_the_hopper_family_refuses_stages_it_cannot_keep_at_the_knob(extra, words):
    text = gla("g", heads=128, kv=2, extra=f"schedule g {{\n    {extra}\n}}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = attncc.compile(text)
    assert k.plan.family == "mma_sync"
    assert words in dict(k.plan.refused)["hopper"], dict(k.plan.refused)["hopper"]


def test_the_hopper_family_refusals_name_the_knob_and_the_limit():
    text = mla(heads=128, extra="schedule mla_p64_h128 {\n    tile q = 32, kv = 64\n}\n")
    k = attncc.compile(text)  # mma_sync takes the tile the seesaw cannot
    assert k.plan.family == "mma_sync"
    assert "`tile q = 32, kv = 64`: the seesaw runs 64 x 64" in dict(k.plan.refused)["hopper"]
    for spec, words in ((mla(heads=128, elem="fp16"), "runs bf16 records"),
                        ("attention wide {\n    heads q = 128, kv = 1\n    cache paged(64) { latent: bf16[384]  rope: bf16[64] }\n"
                         "    key = latent ++ rope\n    value = latent\n}\n", "this value is 384 wide"),
                        ("attention odd_fp8 {\n    heads q = 128, kv = 1\n    cache paged(64) {\n"
                         "        a: e4m3[192] scale fp32 per 48\n        b: bf16[64]\n        r: bf16[64]\n    }\n"
                         "    key = a ++ b ++ r\n    value = a ++ b\n}\n",
                         "dequantizes fp8 in pairs of 64-column boxes (128 values a token); this run is 192 wide")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            k = attncc.compile(spec)
        assert k.plan.family == "mma_sync" and words in dict(k.plan.refused)["hopper"], dict(k.plan.refused)


def test_the_hopper_family_runs_fp8_and_sparse():
    k = attncc.compile(REPO / "examples" / "mla_fp8_sparse.attn")
    assert k.plan.family == "hopper" and k.plan.not_applied == ()
    assert k.plan.config.tma_rows == 0 and "sparse top-k" in k.plan.config.reason("tma_rows")
    k = compile_quiet(EXTRA["gla_fp8_e5m2"])  # stacked: the fp8 producer takes 72 registers
    assert (k.plan.family, k.plan.config.seesaw) == ("hopper", False)
    assert (k.plan.config.consumer_registers, k.plan.config.producer_registers) == (216, 72)
    assert "fp8 runs are dequantized by the producer" in k.plan.config.reason("tma_rows")


def test_no_warning_without_hopper_knobs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = attncc.compile(REPO / "examples" / "gqa8.attn")
    assert k.plan.not_applied == ()
    assert "not yet applied" not in k.explain()


# --- num_splits and k.plan(seqlens) ---------------------------------------------------

def test_num_splits_off_is_one():
    plan = compile_quiet(with_schedule(GQA8_TEXT, "gqa8", "split_kv off")).plan
    for batch, kv in [(1, 1), (1, 100_000), (64, 8192)]:
        assert num_splits(plan, batch, 1, kv, 132) == 1


def test_num_splits_fixed_is_capped_by_tiles():
    plan = compile_quiet(with_schedule(GQA8_TEXT, "gqa8", "split_kv 4")).plan
    n = plan.config.tile_n
    assert num_splits(plan, 1, 1, 1, 132) == 1
    assert num_splits(plan, 1, 1, n, 132) == 1
    assert num_splits(plan, 1, 1, n + 1, 132) == 2
    assert num_splits(plan, 1, 1, 3 * n, 132) == 3
    assert num_splits(plan, 1, 1, 100 * n, 132) == 4
    assert num_splits(plan, 1000, 1, 100 * n, 132) == 4  # fixed: whatever the batch
    assert num_splits(plan, 1, 1, 0, 132) == 1


def units(plan, batch, s_q):
    rows = plan.group * (1 if plan.sparse else s_q)
    return batch * (s_q if plan.sparse else 1) * plan.heads_kv * math.ceil(rows / plan.config.tile_m)


@pytest.mark.parametrize("name", ["gqa8", "mla", "gla2", "mqa"])
def test_num_splits_auto_fills_the_sms(name):
    plan = example(name).plan
    for batch in (1, 2, 3, 8):
        for sms in (108, 132):
            splits = num_splits(plan, batch, 1, 1 << 16, sms)
            ctas = units(plan, batch, 1)
            assert splits * ctas >= sms, (batch, sms, splits)
            assert (splits - 1) * ctas < sms, "no more splits than it takes to fill the SMs"
    # a full machine from batch alone: no split
    assert num_splits(plan, 1024, 1, 1 << 16, 132) == 1


MQA256_TEXT = (REPO / "examples" / "mqa.attn").read_text().replace("[128]", "[256]")


@pytest.mark.parametrize("text, per_sm, splits", [(MQA256_TEXT, 1, 1), (None, 2, 2)])
def test_num_splits_auto_leaves_a_nearly_full_wave_unsplit(text, per_sm, splits):
    # b=128 of MQA (one CTA a sequence) on 132 SMs: at 1 CTA per SM (d 256) the 128 CTAs are
    # one wave at 97% and a split would make two; at 2 per SM (d 128) they fill half the slots
    plan = compile_quiet(text).plan if text else example("mqa").plan
    assert plan.ctas_per_sm == per_sm and units(plan, 128, 1) == 128
    assert num_splits(plan, 128, 1, 8192, 132) == splits
    if per_sm == 1:  # the bound: 95% of 132 slots is 125.4 CTAs
        assert num_splits(plan, 126, 1, 8192, 132) == 1 and num_splits(plan, 125, 1, 8192, 132) == 2


@pytest.mark.parametrize("kv", [0, 1, 17, 64, 200, 255])
@pytest.mark.parametrize("name", ["gqa8", "mla", "mla_fp8_sparse"])
def test_num_splits_auto_never_splits_under_256_tokens(name, kv):
    plan = example(name).plan
    assert num_splits(plan, 1, 1, kv, 132) == 1


@given(kv=st.integers(1, 20_000), batch=st.integers(1, 8), s_q=st.integers(1, 2))
@settings(max_examples=300, deadline=None)
def test_num_splits_auto_splits_hold_at_least_256_tokens(kv, batch, s_q):
    """lower.num_splits: 'never so many that a split holds fewer than
    MIN_TOKENS_PER_SPLIT tokens' (on average: kv / splits >= 256)."""
    plan = example("mla").plan
    splits = num_splits(plan, batch, s_q, kv, 132)
    assert splits >= 1
    if splits > 1:
        assert kv / splits >= split.MIN_TOKENS_PER_SPLIT, (kv, splits)


def test_plan_call_reads_no_length():
    """k.plan(seqlens) is shapes only (DESIGN.md §3a: no host sync): lengths that differ give
    the same metadata; a split plan takes max_seqlen from the caller, or balanced parts."""
    k = example("gqa8")
    assert not split.balanced(k.plan)

    class Unreadable(list):  # a length read back would raise
        def __iter__(self):
            raise AssertionError("k.plan read a length")

        def tolist(self):
            raise AssertionError("k.plan read a length")

    meta = k.plan(Unreadable([0, 0, 0]))
    assert isinstance(meta, DecodeMetadata) and meta.num_splits < 0 and meta.longest is None
    assert k.plan(torch.tensor([100, 8192, 7], dtype=torch.int32)) == k.plan([5, 5, 5]) == meta
    known = k.plan([100, 8192, 7], max_seqlen=8192)
    assert known == DecodeMetadata(num_splits(k.plan, 3, 1, 8192, k.plan.num_sms), 8192, s_q=1)
    assert known.num_splits > 1
    assert k.plan([1, 2, 3], max_seqlen=8192, num_sms=8).num_splits <= known.num_splits
    assert k.plan([]) == DecodeMetadata(1, 0, s_q=1)
    balanced = example("mla")
    assert split.balanced(balanced.plan) and balanced.plan(Unreadable([1])).num_splits == 0


def test_plan_call_sparse_uses_topk():
    k = example("mla_fp8_sparse")
    meta = k.plan([1, 2])
    assert meta.longest == 2048
    assert meta.num_splits == 0  # compute-bound: balanced parts, chosen at launch
    memory_bound = compile_quiet(SPARSE_H16)
    assert not split.balanced(memory_bound.plan)
    meta = memory_bound.plan([1, 2])
    assert meta.longest == 256
    assert meta.num_splits == num_splits(memory_bound.plan, 2, 1, 256, memory_bound.plan.num_sms)


SPARSE_H16 = """attention sparse16 {
    heads q = 16, kv = 1
    cache paged(64) { c: bf16[512]  r: bf16[64] }
    key = c ++ r
    value = c
    tokens topk 256
}"""


# --- balanced parts (attncc/split.py, templates/include/attncc/core/schedule.cuh) ----------

def test_compute_bound_auto_plans_balance_parts():
    """split_kv auto balances parts exactly when the plan is compute-bound (2 tile_m (d_k +
    d_v) >= 64 record bytes per kv head); off or a fixed count keeps splits."""
    mla = example("mla").plan  # h_q 128: 64-row tiles, 2 * 64 * 1088 >= 64 * 1152
    assert mla.config.compute_bound and split.balanced(mla)
    assert mla.config.compute_bound == (2 * mla.config.tile_m * (mla.d_k + mla.d_v) >= 64 * 1152)
    for text in (SPARSE_H16, GQA8_TEXT):
        plan = compile_quiet(text).plan
        assert not plan.config.compute_bound and not split.balanced(plan)
    for knob in ("split_kv off", "split_kv 3"):
        text = (REPO / "examples" / "mla.attn").read_text().replace("split_kv auto", knob)
        plan = compile_quiet(text).plan
        assert plan.config.compute_bound and not split.balanced(plan)
    assert "balanced" in "\n".join(mla.explain_lines())


def test_num_parts_fill_the_sms_once():
    mla = example("mla").plan  # one kv head; 128 rows per query token, 64-row tiles
    assert split.lanes(mla, 1) == 2 and split.lanes(mla, 2) == 4
    assert split.num_parts(mla, 2, 132, 1) == 33   # 33 parts x 4 CTAs = 132
    assert split.num_parts(mla, 1, 132, 1) == 66
    assert split.num_parts(mla, 2, 132, 2) == 66   # two CTAs per SM: twice the parts
    assert split.num_parts(mla, 2, 2, 1) == 1      # never zero parts
    assert example("mla").plan([5, 9000], s_q=2) == DecodeMetadata(0, None, s_q=2)  # no length read
    assert example("mla").plan([5, 9000], s_q=2, max_seqlen=9000) == DecodeMetadata(0, 9000, s_q=2)


def test_plan_without_s_q_serves_every_s_q():
    """k.plan(seqlens) (DESIGN.md 3a: no s_q) holds the metadata of each s_q the spec takes and
    a call takes its own: parts cut for s_q 1 and launched at s_q 2 would be twice the CTAs
    (MLA h_q 64 with split_kv 3: 132 parts of 1 CTA at s_q 1, 66 of 2 at s_q 2; h_q 128 b = 128
    on the device: 66 parts of 4 CTAs, two waves)."""
    text = MLA_ATTENTION.replace("heads q = 128", "heads q = 64")
    assert text != MLA_ATTENTION
    k = compile_quiet(with_schedule(text, "mla", "target sm90a", "split_kv 3"))
    assert not split.balanced(k.plan) and k.plan.max_sq == 2
    meta = k.plan([5, 9000, 33])
    one, two = (k.plan([5, 9000, 33], s_q=n) for n in (1, 2))
    assert meta == dataclasses.replace(one, others=(two,)) and meta.for_sq(1) is meta and meta.for_sq(2) == two
    assert [meta.for_sq(n).num_splits for n in (1, 2)] == [-132, -66]
    assert meta.for_sq(2).s_q == 2 and meta.for_sq(2).others == ()
    with pytest.raises(ValueError, match=r"made by k.plan\(seqlens, s_q=...\) for s_q 1, 2; this call's q has s_q 3"):
        meta.for_sq(3)
    with pytest.raises(ValueError, match=r"for s_q 1; this call's q has s_q 2"):
        k.plan([5], s_q=1).for_sq(2)
    for bad in (0, 3, 1.5, "2", True):
        with pytest.raises(ValueError, match=rf"s_q: {re.escape(repr(bad))} query tokens a sequence; the spec takes 1..2"):
            k.plan([5], s_q=bad)
    assert k.plan([5], s_q=torch.tensor(2)) == k.plan([5], s_q=2)  # an int of another kind
    own = DecodeMetadata(2, 9)  # a count of the caller's own: any s_q
    assert own.for_sq(1) is own and own.for_sq(2) is own


def test_a_call_refuses_metadata_of_another_s_q():
    """On CPU tensors too: a call at s_q 2 with metadata made for s_q 1 only says so (a wrong
    part count is not silently launched); the metadata of k.plan(seqlens) runs at either."""
    from attncc import testing

    k = example("mla")
    case = testing.random_case(k.spec, [300, 70, 5], 2, device="cpu", seed=4)
    with pytest.raises(ValueError, match="metadata: made by k.plan.* for s_q 1; this call's q has s_q 2"):
        k(case.q, case.cache, case.block_table, case.seqlens, metadata=k.plan(case.seqlens, s_q=1))
    out, lse = k(case.q, case.cache, case.block_table, case.seqlens, metadata=k.plan(case.seqlens))
    assert testing.compare(k.spec, case, out, lse).ok


# --- properties over random specs -----------------------------------------------------

@st.composite
def random_specs(draw):
    kind = draw(st.sampled_from(["gqa", "mla", "gla", "gta"]))
    heads_kv = draw(st.sampled_from([1, 2, 4, 8]))
    group = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]))
    page = draw(st.sampled_from([1, 3, 16, 64]))
    sq = draw(st.integers(1, 4))
    sparse = draw(st.booleans()) and kind != "gqa"
    causal = (not sparse) and draw(st.booleans())
    separate = draw(st.booleans())
    dtype = draw(st.sampled_from(["bf16", "fp16"]))
    fp8 = kind in ("mla", "gla") and draw(st.booleans())
    w = draw(st.sampled_from([16, 32, 64, 128, 256, 512]))
    r = draw(st.sampled_from([16, 32, 64]))
    if kind == "gqa":
        segs = f"k: {dtype}[{w}]\n v: {dtype}[{w}]"
        key, value = "k", "v"
    elif kind == "gta":
        segs = f"tied: {dtype}[{w}]\n rope: {dtype}[{w // 2}] shared"
        key, value = f"tied[0:{w // 2}] ++ rope", "tied"
    else:
        shared = " shared" if kind == "gla" else ""
        if fp8:
            per = draw(st.sampled_from([16, 32, 64, 128]).filter(lambda n: w % n == 0))
            segs = f"latent: e4m3[{w}] scale fp32 per {per}\n rope: {dtype}[{r}]{shared}"
        else:
            segs = f"latent: {dtype}[{w}]\n rope: {dtype}[{r}]{shared}"
        key, value = "latent ++ rope", "latent"
    body = (f"attention rnd {{\n heads q = {heads_kv * group}, kv = {heads_kv}\n"
            f" cache paged({page}){' separate' if separate else ''} {{\n {segs}\n }}\n"
            f" key = {key}\n value = {value}\n query len <= {sq}{' causal' if causal else ''}\n"
            + (f" tokens topk {draw(st.sampled_from([64, 2048]))}\n" if sparse else "") + "}\n")
    knobs = []
    if draw(st.booleans()):
        knobs.append(f"tile q = {draw(st.sampled_from([16, 32, 64]))}, "
                     f"kv = {draw(st.sampled_from([16, 32, 64, 128]))}")
    if draw(st.booleans()):
        knobs.append(f"stages {draw(st.integers(2, 6))}")
    if draw(st.booleans()):
        knobs.append("target sm80")
    if knobs:
        body = with_schedule(body, "rnd", *knobs)
    return body


@given(text=random_specs())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_specs_lower_to_legal_plans_or_positioned_errors(text):
    try:
        k = attncc.compile(text)
        plan = k.plan
    except attncc.SpecError as exc:
        assert exc.span is not None, str(exc)
        assert str(exc).startswith(f"<string>:{exc.span.line}:{exc.span.column}: ")
        return
    assert_legal(plan)
    assert staged_columns(plan, plan.layout.key_runs) == spec_columns(k.spec.key)
    assert staged_columns(plan, plan.layout.value_runs) == spec_columns(k.spec.value)


def test_producer_q_on_the_plain_seesaw_only():
    """producer_q: the seesaw's producer copies a part's later pieces' Q (bf16 TMA and cp.async plans); not
    the relay (its producer sets the pace), crossover (its producer stores into the peer) or the
    stacked schedule (its split merge reuses the Q region); explain says which."""
    for spec in (mla(heads=128), mla(heads=128, page=1)):
        k = compile_quiet(spec)
        assert k.plan.config.seesaw and k.plan.config.producer_q
        assert re.search(r"^\s+producer_q\s+True\s+chosen: the producer copies a part's later pieces' Q rows", k.explain(), re.M)
    relay = compile_quiet(EXTRA["sparse_fp8_h128"])
    assert relay.plan.config.relay and not relay.plan.config.producer_q
    assert re.search(r"^\s+producer_q\s+False\s+not chosen: the relay's producer", relay.explain(), re.M)
    crossover = compile_quiet((REPO / "examples" / "mla_fp8_sparse.attn").read_text())
    assert crossover.plan.config.crossover and not crossover.plan.config.producer_q
    assert re.search(r"^\s+producer_q\s+False\s+not chosen: a crossover CTA's producer", crossover.explain(), re.M)
    stacked = compile_quiet((REPO / "examples" / "gla2.attn").read_text())
    assert not stacked.plan.config.seesaw and not stacked.plan.config.producer_q
    assert re.search(r"^\s+producer_q\s+False\s+not chosen: the stacked groups' split merge", stacked.explain(), re.M)


def test_q_tma_off_with_its_box():
    """q_tma (session 55): measured ~1 % either way (session 56), so the lowering leaves it off and
    explain says so with the figures and the box it would copy; the box is the CTA's rows of q seen
    as (column, head of the group, kv head, query token, batch): tile_m heads of one token where the
    group is a multiple of tile_m (MLA's 64 of 128; sparse: one token's heads), whole groups of
    tokens where tile_m is a multiple of the group (GLA-2's 128 rows: 64 heads x 2 tokens), none
    otherwise (a group of 96). Forced on (with_config), the kernel gets the knob and the box."""
    cases = [(mla(heads=128), 64, 1), (mla(heads=64, page=1), 64, 1), ((REPO / "examples" / "gla2.attn").read_text(), 64, 2),
             (EXTRA["sparse_fp8_h128"], 64, 1), (EXTRA["mqa256_h128"], 128, 1), (EXTRA["gla_g96"], 0, 0)]
    for spec, heads, tokens in cases:
        k = compile_quiet(spec)
        c = k.plan.config
        assert not c.q_tma and (c.q_tma_heads, c.q_tma_tokens) == (heads, tokens)
        if heads:
            assert heads * tokens == c.tile_m
            assert re.search(rf"^\s+q_tma\s+False\s+not chosen: the Q tile would go by TMA, a copy a 64-column box of "
                             rf"{heads} heads x {tokens} query token", k.explain(), re.M)
            assert "measured slower where the cache tiles go by TMA" in k.explain()
        else:
            assert re.search(r"^\s+q_tma\s+False\s+not applicable: a CTA's 128 rows are not one box of q \(a group of 96",
                             k.explain(), re.M)
        assert "static constexpr bool kQTma = false;" in render(k.plan)
    forced = with_config(compile_quiet(mla(heads=128)).plan, ["q_tma=true"])
    text = render(forced)
    assert "static constexpr bool kQTma = true;" in text and "static constexpr int kQTmaHeads = 64;" in text
    assert "static constexpr int kQTmaTokens = 1;" in text
