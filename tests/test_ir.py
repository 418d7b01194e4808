"""The checked IR of every example and of inline variants: the numbers DESIGN.md §2
derives from a spec (record bytes, widths, groups, offsets, strides, storage tensors,
scale, intensity) and the spec's identity (`digest`)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import attncc
from attncc import storage

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_NAMES = ["mla", "mla_fp8_sparse", "gla2", "gta4", "gqa8", "mqa"]


def example(name: str):
    return attncc.compile(EXAMPLES / f"{name}.attn")


def test_every_example_is_listed_and_compiles():
    found = sorted(p.stem for p in EXAMPLES.glob("*.attn"))
    assert found == sorted(EXAMPLE_NAMES)
    for name in found:
        k = example(name)
        assert k.name == name
        assert k.spec.name == name


# name: bytes/token, d_k, d_v, heads q, heads kv, group, page, query len, causal, topk
NUMBERS = {
    "mla": (1152, 576, 512, 128, 1, 128, 64, 2, True, 0),
    "mla_fp8_sparse": (656, 576, 512, 128, 1, 128, 64, 2, False, 2048),
    "gla2": (1152, 320, 256, 128, 2, 64, 64, 2, True, 0),
    "gta4": (1152, 128, 128, 32, 4, 8, 16, 1, False, 0),
    "gqa8": (4096, 128, 128, 32, 8, 4, 16, 1, False, 0),
    "mqa": (512, 128, 128, 32, 1, 32, 16, 1, False, 0),
}


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_derived_numbers(name):
    spec = example(name).spec
    record, d_k, d_v, hq, hkv, group, page, qlen, causal, topk = NUMBERS[name]
    assert spec.record_bytes == record
    assert (spec.d_k, spec.d_v) == (d_k, d_v)
    assert (spec.heads_q, spec.heads_kv, spec.group) == (hq, hkv, group)
    assert spec.page_size == page
    assert spec.max_query_len == qlen
    assert spec.causal is causal
    assert spec.topk == topk
    assert spec.sparse is (topk > 0)
    assert spec.separate is False
    assert spec.elem.name == "bf16"
    assert spec.flops_per_token == 2 * hq * (d_k + d_v)
    assert spec.intensity == pytest.approx(2 * hq * (d_k + d_v) / record, rel=1e-12)


def test_mla_intensity_is_241_8():
    assert example("mla").spec.intensity == pytest.approx(241.78, abs=0.01)
    assert f"{example('mla').spec.intensity:.1f}" == "241.8"


# name: [(segment, dtype, dim, shared, copies, scale group, offset, copy bytes,
#         head stride, total bytes)]
SEGMENTS = {
    "mla": [("latent", "bf16", 512, False, 1, 0, 0, 1024, 1024, 1024),
            ("rope", "bf16", 64, False, 1, 0, 1024, 128, 128, 128)],
    # 512 fp8 bytes + 4 fp32 scales = 528, then the bf16 rope
    "mla_fp8_sparse": [("latent", "e4m3", 512, False, 1, 128, 0, 528, 528, 528),
                       ("rope", "bf16", 64, False, 1, 0, 528, 128, 128, 128)],
    "gla2": [("latent", "bf16", 256, False, 2, 0, 0, 512, 512, 1024),
             ("rope", "bf16", 64, True, 1, 0, 1024, 128, 0, 128)],
    "gta4": [("tied", "bf16", 128, False, 4, 0, 0, 256, 256, 1024),
             ("rope", "bf16", 64, True, 1, 0, 1024, 128, 0, 128)],
    "gqa8": [("k", "bf16", 128, False, 8, 0, 0, 256, 256, 2048),
             ("v", "bf16", 128, False, 8, 0, 2048, 256, 256, 2048)],
    "mqa": [("k", "bf16", 128, False, 1, 0, 0, 256, 256, 256),
            ("v", "bf16", 128, False, 1, 0, 256, 256, 256, 256)],
}


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_segment_layout(name):
    spec = example(name).spec
    got = [(s.name, s.dtype.name, s.dim, s.shared, s.copies, s.scale_group, s.offset,
            s.copy_bytes, s.head_stride, s.bytes) for s in spec.segments]
    assert got == SEGMENTS[name]
    assert sum(s[-1] for s in SEGMENTS[name]) == spec.record_bytes
    for seg in spec.segments:
        assert spec.segment(seg.name) is seg


def test_fp8_scales_follow_values():
    spec = example("mla_fp8_sparse").spec
    latent = spec.segment("latent")
    assert latent.values_bytes == 512
    assert latent.scales_per_copy == 4
    assert latent.copy_bytes == 512 + 4 * 4 == 528
    assert spec.segment("rope").offset == 528


# name: ((key slices), (value slices))
PROJECTIONS = {
    "mla": ((("latent", 0, 512), ("rope", 0, 64)), (("latent", 0, 512),)),
    "mla_fp8_sparse": ((("latent", 0, 512), ("rope", 0, 64)), (("latent", 0, 512),)),
    "gla2": ((("latent", 0, 256), ("rope", 0, 64)), (("latent", 0, 256),)),
    "gta4": ((("tied", 0, 64), ("rope", 0, 64)), (("tied", 0, 128),)),
    "gqa8": ((("k", 0, 128),), (("v", 0, 128),)),
    "mqa": ((("k", 0, 128),), (("v", 0, 128),)),
}


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_key_value_slices(name):
    spec = example(name).spec
    key, value = PROJECTIONS[name]
    assert tuple((s.segment, s.lo, s.hi) for s in spec.key) == key
    assert tuple((s.segment, s.lo, s.hi) for s in spec.value) == value
    assert sum(s.width for s in spec.key) == spec.d_k


# name: packed tensor's last dim and dtype
PACKED = {
    "mla": (576, torch.bfloat16),
    "mla_fp8_sparse": (656, torch.uint8),
    "gla2": (576, torch.bfloat16),
    "gta4": (576, torch.bfloat16),
    "gqa8": (2048, torch.bfloat16),
    "mqa": (256, torch.bfloat16),
}


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_packed_storage(name):
    spec = example(name).spec
    width, dtype = PACKED[name]
    if dtype == torch.uint8:
        assert spec.packed_dtype is None
    else:
        assert spec.packed_dtype.name == "bf16"
    layouts = storage.tensor_layouts(spec, 5)
    assert layouts == {"cache": ((5, spec.page_size, width), dtype)}


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_default_and_explicit_scale(name):
    spec = example(name).spec
    if name == "mla":
        assert spec.softmax_scale == 0.0721687836
        assert spec.softmax_scale == pytest.approx(1 / math.sqrt(192), rel=1e-9)
    else:
        assert spec.softmax_scale == pytest.approx(1 / math.sqrt(spec.d_k), rel=1e-15)
        assert spec.softmax_scale == pytest.approx(1 / math.sqrt(NUMBERS[name][1]), rel=1e-15)


def test_schedules():
    mla = example("mla").spec.schedule
    assert (mla.target, mla.split_kv, mla.seesaw, mla.crossover) == ("sm90a", "auto", True, False)
    assert (mla.tile_q, mla.tile_kv, mla.stages) == (64, 64, 2)
    fp8 = example("mla_fp8_sparse").spec.schedule
    assert (fp8.crossover, fp8.seesaw) == (True, False)
    gqa = example("gqa8").spec.schedule
    assert (gqa.target, gqa.split_kv, gqa.seesaw, gqa.crossover) == ("sm90a", "auto", False, False)


# --- identity -------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_digest_stable_and_independent_of_how_the_spec_is_given(name):
    path = EXAMPLES / f"{name}.attn"
    text = path.read_text()
    digests = {
        attncc.compile(path).spec.digest,
        attncc.compile(path).spec.digest,
        attncc.compile(str(path)).spec.digest,
        attncc.compile(text).spec.digest,
    }
    assert len(digests) == 1
    digest = digests.pop()
    assert len(digest) == 64 and int(digest, 16) >= 0


def test_digests_of_examples_differ():
    assert len({example(n).spec.digest for n in EXAMPLE_NAMES}) == len(EXAMPLE_NAMES)


def test_digest_ignores_comments_and_whitespace():
    text = (EXAMPLES / "gqa8.attn").read_text()
    moved = "\n\n# a new comment\n" + text.replace("    ", "\t  ").replace("\n", "\n\n")
    assert attncc.compile(moved).spec.digest == attncc.compile(text).spec.digest


def _changed(name: str, old: str, new: str) -> str:
    text = (EXAMPLES / f"{name}.attn").read_text()
    assert old in text, old
    return text.replace(old, new)


CHANGES = [
    ("mla", "q = 128", "q = 64"),
    ("mla", "kv = 1", "kv = 2"),
    ("mla", "paged(64)", "paged(32)"),
    ("mla", "bf16[512]", "bf16[256]"),
    ("mla", "bf16[64]", "bf16[32]"),
    ("gqa8", "bf16", "fp16"),
    ("mla", "query len <= 2", "query len <= 3"),
    ("mla", " causal", ""),
    ("mla", "0.0721687836", "0.0721687837"),
    ("mla", "split_kv auto", "split_kv 4"),
    ("mla", "split_kv auto", "split_kv off"),
    ("mla", "    seesaw\n", ""),
    ("mla", "tile q = 64, kv = 64", "tile q = 64, kv = 32"),
    ("mla", "tile q = 64, kv = 64", "tile q = 32, kv = 64"),
    ("mla", "stages 2", "stages 3"),
    ("gqa8", "attention gqa8", "attention gqa8b"),
    ("mla", "value = latent", "value = latent[0:256]"),
    ("mla_fp8_sparse", "per 128", "per 64"),
    ("mla_fp8_sparse", "e4m3[512]", "e5m2[512]"),
    ("mla_fp8_sparse", "topk 2048", "topk 1024"),
    ("mla_fp8_sparse", "    crossover", "    target sm90a"),
    ("gla2", "bf16[64] shared", "bf16[64]"),
    ("gta4", "tied[0:64]", "tied[0:32]"),
    ("gta4", "tied[0:64]", "tied[1:65]"),
    ("gqa8", "kv = 8", "kv = 4"),
    ("gqa8", "paged(16)", "paged(16) separate"),
    ("gqa8", "key   = k", "key   = k\n    scale 0.125"),
]


@pytest.mark.parametrize("name,old,new", CHANGES)
def test_digest_changes_with_any_number(name, old, new):
    # the digest is the checked IR's identity: check only (a changed schedule may not lower)
    from attncc.frontend import check_spec

    base = check_spec(EXAMPLES / f"{name}.attn")
    changed = check_spec(_changed(name, old, new))
    assert changed.digest != base.digest
    assert check_spec(_changed(name, old, new)).digest == changed.digest


def test_digest_changes_with_schedule_target():
    text = (EXAMPLES / "gqa8.attn").read_text()
    a = attncc.compile(text + "\nschedule gqa8 { target sm80 }\n").spec
    b = attncc.compile(text + "\nschedule gqa8 { target sm90a }\n").spec
    c = attncc.compile(text).spec
    assert a.digest != b.digest
    # the default schedule is sm90a: writing it out is the same spec
    assert b.digest == c.digest


# --- separate storage (DESIGN.md §2) ----------------------------------------------------

SEPARATE_MLA = """
attention mla_sep {
    heads q = 16, kv = 1
    cache paged(64) separate {
        latent: bf16[512]
        rope:   bf16[64]
    }
    key   = latent ++ rope
    value = latent
}
"""

SEPARATE_GLA = """
attention gla_sep {
    heads q = 8, kv = 2
    cache paged(32) separate {
        latent: bf16[256]
        rope:   bf16[64] shared
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
}
"""

SEPARATE_FP8 = """
attention fp8_sep {
    heads q = 8, kv = 1
    cache paged(64) separate {
        latent: e4m3[512] scale fp32 per 128
        rope:   bf16[64]
    }
    key   = latent ++ rope
    value = latent
    tokens topk 64
}
"""

SEPARATE_MIXED = """
attention mixed_sep {
    heads q = 6, kv = 3
    cache paged(7) separate {
        k:    e5m2[96] scale fp32 per 32
        pos:  e4m3[16] shared scale fp32 per 8
        v:    fp16[48]
    }
    key   = k ++ pos
    value = v
}
"""


def test_separate_layouts():
    mla = attncc.compile(SEPARATE_MLA).spec
    assert mla.separate
    assert storage.tensor_layouts(mla, 3) == {
        "latent": ((3, 64, 1, 512), torch.bfloat16),
        "rope": ((3, 64, 1, 64), torch.bfloat16),
    }
    gla = attncc.compile(SEPARATE_GLA).spec
    assert storage.tensor_layouts(gla, 2) == {
        "latent": ((2, 32, 2, 256), torch.bfloat16),
        "rope": ((2, 32, 64), torch.bfloat16),  # shared: no head axis
    }
    fp8 = attncc.compile(SEPARATE_FP8).spec
    assert storage.tensor_layouts(fp8, 4) == {
        "latent": ((4, 64, 1, 512), torch.float8_e4m3fn),
        "latent_scale": ((4, 64, 1, 4), torch.float32),
        "rope": ((4, 64, 1, 64), torch.bfloat16),
    }
    mixed = attncc.compile(SEPARATE_MIXED).spec
    assert storage.tensor_layouts(mixed, 5) == {
        "k": ((5, 7, 3, 96), torch.float8_e5m2),
        "k_scale": ((5, 7, 3, 3), torch.float32),
        "pos": ((5, 7, 16), torch.float8_e4m3fn),
        "pos_scale": ((5, 7, 2), torch.float32),
        "v": ((5, 7, 3, 48), torch.float16),
    }
    assert mixed.elem.name == "fp16"


def test_separate_keeps_derived_numbers():
    """Storage is how the record is laid out, not what it holds: bytes/token, widths
    and scale are those of the packed spec."""
    packed = attncc.compile(SEPARATE_FP8.replace(" separate", "")).spec
    sep = attncc.compile(SEPARATE_FP8).spec
    assert sep.record_bytes == packed.record_bytes == 656
    assert (sep.d_k, sep.d_v) == (packed.d_k, packed.d_v) == (576, 512)
    assert sep.softmax_scale == packed.softmax_scale == pytest.approx(1 / 24)
    assert sep.digest != packed.digest
    assert storage.tensor_layouts(packed, 4) == {"cache": ((4, 64, 656), torch.uint8)}
    mixed = attncc.compile(SEPARATE_MIXED).spec
    # k: 3 heads * (96 + 3*4), pos: 16 + 2*4, v: 3 * 48 * 2
    assert mixed.record_bytes == 3 * (96 + 12) + (16 + 8) + 3 * 96
    assert (mixed.d_k, mixed.d_v, mixed.group) == (112, 48, 2)


def test_packed_mixed_offsets_and_dtypes():
    spec = attncc.compile(SEPARATE_MIXED.replace(" separate", "")).spec
    k, pos, v = spec.segments
    assert (k.offset, k.copy_bytes, k.head_stride, k.bytes) == (0, 108, 108, 324)
    assert (pos.offset, pos.copy_bytes, pos.head_stride, pos.bytes) == (324, 24, 0, 24)
    assert (v.offset, v.copy_bytes, v.head_stride, v.bytes) == (348, 96, 96, 288)
    assert spec.packed_dtype is None
    assert storage.tensor_layouts(spec, 2) == {"cache": ((2, 7, 636), torch.uint8)}
    fp16 = attncc.compile("""
        attention h { heads q = 4, kv = 2
            cache paged(3) { k: fp16[8]  v: fp16[8] }
            key = k  value = v }""").spec
    assert fp16.packed_dtype.name == "fp16"
    assert storage.tensor_layouts(fp16, 2) == {"cache": ((2, 3, 32), torch.float16)}
    assert fp16.softmax_scale == pytest.approx(1 / math.sqrt(8))
