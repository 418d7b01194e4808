"""Kernel families (attncc/families/) and how the lowering chooses among them, on CPU.

The lowering walks the target's families in preference order and takes the first that
accepts the spec and every knob written; a knob no family honours is a SpecError at the knob
with each family's reason; `explain` names the family, every choice of its config and why,
and the launch of one call. The C++ only static_asserts the config: a corrupted config fails
to build."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import attncc
import attncc.build
from attncc import families, split
from attncc.families import Family, KernelConfig, MmaSyncFamily, Refusal
from attncc.lower import UnsupportedSpec, lower
from attncc.render import INCLUDE_DIR, constant_name, constants, render

from specs import EXTRA, gla
from support import compile_quiet, have_nvcc

REPO = Path(__file__).resolve().parent.parent
GQA8 = (REPO / "examples" / "gqa8.attn").read_text()




class Picky(Family):
    """A family preferred over mma_sync that refuses everything."""

    name = "picky"
    summary = "refuses everything"
    targets = ("sm90a",)
    honours = frozenset({"tile", "stages"})
    tolerates = frozenset()
    limits = ()

    def lower(self, spec, layout, target):
        raise Refusal("takes no spec at all", spec.span_of("heads"))


class NoKnobs(Picky):
    """A family that honours no schedule knob (and would take any spec without one)."""

    name = "noknobs"
    honours = frozenset()

    def lower(self, spec, layout, target):
        return MmaSyncFamily().lower(spec, layout, target)


@pytest.fixture
def order(monkeypatch):
    def set_families(*fams):
        monkeypatch.setattr(families, "FAMILIES", tuple(fams))
    return set_families


def test_the_first_family_that_accepts_wins_and_the_refusals_are_kept(order):
    order(Picky(), MmaSyncFamily())
    plan = lower(compile_quiet(GQA8).spec)
    assert plan.family == "mma_sync"
    assert plan.refused == (("picky", "takes no spec at all"),)
    text = attncc.compile(GQA8).explain()
    assert "not chosen: picky: takes no spec at all" in text
    assert "family mma_sync" in text


def test_a_family_for_another_target_is_not_asked(order):
    order(Picky(), MmaSyncFamily())
    sm80 = GQA8 + "schedule gqa8 {\n    target sm80\n}\n"
    assert lower(compile_quiet(sm80).spec).refused == ()


def test_a_knob_no_family_honours_is_an_error_at_the_knob_with_each_reason(order):
    order(NoKnobs(), Picky())
    text = GQA8 + "schedule gqa8 {\n    split_kv 2\n    stages 3\n}\n"
    with pytest.raises(attncc.SpecError) as info:
        attncc.compile(text)
    exc = info.value
    assert not isinstance(exc, UnsupportedSpec)
    line = text.split("\n").index("    stages 3") + 1
    assert (exc.span.line, exc.span.column) == (line, 5)
    assert "noknobs: does not apply `stages`" in exc.message
    assert "picky: takes no spec at all" in exc.message
    # without the knob the first family takes it
    plan = lower(compile_quiet(GQA8 + "schedule gqa8 {\n    split_kv 2\n}\n").spec)
    assert plan.family == "noknobs"


def test_a_spec_no_family_runs_is_unsupported_with_each_reason(order):
    order(Picky(), MmaSyncFamily())
    narrow = GQA8.replace("bf16[128]", "bf16[8]")
    k = attncc.compile(narrow)  # the reference still runs it
    with pytest.raises(UnsupportedSpec) as info:
        k.plan
    assert "picky: takes no spec at all" in info.value.message
    assert "mma_sync: needs the key width to be a multiple of 16" in info.value.message


def test_every_family_declares_what_it_runs():
    assert families.FAMILIES, "at least one family"
    for fam in families.FAMILIES:
        assert fam.name and fam.summary and fam.targets and fam.limits
        assert (REPO / "templates" / fam.template).is_file()
        assert not (fam.honours & fam.tolerates)
        assert not (fam.honours & families.COMMON_KNOBS)
    for target in ("sm90a", "sm80"):
        assert families.for_target(target), target


@pytest.mark.parametrize("name", ["mla", "gqa8", "mla_fp8_sparse"])
def test_config_is_frozen_hashed_and_every_field_is_rendered(name):
    plan = compile_quiet(REPO / "examples" / f"{name}.attn").plan
    cfg = plan.config
    assert isinstance(cfg, KernelConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tile_m = 1
    assert hash(cfg) == hash(dataclasses.replace(cfg))
    assert dataclasses.replace(cfg, why=()) == cfg, "the reasons are not part of the identity"
    source = render(plan)
    names = {c["name"] for c in constants(plan)}
    for field in cfg.choices():
        assert any(n == constant_name(field) or n.startswith(constant_name(field)) for n in names), field
    for c in constants(plan):
        assert re.search(rf"static constexpr \w+ {c['name']} = {c['value']};", source), c
    # the C++ of the family reads the plan's numbers, it does not choose them
    for header in (REPO / "templates/include/attncc/mma_sync").glob("*.cuh"):
        text = header.read_text()
        assert not re.search(r"Cfg::k\w+ >= 0 \?", text), f"{header.name}: a -1 sentinel chosen in C++"
        assert "pick_warp_rows" not in text


def test_explain_shows_the_family_its_choices_and_the_launch():
    k = compile_quiet(REPO / "examples" / "mla.attn", family="mma_sync")
    text = k.explain(batch=128, seqlen=8192, s_q=2)
    cfg = k.plan.config
    assert f"family {k.plan.family}" in text
    for field in ("tile_m", "qk_split", "ping_pong", "copy_interleave", "warp_rows", "smem_bytes",
                  "kv_off", "registers"):
        assert re.search(rf"^\s+{field}\s+\S", text, re.M), field
    assert re.search(r"qk_split\s+True\s+on: legal and compute-bound", text)
    parts = split.num_parts(k.plan, 2, 132, 1)
    assert f"cut into {parts} equal parts of 4 CTAs" in text
    assert f"grid {parts * 4} CTAs of {cfg.threads} threads, {cfg.smem_bytes} B shared memory" in text
    assert "1 CTA(s) per SM" in text
    assert f"workspace {split.workspace_bytes(k.plan, 128, 2, 1, parts)} B" in text
    # equal lengths even enough: the parts hold whole sequences (core/schedule.cuh), nothing merged
    assert "each cut moved back to its sequence's start" in text and "combine: launched, nothing to merge" in text
    ragged = k.explain(batch=100, seqlen=8192, s_q=2)  # 100 on 33 parts: 4 a part where 3.03 are even
    assert "each cut moved back" not in ragged and "combine: yes" in ragged
    small = compile_quiet(REPO / "examples" / "gqa8.attn")
    text = small.explain(batch=2, seqlen=4096)
    splits = split.num_splits(small.plan, 2, 1, 4096, 132)
    assert f"{splits} split(s) per sequence" in text and splits > 1
    assert f"workspace {split.workspace_bytes(small.plan, 2, 1, splits, 0)} B" in text


def test_workspace_shapes_follow_the_mode():
    plan = compile_quiet(REPO / "examples" / "mla.attn").plan
    assert split.workspace_shapes(plan, 8, 2, 1, 0) is None
    assert split.workspace_shapes(plan, 8, 2, 3, 0) == ((3, 8, 2, 128, 512), (3, 8, 2, 128))
    # part mode: the partial lse, then a ready word per slot and lane (s_q 2 x 128 heads: 4 row
    # blocks of 64, one kv head), then the word of whole-sequence parts
    assert split.lanes(plan, 2) == 4
    assert split.workspace_shapes(plan, 8, 2, 1, 33) == ((66, 1, 2, 128, 512), (66 * 2 * 128 + 66 * 4 + 1,))
    assert split.workspace_bytes(plan, 8, 2, 3, 0) == 4 * (3 * 8 * 2 * 128 * 513)




@pytest.mark.skipif(not have_nvcc(), reason="nvcc not found")
@pytest.mark.parametrize("change, message", [
    (dict(kv_off=64), "shared-memory plan"),
    (dict(qk_steps=3), "k-steps of the warp"),
    (dict(ping_pong=True), "ping_pong"),
    (dict(barriers=17), "named barriers"),
])
def test_the_cpp_rejects_a_config_it_cannot_run(tmp_path, change, message):
    """The C++ trusts the lowering only as far as its static_asserts: a config whose numbers
    break the kernel's needs does not build."""
    plan = compile_quiet(REPO / "examples" / "gqa8.attn").plan  # one row group: no ping_pong
    assert plan.config.warps_m == 1
    bad = dataclasses.replace(plan, config=dataclasses.replace(plan.config, **change))
    with pytest.raises(attncc.build.BuildError) as info:
        attncc.build.compile_source(bad, tmp_path, progress=False)
    assert message in info.value.log


@pytest.mark.parametrize("family", ["hopper", "mma_sync"])
def test_ready_words_on_sparse_plans_with_a_dependent_combine(family):
    """Part mode's ready words (core/ready.cuh): on for sparse plans whose combine is a
    programmatic dependent (sm90a), rendered as kReadyWords and explained; off for dense plans
    and for a target without dependent launch. The kernels also turn them off at launch where
    parts outnumber the sequences (ready_words_on)."""
    sparse = compile_quiet(EXTRA["sparse_bf16_h128"], family=family)
    assert sparse.plan.config.ready_words is True
    assert re.search(r"^\s+ready_words\s+True\s+on: sparse queries outnumber the parts", sparse.explain(), re.M)
    assert "static constexpr bool kReadyWords = true;" in render(sparse.plan)
    dense = compile_quiet(REPO / "examples" / "mla.attn", family=family)
    assert dense.plan.config.ready_words is False
    assert re.search(r"^\s+ready_words\s+False\s+off: dense", dense.explain(), re.M)
    assert "static constexpr bool kReadyWords = false;" in render(dense.plan)
    old = compile_quiet(GQA8 + "\nschedule gqa8 {\n    target sm80\n}\n")
    assert old.plan.config.ready_words is False
    assert re.search(r"^\s+ready_words\s+False\s+off: no programmatic dependent launch", old.explain(), re.M)


@pytest.mark.parametrize("family", ["hopper", "mma_sync"])
def test_the_combine_takes_three_blocks_an_sm_where_it_fits_their_registers(family):
    """combine_blocks (families/base.py): 3 blocks an SM (80 registers a thread) for a dense plan
    whose value is wider than a slab; 2 (128) with the ready words' wait (sparse) or a value of
    one slab (128 columns), where 80 spilled. Rendered as kCombineBlocks (the combine's launch
    bounds) and explained; tests/test_build.py checks that each builds without a spill."""
    dense = compile_quiet(REPO / "examples" / "mla.attn", family=family)
    assert dense.plan.config.combine_blocks == 3
    assert re.search(r"^\s+combine_blocks\s+3\s+3 \(80 registers a thread\)", dense.explain(), re.M)
    assert "static constexpr int kCombineBlocks = 3;" in render(dense.plan)
    sparse = compile_quiet(EXTRA["sparse_bf16_h128"], family=family)
    assert sparse.plan.config.combine_blocks == 2
    assert re.search(r"^\s+combine_blocks\s+2\s+2 \(128 registers a thread\): with the ready words", sparse.explain(), re.M)
    narrow = compile_quiet(GQA8, family="mma_sync")  # d_v 128: one slab a row
    assert narrow.plan.config.combine_blocks == 2
    assert re.search(r"^\s+combine_blocks\s+2\s+.*a value of 128 columns is one slab a row", narrow.explain(), re.M)
    assert "static constexpr int kCombineBlocks = 2;" in render(narrow.plan)


def test_scale_records_where_a_tokens_scales_are_one_aligned_16_byte_run():
    """The Hopper producer copies a tile's fp8 scales as one 16-byte record a token (rendered
    as kScaleRecordBytes, a region of tile_n records a stage after the part walks, explained)
    where its fp8 run has one scale a box pair and 4 of them 16-byte aligned in the record;
    otherwise a scale a copy, as before (scale groups of 64: a scale a 16-value chunk), and no
    region where nothing is fp8."""
    on = compile_quiet(EXTRA["sparse_fp8_h128"], family="hopper")
    cfg = on.plan.config
    assert cfg.scale_record_bytes == 16
    assert cfg.scales_off >= cfg.walk_p_off + 12 * 4 and cfg.scales_off % 16 == 0
    assert cfg.smem_bytes == cfg.scales_off + cfg.stages * cfg.tile_n * 16
    source = render(on.plan)
    assert "static constexpr int kScaleRecordBytes = 16;" in source
    assert f"static constexpr int kScalesOff = {cfg.scales_off};" in source
    assert re.search(r"^\s+scale_record_bytes\s+16\s+a token's 4 scales by one 16-byte copy a tile", on.explain(), re.M)
    per64 = compile_quiet(EXTRA["mla_fp8_page1_h64"], family="hopper")
    assert per64.plan.config.scale_record_bytes == 0
    assert re.search(r"^\s+scale_record_bytes\s+0\s+off: scale groups of 64 values", per64.explain(), re.M)
    dense = compile_quiet(REPO / "examples" / "mla.attn", family="hopper").plan.config
    assert dense.scale_record_bytes == 0 and dense.smem_bytes == dense.scales_off


@pytest.mark.parametrize("name, why", [
    ("mla_fp8_per128_h32", "32 rows of fp8 records of a 512-wide value: 64 tokens spill"),
    ("mla_fp8_per64", "32 rows of fp8 records of a 512-wide value: 64 tokens spill"),
    ("mla_fp8_rope32", "fp8 records of a 512-wide value and a 544-wide key in 64 rows: 64 tokens spill"),
    ("gla2_fp8_separate", "fp8 of several kv heads from several cache tensors: 64 tokens spill"),
])
def test_mma_sync_takes_32_token_tiles_where_64_spill(name, why):
    """mma_sync's fp8 plans whose 64-token tiles ptxas spilled (MLA's 512-wide value in 32-row
    tiles, any scale group, or in 64-row tiles with a 544-wide key; several kv heads from several
    cache tensors in 64-row tiles) take 32
    tokens, and say why (tests/test_build.py compiles them); GLA's 256-wide latent in 32-row
    tiles keeps 64; a separate MLA cache in 64-row tiles copies at the top of the step instead."""
    k = compile_quiet(EXTRA[name])
    assert k.plan.family == "mma_sync" and k.plan.config.tile_n == 32
    assert re.search(rf"^\s+tile_n\s+32\s+{re.escape(why)}", k.explain(), re.M)
    narrow = compile_quiet(gla("g", heads=64, kv=2).replace("latent: bf16[256]", "latent: e4m3[256] scale fp32 per 64"),
                           family="mma_sync").plan.config
    assert (narrow.tile_m, narrow.tile_n) == (32, 64)
    separate = compile_quiet(EXTRA["mla_fp8_separate_h64"])
    assert (separate.plan.config.tile_m, separate.plan.config.copy_interleave) == (64, False)
    assert "(or cache tensors, 64 rows): their run addresses would stay live" in separate.explain()


def test_mma_sync_takes_16_token_tiles_where_32_spill():
    """MLA fp8 with a scale per 32 under the causal rule at s_q 2 in 64-row tiles spilled 4
    bytes at 32 tokens in mma_sync's any-stride part kernel (the GPU suite's
    mla_fp8_per32_page16@mma_sync; tests/test_build.py compiles it): 16 tokens, and explain says
    why; without the causal rule, or with a scale per 64, 32 tokens stay."""
    k = compile_quiet(EXTRA["mla_fp8_per32_page16"], family="mma_sync")
    assert (k.plan.config.tile_m, k.plan.config.tile_n) == (64, 16)
    assert re.search(r"^\s+tile_n\s+16\s+fp8 records of a 512-wide value, a scale per 32, causal s_q > 1 in 64 "
                     r"rows: 32 tokens spill \(ptxas\)", k.explain(), re.M)
    for other in (EXTRA["mla_fp8_per32_page16"].replace(" causal", ""),
                  EXTRA["mla_fp8_per32_page16"].replace("per 32", "per 64")):
        assert compile_quiet(other, family="mma_sync").plan.config.tile_n == 32


def test_hopper_refuses_fp8_from_a_cache_of_several_tensors():
    """The Hopper producer dequantizes fp8 from one packed record tensor: a separate cache
    (latent, its scales, rope) left it too few registers for a token's offsets (ptxas spilled
    80-232 bytes), so the lowering refuses it, at the cache, saying why."""
    text = """attention sep128 {
    heads q = 128, kv = 1
    cache paged(64) separate { latent: e4m3[512] scale fp32 per 128  rope: bf16[64] }
    key = latent ++ rope
    value = latent
}"""
    with pytest.raises(UnsupportedSpec, match=r"^<string>:3:5: no kernel family runs this spec on sm90a: hopper: its "
                       r"producer dequantizes fp8 from one packed record tensor; this cache is 3 tensors "
                       r"\(latent, latent_scale, rope\)"):
        compile_quiet(text, family="hopper").plan
    assert "not chosen: hopper: its producer dequantizes fp8 from one packed record tensor" in compile_quiet(text).explain()


def test_mma_sync_takes_16_token_tiles_where_a_deep_ring_of_32_spills():
    """8 warps (a 64-row tile of a 512-wide value) over 32-token tiles spilled with 3 or 4
    stages (ptxas), so a `stages` knob above 2 gets 16-token tiles there, and explain says why;
    2 stages keep 32 or 64, and 4 warps (GQA's 64 rows) keep 64 at 3 stages."""
    k = compile_quiet(EXTRA["mla_stages3"])
    assert (k.plan.family, k.plan.config.warps, k.plan.config.stages, k.plan.config.tile_n) == ("mma_sync", 8, 3, 16)
    assert "does not spill (8 warps over 32-token tiles with 3 stages spill (ptxas))" in k.explain()
    two = compile_quiet(EXTRA["mla_stages3"].replace("stages 3", "stages 2"), family="mma_sync").plan.config
    assert two.warps == 8 and two.tile_n >= 32
    gqa = compile_quiet(GQA8.replace("heads q = 32, kv = 8", "heads q = 128, kv = 2")
                        + "schedule gqa8 {\n    stages 3\n}\n", family="mma_sync").plan.config
    assert (gqa.warps, gqa.tile_n, gqa.stages) == (4, 64, 3)


@pytest.mark.parametrize("cache, kv, message", [
    # one kv head: the latent's 516 bytes end where the rope starts, off 16; the record is too
    ("{ latent: e4m3[512] scale fp32 per 512  rope: bf16[64] }", 1,
     "segment `latent`: its tokens are 644 bytes apart in cache tensor `cache`: needs 16-byte alignment"),
    # a shared fp8 rope last: every segment starts aligned, the 1092-byte record does not (the
    # call's validation refused every such cache: now the spec says so)
    ("{ latent: bf16[256]  rope: e4m3[64] shared scale fp32 per 64 }", 2,
     "segment `latent`: its tokens are 1092 bytes apart in cache tensor `cache`: needs 16-byte alignment"),
    # four kv heads of 260 bytes (256 e5m2 and one scale; a 1168-byte record): not even the
    # 8-byte halves take them
    ("{ latent: e5m2[256] scale fp32 per 256  rope: bf16[64] shared }", 4,
     "segment `latent`: its copies (one a kv head) are 260 bytes apart in the record: needs 16-byte alignment "
     "(8 for an fp8 segment)"),
])
def test_both_families_say_which_alignment_a_record_misses(cache, kv, message):
    """The 16-byte copies need a run's first byte, its tokens' records and (several kv heads)
    its copies 16-byte aligned; the refusal names the one that is not, for both families, at the
    segment (not a head stride where one kv head has no second copy)."""
    text = f"""attention al {{
    heads q = {64 * kv}, kv = {kv}
    cache paged(16) {cache}
    key = latent ++ rope
    value = latent
}}"""
    for family in ("hopper", "mma_sync"):
        with pytest.raises(UnsupportedSpec, match=rf"^<string>:3:\d+: no kernel family runs this spec on sm90a: {family}: "
                           + re.escape(message)):
            compile_quiet(text, family=family).plan


def test_fp8_copies_8_mod_16_apart_are_copied_in_halves_by_both_families():
    """A packed GLA record of e4m3 per 128: a kv head's copy is 256 values and 2 scales (264
    bytes), so head 1's bytes sit 8 mod 16 into the record. Both families take it, copying that
    run's 16-byte chunks in 8-byte halves (Source::copy_bytes 8, rendered); its other runs, and
    the same segment in a separate tensor, keep 16-byte copies. mma_sync
    caps its tiles at 32 tokens there (64 spilled) and says so."""
    text = EXTRA["gla_fp8_per128"]
    for family in ("hopper", "mma_sync"):
        plan = compile_quiet(text, family=family).plan
        assert {s.segment: s.copy_bytes for s in plan.layout.sources} == {"latent": 8, "rope": 16}
        source = render(plan)
        assert re.search(r"^\s+\{0, 0, 264, 256, attncc::Dtype::kE4M3, .* 8\},  // latent$", source, re.M), family
        assert re.search(r"^\s+\{0, 528, 0, 64, attncc::Dtype::kBF16, .* 16\},  // rope$", source, re.M), family
    k = compile_quiet(text, family="mma_sync")
    assert k.plan.config.tile_n == 32
    assert "fp8 copied in 8-byte halves (kv heads 8 mod 16 bytes apart) in 64 rows: 64 tokens spill" in k.explain()
    separate = compile_quiet(text.replace("paged(3)", "paged(3) separate")).plan
    assert {s.copy_bytes for s in separate.layout.sources} == {16}
    assert {s.copy_bytes for s in compile_quiet(EXTRA["gla_fp8_e5m2"]).plan.layout.sources} == {16}  # per 32: 288 bytes


def test_mma_sync_takes_32_row_tiles_where_64_spill():
    """64-row tiles of a 512-wide value of several kv heads under the causal rule at s_q > 1
    spilled (ptxas) at every token count, so mma_sync takes 32 rows there and says why; the
    same spec at s_q 1, without `causal`, or of one kv head keeps 64."""
    k = compile_quiet(EXTRA["gla2_w512_causal"])
    assert (k.plan.family, k.plan.config.tile_m) == ("mma_sync", 32)
    assert re.search(r"^\s+tile_m\s+32\s+64-row tiles of a 512-wide value of several kv heads under the causal "
                     r"rule spill \(ptxas\)", k.explain(), re.M)
    text = EXTRA["gla2_w512_causal"].replace("heads q = 96", "heads q = 128")
    for other in (text.replace("query len <= 2 causal", "query len <= 1"), text.replace(" causal", ""),
                  text.replace("kv = 2", "kv = 1").replace(" shared", "")):
        assert compile_quiet(other, family="mma_sync").plan.config.tile_m == 64, other


def test_hopper_refuses_sparse_from_several_tensors_at_a_group_of_64():
    """Sparse top-k from a separate cache at h_q 64 and a page above 1 spilled in the Hopper
    family's part kernels (ptxas), so the lowering refuses it there, at the cache, and mma_sync
    runs it; page 1 and a group of 128 stay on the Hopper family."""
    text = EXTRA["sparse_separate_h64"]
    with pytest.raises(UnsupportedSpec, match=r"^<string>:3:5: no kernel family runs this spec on sm90a: hopper: "
                       r"sparse top-k from 2 cache tensors at page 3 with a group of 64 query heads: its part "
                       r"kernels spill \(ptxas\)"):
        compile_quiet(text, family="hopper").plan
    k = compile_quiet(text)
    assert k.plan.family == "mma_sync"
    assert "not chosen: hopper: sparse top-k from 2 cache tensors at page 3" in k.explain()
    assert compile_quiet(text.replace("paged(3)", "paged(1)")).plan.family == "hopper"
    assert compile_quiet(text.replace("heads q = 64", "heads q = 128")).plan.family == "hopper"


@pytest.mark.parametrize("family", ["hopper", "mma_sync"])
def test_the_combine_is_a_dependent_launch_where_the_target_has_it(family):
    """sm90a: the lowering makes the combine a programmatic dependent of the decode kernel,
    explain says so and the source launches it through core/launch.cuh's launch, which calls
    CombineLaunch::launch, which sets the
    attribute from dependent_launch<Cfg>() (the build's archs decide with the plan); sm80: no
    such launch."""
    k = compile_quiet(REPO / "examples" / "mla.attn", family=family)
    assert k.plan.config.dependent_launch is True
    assert re.search(r"^\s+dependent_launch\s+True\s+the combine launches while", k.explain(), re.M)
    source = render(k.plan)
    assert "static constexpr bool kDependentLaunch = true;" in source
    assert f"return attncc::launch<Config, attncc::{family}::Family>(args);" in source
    launch = (INCLUDE_DIR / "attncc" / "core" / "launch.cuh").read_text()  # the one launch sequence
    assert "return err != cudaSuccess ? err : CombineLaunch<Cfg>::launch(a, stream);" in launch
    assert "CombineLaunch" not in source and "combine_kernel" not in source and "<<<" not in source
    old = compile_quiet(GQA8 + "\nschedule gqa8 {\n    target sm80\n}\n")
    assert old.plan.config.dependent_launch is False
    assert re.search(r"^\s+dependent_launch\s+False\s+the target has no programmatic", old.explain(), re.M)
    assert "static constexpr bool kDependentLaunch = false;" in render(old.plan)


def test_whole_parts_off_on_the_seesaws_paged_cp_async_producer():
    """The lowering keeps whole-sequence parts off where they measured slower (the seesaw's
    paged cp.async producer: MLA page 1), on elsewhere (page 64, the stacked GLA-2 at page 5,
    sparse), says why, and explain's launch follows it."""
    off = compile_quiet(EXTRA["mla_page1_h128"], family="hopper")
    assert off.plan.config.seesaw and off.plan.config.tma_rows == 0 and not off.plan.config.whole_parts
    assert "whole_parts            False       off: the seesaw's paged cp.async producer" in off.explain()
    text = off.explain(batch=128, seqlen=8192, s_q=2)
    assert "each cut moved back" not in text and "combine: yes" in text
    assert "static constexpr bool kWholeParts = false;" in render(off.plan)
    for on in (compile_quiet(REPO / "examples" / "mla.attn", family="hopper"),
               compile_quiet(EXTRA["gla2_page5"], family="hopper"),
               compile_quiet(EXTRA["sparse_fp8_h128"], family="hopper")):
        assert on.plan.config.whole_parts, on.plan.name
        assert "static constexpr bool kWholeParts = true;" in render(on.plan)
    assert "each cut moved back" in compile_quiet(REPO / "examples" / "mla.attn").explain(
        batch=128, seqlen=8192, s_q=2)


def test_whole_parts_bounded_in_tiles_where_the_launch_is_compute_bound():
    """Past the ridge (whole_tight_rows: MLA h_q 128 from s_q 2) whole parts are also bounded in
    tiles over the even length, under it only relatively (bench/RESULTS.md session 42): MLA b=128
    s_k 32768 on whole parts at s_q 1 (31 tiles over), cut at s_q 2 (62 over, 65 with the pieces'
    cost); s_k 8192 s_q 2 (15.5 over, 16.1 with the cost, session 43) whole. The host's rule says what the kernels decide (tests/test_schedule.py)."""
    k = compile_quiet(REPO / "examples" / "mla.attn", family="hopper")
    cfg = k.plan.config
    assert (cfg.whole_tight_rows, cfg.whole_slack_tiles, cfg.piece_cost_tiles) == (157, 20, 5)
    assert split.whole_slack_tiles(k.plan, 1) == -1 and split.whole_slack_tiles(k.plan, 2) == 20
    assert "static constexpr int kWholeTightRows = 157;" in render(k.plan)
    assert "each cut moved back" in k.explain(batch=128, seqlen=32768, s_q=1)
    long_sq2 = k.explain(batch=128, seqlen=32768, s_q=2)
    assert "each cut moved back" not in long_sq2 and "combine: yes" in long_sq2
    assert "each cut moved back" in k.explain(batch=128, seqlen=8192, s_q=2)
    assert re.search(r"^\s+whole_tight_rows\s+157\s+157 rows a sequence", k.explain(), re.M)


def test_a_piece_cost_on_the_line_where_measured():
    """The Hopper family charges a piece's fixed cost on part mode's line (core/schedule.cuh
    line_length: 5 tiles, MLA b=8 s_k 32768 0.959 of the time without it, bench/RESULTS.md session
    43); mma_sync, where it was not measured, keeps the line of tiles alone. Rendered, explained."""
    hopper_plan = compile_quiet(REPO / "examples" / "mla.attn", family="hopper").plan
    mma_plan = compile_quiet(REPO / "examples" / "mla.attn", family="mma_sync").plan
    assert hopper_plan.config.piece_cost_tiles == 5 and mma_plan.config.piece_cost_tiles == 0
    assert "static constexpr int kPieceCostTiles = 5;" in render(hopper_plan)
    assert "static constexpr int kPieceCostTiles = 0;" in render(mma_plan)
    assert re.search(r"^\s+piece_cost_tiles\s+5\s+5: a part holding a sequence's start", "\n".join(hopper_plan.explain_lines()), re.M)
    assert split.whole_parts([10, 10], 3, -1, 5) == ([0, 0, 15, 30], False)  # the line: 15 + 15, cuts 10, 20 moved back
