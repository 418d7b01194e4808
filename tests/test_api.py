"""The Python API of DESIGN.md §3 on CPU tensors: the call (reference math, dtypes,
`scale=`, determinism), cache allocation, and runtime validation of every argument."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import attncc
import attncc.storage
from attncc import reference, storage, testing

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

DENSE = """
attention dense {
    heads q = 4, kv = 2
    cache paged(4) {
        k: bf16[8]
        v: bf16[8]
    }
    key   = k
    value = v
    query len <= 2 causal
}
"""

SPARSE = """
attention sparse {
    heads q = 4, kv = 1
    cache paged(4) {
        latent: e4m3[16] scale fp32 per 8
        rope:   bf16[4]
    }
    key   = latent ++ rope
    value = latent
    tokens topk 6
    query len <= 2
}
"""

SEPARATE = """
attention sep {
    heads q = 4, kv = 2
    cache paged(4) separate {
        latent: bf16[8]
        rope:   bf16[4] shared
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
}
"""

HALF = """
attention half {
    heads q = 6, kv = 3
    cache paged(3) {
        k: fp16[8]
        v: fp16[4]
    }
    key   = k
    value = v
}
"""

ALL_FP8 = """
attention allfp8 {
    heads q = 4, kv = 2
    cache paged(4) {
        k: e4m3[8] scale fp32 per 4
        v: e5m2[8] scale fp32 per 8
    }
    key   = k
    value = v
    query len <= 2 causal
}
"""


def _fill(kernel, cache, num_slots, gen):
    """Write every slot of the cache with random values (no zeros)."""
    spec = kernel.spec
    values = {}
    for seg in spec.segments:
        shape = (num_slots, seg.dim) if seg.shared else (num_slots, spec.heads_kv, seg.dim)
        values[seg.name] = torch.randn(shape, generator=gen) + 0.25
    kernel.write_cache(cache, torch.arange(num_slots), **values)


def dense_inputs(text=DENSE, seed=0, s_q=1):
    kernel = attncc.compile(text)
    spec = kernel.spec
    gen = torch.Generator().manual_seed(seed)
    cache = kernel.new_cache(3, device="cpu")
    _fill(kernel, cache, 3 * spec.page_size, gen)
    dtype = getattr(torch, spec.elem.torch_name)
    q = torch.randn(2, s_q, spec.heads_q, spec.d_k, generator=gen).to(dtype)
    block_table = torch.tensor([[2, 0], [1, 2]], dtype=torch.int32)
    seqlens = torch.tensor([5, 3], dtype=torch.int32)
    return kernel, dict(q=q, cache=cache, block_table=block_table, seqlens=seqlens)


def sparse_inputs(seed=0, s_q=2):
    kernel = attncc.compile(SPARSE)
    gen = torch.Generator().manual_seed(seed)
    cache = kernel.new_cache(3, device="cpu")
    _fill(kernel, cache, 12, gen)
    q = torch.randn(2, s_q, 4, 20, generator=gen).to(torch.bfloat16)
    indices = torch.tensor([[[0, 5, -1, 11, 3, -1], [7, -1, -1, -1, -1, -1]],
                            [[-1, -1, -1, -1, -1, -1], [1, 2, 3, 4, 5, 6]]], dtype=torch.int32)
    return kernel, dict(q=q, cache=cache, indices=indices[:, :s_q])


def call(kernel, args):
    args = dict(args)
    return kernel(args.pop("q"), args.pop("cache"), args.pop("block_table", None),
                  args.pop("seqlens", None), **args)


# --- the call ----------------------------------------------------------------------------


CALL_CASES = {
    "dense s_q=1": lambda: dense_inputs(s_q=1),
    "dense s_q=2 causal": lambda: dense_inputs(s_q=2, seed=1),
    "separate": lambda: dense_inputs(SEPARATE, s_q=2, seed=2),
    "fp16": lambda: dense_inputs(HALF, seed=3),
    "all fp8, q bf16": lambda: dense_inputs(ALL_FP8, s_q=2, seed=7),
    "sparse fp8": lambda: sparse_inputs(),
}


@pytest.mark.parametrize("case", CALL_CASES)
def test_call_equals_reference(case):
    kernel, args = CALL_CASES[case]()
    q = args["q"]
    out, lse = call(kernel, args)
    spec = kernel.spec
    b, s_q = q.shape[:2]
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert out.shape == (b, s_q, spec.heads_q, spec.d_v)
    assert lse.shape == (b, spec.heads_q, s_q)
    ref_args = {k: v for k, v in args.items() if k != "q"}
    ref_out, ref_lse = reference.attention(spec, q, **ref_args)
    assert torch.equal(out, ref_out.to(q.dtype))
    assert torch.equal(lse, ref_lse.float())
    # and within the q dtype's rounding of the float64 truth
    out64, lse64 = reference.attention(spec, q, **ref_args, dtype=torch.float64)
    torch.testing.assert_close(out.double(), out64, rtol=1e-2, atol=1e-2)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse.double()[finite], lse64[finite], rtol=1e-5, atol=1e-5)
    assert finite.any()
    assert out.abs().max() > 0


def test_call_on_a_real_example():
    kernel = attncc.compile(EXAMPLES / "gta4.attn")
    gen = torch.Generator().manual_seed(4)
    cache = kernel.new_cache(2, device="cpu")
    _fill(kernel, cache, 32, gen)
    q = torch.randn(1, 1, 32, 128, generator=gen).to(torch.bfloat16)
    bt = torch.tensor([[1, 0]], dtype=torch.int32)
    sl = torch.tensor([19], dtype=torch.int32)
    out, lse = kernel(q, cache, bt, sl)
    ref_out, ref_lse = reference.attention(kernel.spec, q, cache, bt, sl)
    assert torch.equal(out, ref_out.to(torch.bfloat16)) and torch.equal(lse, ref_lse)


def test_empty_queries_give_zero_and_minus_inf():
    kernel, args = dense_inputs(s_q=2)
    args["seqlens"] = torch.tensor([0, 1], dtype=torch.int32)
    out, lse = call(kernel, args)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    # causal, seqlen 1, s_q 2: token 0 sees nothing, token 1 sees position 0
    assert (out[1, 0] == 0).all() and torch.isneginf(lse[1, :, 0]).all()
    assert torch.isfinite(lse[1, :, 1]).all() and (out[1, 1] != 0).any()
    kernel, args = sparse_inputs()
    out, lse = call(kernel, args)
    assert (out[1, 0] == 0).all() and torch.isneginf(lse[1, :, 0]).all()
    assert torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("case", ["dense s_q=2 causal", "sparse fp8"])
def test_scale_override(case):
    kernel, args = CALL_CASES[case]()
    default_out, default_lse = call(kernel, args)
    out, lse = call(kernel, dict(args, scale=0.3))
    ref_args = {k: v for k, v in args.items() if k != "q"}
    ref_out, ref_lse = reference.attention(kernel.spec, args["q"], **ref_args, scale=0.3)
    assert torch.equal(out, ref_out.to(out.dtype)) and torch.equal(lse, ref_lse)
    assert not torch.equal(lse, default_lse)
    assert not torch.equal(out, default_out)
    # passing the spec's own scale is the default
    same_out, same_lse = call(kernel, dict(args, scale=kernel.spec.softmax_scale))
    assert torch.equal(same_out, default_out) and torch.equal(same_lse, default_lse)


@pytest.mark.parametrize("bad", [0.0, -0.5, float("inf"), float("nan"), "big"])
def test_scale_override_must_be_positive_finite(bad):
    kernel, args = dense_inputs(s_q=1)
    with pytest.raises((ValueError, TypeError), match=r"^scale: expected a positive finite number"):
        call(kernel, dict(args, scale=bad))


def test_scale_override_matches_a_spec_with_that_scale():
    kernel, args = dense_inputs(s_q=2, seed=5)
    other = attncc.compile(DENSE.replace("query len <= 2 causal", "query len <= 2 causal\n scale 0.3"))
    assert other.spec.softmax_scale == 0.3
    out_a, lse_a = call(kernel, dict(args, scale=0.3))
    out_b, lse_b = call(other, args)
    assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)
    assert kernel.spec.softmax_scale == pytest.approx(1 / math.sqrt(8))


@pytest.mark.parametrize("case", CALL_CASES)
def test_deterministic(case):
    kernel, args = CALL_CASES[case]()
    out1, lse1 = call(kernel, args)
    out2, lse2 = call(kernel, args)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)
    # bitwise, NaN-free
    assert torch.equal(out1.view(torch.int16), out2.view(torch.int16))
    assert not out1.isnan().any()


def test_call_does_not_modify_inputs():
    kernel, args = dense_inputs(s_q=2)
    before = {k: v.clone() for k, v in args.items()}
    call(kernel, args)
    for k, v in args.items():
        assert torch.equal(v, before[k]), k


# --- new_cache ------------------------------------------------------------------------------


def test_new_cache_packed_bf16():
    kernel = attncc.compile(EXAMPLES / "mla.attn")
    cache = kernel.new_cache(3, device="cpu")
    assert isinstance(cache, torch.Tensor)
    assert cache.shape == (3, 64, 576) and cache.dtype == torch.bfloat16
    assert cache.is_contiguous() and (cache == 0).all()
    gqa = attncc.compile(EXAMPLES / "gqa8.attn").new_cache(2, device="cpu")
    assert gqa.shape == (2, 16, 2048) and gqa.dtype == torch.bfloat16


def test_new_cache_packed_fp8_bytes():
    kernel = attncc.compile(EXAMPLES / "mla_fp8_sparse.attn")
    cache = kernel.new_cache(2, device="cpu")
    assert cache.shape == (2, 64, 656) and cache.dtype == torch.uint8
    assert cache.is_contiguous()


def test_all_fp8_record_takes_bf16_queries():
    kernel, args = dense_inputs(ALL_FP8, s_q=2)
    assert args["cache"].dtype == torch.uint8 and args["cache"].shape == (3, 4, 2 * (8 + 2 * 4) + 2 * (8 + 4))
    for dtype in (torch.float16, torch.float32):
        expect_error(lambda: call(kernel, dict(args, q=args["q"].to(dtype))), "q", TypeError)


def test_new_cache_packed_fp16():
    cache = attncc.compile(HALF).new_cache(4, device="cpu")
    assert cache.shape == (4, 3, 3 * 8 + 3 * 4) and cache.dtype == torch.float16


def test_new_cache_separate():
    cache = attncc.compile(SEPARATE).new_cache(5, device="cpu")
    assert isinstance(cache, dict) and set(cache) == {"latent", "rope"}
    assert cache["latent"].shape == (5, 4, 2, 8) and cache["latent"].dtype == torch.bfloat16
    assert cache["rope"].shape == (5, 4, 4) and cache["rope"].dtype == torch.bfloat16
    fp8 = attncc.compile(SPARSE.replace("paged(4)", "paged(4) separate")).new_cache(2, device="cpu")
    assert set(fp8) == {"latent", "latent_scale", "rope"}
    assert fp8["latent"].shape == (2, 4, 1, 16) and fp8["latent"].dtype == torch.float8_e4m3fn
    assert fp8["latent_scale"].shape == (2, 4, 1, 2) and fp8["latent_scale"].dtype == torch.float32
    assert fp8["rope"].shape == (2, 4, 1, 4) and fp8["rope"].dtype == torch.bfloat16


def test_new_cache_needs_a_page():
    with pytest.raises(ValueError, match="num_pages"):
        attncc.compile(DENSE).new_cache(0, device="cpu")


# --- runtime validation ------------------------------------------------------------------


def names(message: str, name: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message) is not None


def expect_error(fn, name, kind=(TypeError, ValueError)):
    with pytest.raises(kind) as info:
        fn()
    assert names(str(info.value), name), f"{name!r} not named in: {info.value}"
    return str(info.value)


def _dense(**changes):
    kernel, args = dense_inputs(s_q=2)
    args.update(changes(args) if callable(changes) else changes)
    return kernel, args


BAD_DENSE = {
    # name: (argument named in the message, exception, args -> replacements)
    "q dtype": ("q", TypeError, lambda a: dict(q=a["q"].float())),
    "q rank": ("q", ValueError, lambda a: dict(q=a["q"][0])),
    "q heads": ("q", ValueError, lambda a: dict(q=torch.ones(2, 2, 5, 8, dtype=torch.bfloat16))),
    "q d_k": ("q", ValueError, lambda a: dict(q=torch.ones(2, 2, 4, 9, dtype=torch.bfloat16))),
    "q s_q > max": ("q", ValueError, lambda a: dict(q=torch.ones(2, 3, 4, 8, dtype=torch.bfloat16))),
    "q s_q = 0": ("q", ValueError, lambda a: dict(q=torch.ones(2, 0, 4, 8, dtype=torch.bfloat16))),
    "q not a tensor": ("q", TypeError, lambda a: dict(q=a["q"].tolist())),
    "cache shape": ("cache", ValueError, lambda a: dict(cache=torch.ones(3, 4, 30, dtype=torch.bfloat16))),
    "cache page size": ("cache", ValueError, lambda a: dict(cache=torch.ones(3, 5, 32, dtype=torch.bfloat16))),
    "cache dtype": ("cache", TypeError, lambda a: dict(cache=a["cache"].half())),
    "cache not a tensor": ("cache", TypeError, lambda a: dict(cache=a["cache"].tolist())),
    "cache dict for packed": ("cache", TypeError, lambda a: dict(cache={"cache": a["cache"]})),
    "cache not contiguous": ("cache", ValueError,
                             lambda a: dict(cache=torch.ones(3, 32, 4, dtype=torch.bfloat16).transpose(1, 2))),
    "block_table int64": ("block_table", TypeError, lambda a: dict(block_table=a["block_table"].long())),
    "block_table batch": ("block_table", ValueError,
                          lambda a: dict(block_table=torch.zeros(3, 2, dtype=torch.int32))),
    "block_table rank": ("block_table", ValueError, lambda a: dict(block_table=a["block_table"][0])),
    "block_table too short": ("block_table", ValueError,
                              lambda a: dict(block_table=a["block_table"][:, :1].contiguous())),
    "block_table page too big": ("block_table", ValueError,
                                 lambda a: dict(block_table=torch.tensor([[2, 3], [1, 2]], dtype=torch.int32))),
    "block_table negative page": ("block_table", ValueError,
                                  lambda a: dict(block_table=torch.tensor([[2, 0], [-1, 2]], dtype=torch.int32))),
    "block_table missing": ("block_table", TypeError, lambda a: dict(block_table=None)),
    "block_table not a tensor": ("block_table", TypeError, lambda a: dict(block_table=[[2, 0], [1, 2]])),
    "seqlens int64": ("seqlens", TypeError, lambda a: dict(seqlens=a["seqlens"].long())),
    "seqlens float": ("seqlens", TypeError, lambda a: dict(seqlens=a["seqlens"].float())),
    "seqlens batch": ("seqlens", ValueError, lambda a: dict(seqlens=torch.tensor([5, 3, 1], dtype=torch.int32))),
    "seqlens negative": ("seqlens", ValueError, lambda a: dict(seqlens=torch.tensor([5, -1], dtype=torch.int32))),
    "seqlens missing": ("seqlens", TypeError, lambda a: dict(seqlens=None)),
    "indices for a dense spec": ("indices", TypeError,
                                 lambda a: dict(indices=torch.zeros(2, 2, 4, dtype=torch.int32))),
}


@pytest.mark.parametrize("case", BAD_DENSE)
def test_dense_call_validation(case):
    name, kind, change = BAD_DENSE[case]
    kernel, args = dense_inputs(s_q=2)
    call(kernel, args)  # the unchanged arguments are fine
    args.update(change(args))
    expect_error(lambda: call(kernel, args), name, kind)


BAD_SPARSE = {
    "block_table for a sparse spec": ("block_table", TypeError,
                                      lambda a: dict(block_table=torch.zeros(2, 3, dtype=torch.int32))),
    "indices missing": ("indices", TypeError, lambda a: dict(indices=None)),
    "indices too big": ("indices", ValueError,
                        lambda a: dict(indices=torch.where(a["indices"] == 11, 12, a["indices"]))),
    "indices below -1": ("indices", ValueError,
                         lambda a: dict(indices=torch.where(a["indices"] == 5, -2, a["indices"]))),
    "indices int64": ("indices", TypeError, lambda a: dict(indices=a["indices"].long())),
    "indices topk": ("indices", ValueError, lambda a: dict(indices=a["indices"][..., :5].contiguous())),
    "indices s_q": ("indices", ValueError, lambda a: dict(indices=a["indices"][:, :1].contiguous())),
    "seqlens int64": ("seqlens", TypeError, lambda a: dict(seqlens=torch.tensor([1, 2]))),
    # record: 16 fp8 + 2 fp32 scales + 4 bf16 = 32 bytes
    "cache shape": ("cache", ValueError, lambda a: dict(cache=torch.zeros(3, 4, 30, dtype=torch.uint8))),
    "cache bf16 view": ("cache", ValueError, lambda a: dict(cache=a["cache"].view(torch.bfloat16))),
    "cache dtype": ("cache", TypeError, lambda a: dict(cache=torch.zeros(3, 4, 32, dtype=torch.int8))),
    "q d_k": ("q", ValueError, lambda a: dict(q=torch.ones(2, 2, 4, 16, dtype=torch.bfloat16))),
    "q dtype fp16": ("q", TypeError, lambda a: dict(q=a["q"].half())),
}


@pytest.mark.parametrize("case", BAD_SPARSE)
def test_sparse_call_validation(case):
    name, kind, change = BAD_SPARSE[case]
    kernel, args = sparse_inputs()
    call(kernel, args)
    call(kernel, dict(args, seqlens=torch.tensor([3, 4], dtype=torch.int32)))
    args.update(change(args))
    expect_error(lambda: call(kernel, args), name, kind)


def test_separate_cache_validation():
    kernel, args = dense_inputs(SEPARATE, s_q=2)
    call(kernel, args)
    cache = args["cache"]
    msg = expect_error(lambda: call(kernel, dict(args, cache={"latent": cache["latent"]})),
                       "cache", ValueError)
    assert "rope" in msg
    extra = dict(cache, extra=cache["rope"])
    expect_error(lambda: call(kernel, dict(args, cache=extra)), "cache", ValueError)
    wrong = dict(cache, rope=torch.zeros(3, 4, 2, 4, dtype=torch.bfloat16))  # shared: no head axis
    msg = expect_error(lambda: call(kernel, dict(args, cache=wrong)), "cache", ValueError)
    assert "rope" in msg
    wrong = dict(cache, latent=cache["latent"].half())
    msg = expect_error(lambda: call(kernel, dict(args, cache=wrong)), "cache", TypeError)
    assert "latent" in msg
    fewer_pages = dict(cache, rope=cache["rope"][:2].contiguous())
    expect_error(lambda: call(kernel, dict(args, cache=fewer_pages)), "cache", ValueError)
    packed = torch.zeros(3, 4, 20, dtype=torch.bfloat16)
    expect_error(lambda: call(kernel, dict(args, cache=packed)), "cache", TypeError)


@pytest.mark.parametrize("which", ["latent", "rope"])
def test_separate_cache_entry_not_a_tensor(which):
    kernel, args = dense_inputs(SEPARATE, s_q=2)
    cache = dict(args["cache"])
    cache[which] = cache[which].tolist()
    msg = expect_error(lambda: call(kernel, dict(args, cache=cache)), "cache", TypeError)
    assert which in msg


def test_devices_must_match():
    """Tensors on different devices (the meta device stands in for a GPU here)."""
    kernel, args = dense_inputs(s_q=2)
    for arg in ("cache", "block_table", "seqlens"):
        moved = dict(args, **{arg: args[arg].to("meta")})
        expect_error(lambda: call(kernel, moved), arg, ValueError)
    kernel, args = sparse_inputs()
    for arg in ("cache", "indices"):
        moved = dict(args, **{arg: args[arg].to("meta")})
        expect_error(lambda: call(kernel, moved), arg, ValueError)


# --- write_cache validation ---------------------------------------------------------------


def _write_args():
    kernel = attncc.compile(SEPARATE)
    cache = kernel.new_cache(2, device="cpu")
    slots = torch.tensor([0, 3, 7])
    values = dict(latent=torch.randn(3, 2, 8), rope=torch.randn(3, 4))
    return kernel, cache, slots, values


BAD_WRITES = {
    "missing segment": ("rope", TypeError, lambda s, v: (s, {"latent": v["latent"]})),
    "unknown segment": ("nope", TypeError, lambda s, v: (s, dict(v, nope=v["rope"]))),
    "wrong shape": ("latent", ValueError, lambda s, v: (s, dict(v, latent=torch.randn(3, 2, 7)))),
    "wrong heads": ("latent", ValueError, lambda s, v: (s, dict(v, latent=torch.randn(3, 1, 8)))),
    "shared with head axis": ("rope", ValueError, lambda s, v: (s, dict(v, rope=torch.randn(3, 2, 4)))),
    "wrong count": ("latent", ValueError, lambda s, v: (s, dict(v, latent=torch.randn(2, 2, 8)))),
    "integer values": ("latent", TypeError,
                       lambda s, v: (s, dict(v, latent=torch.ones(3, 2, 8, dtype=torch.int32)))),
    "values not a tensor": ("rope", TypeError, lambda s, v: (s, dict(v, rope=v["rope"].tolist()))),
    "slot too big": ("slots", ValueError, lambda s, v: (torch.tensor([0, 3, 8]), v)),
    "slot negative": ("slots", ValueError, lambda s, v: (torch.tensor([0, -2, 7]), v)),
    "float slots": ("slots", TypeError, lambda s, v: (s.float(), v)),
    "bool slots": ("slots", TypeError, lambda s, v: (torch.tensor([True, False, True]), v)),
    "2-D slots": ("slots", TypeError, lambda s, v: (s[None], v)),
    "slots not a tensor": ("slots", TypeError, lambda s, v: ([0, 3, 7], v)),
}


@pytest.mark.parametrize("case", BAD_WRITES)
def test_write_cache_validation(case):
    name, kind, change = BAD_WRITES[case]
    kernel, cache, slots, values = _write_args()
    kernel.write_cache(cache, slots, **values)  # the unchanged arguments are fine
    before = {k: t.clone() for k, t in cache.items()}
    slots, values = change(slots, values)
    expect_error(lambda: kernel.write_cache(cache, slots, **values), name, kind)
    for k, t in cache.items():  # nothing was written
        assert torch.equal(t, before[k]), k


def test_write_cache_validates_the_cache():
    kernel, cache, slots, values = _write_args()
    expect_error(lambda: kernel.write_cache({"latent": cache["latent"]}, slots, **values),
                 "cache", ValueError)
    packed = attncc.compile(DENSE)
    expect_error(lambda: packed.write_cache(torch.zeros(2, 4, 30, dtype=torch.bfloat16),
                                            slots, k=torch.randn(3, 2, 8), v=torch.randn(3, 2, 8)),
                 "cache", ValueError)


def test_write_cache_slots_of_any_integer_dtype():
    kernel, cache, slots, values = _write_args()
    for dtype in (torch.int32, torch.int64, torch.int16):
        fresh = kernel.new_cache(2, device="cpu")
        kernel.write_cache(fresh, slots.to(dtype), **values)
        got = fresh["latent"].view(-1, 2, 8)[slots]
        assert torch.equal(got, values["latent"].to(torch.bfloat16))
        assert torch.equal(fresh["rope"].view(-1, 4)[slots], values["rope"].to(torch.bfloat16))


@pytest.mark.parametrize("text", [SPARSE, SPARSE.replace("paged(4)", "paged(4) separate"), SEPARATE])
def test_write_cache_no_slots_is_a_no_op(text):
    kernel = attncc.compile(text)
    cache = kernel.new_cache(1, device="cpu")
    _fill(kernel, cache, 4, torch.Generator().manual_seed(6))
    before = {k: v.clone() for k, v in attncc.storage.cache_tensors(cache).items()}
    spec = kernel.spec
    values = {s.name: torch.randn((0, s.dim) if s.shared else (0, spec.heads_kv, s.dim))
              for s in spec.segments}
    kernel.write_cache(cache, torch.zeros(0, dtype=torch.long), **values)
    for k, v in attncc.storage.cache_tensors(cache).items():
        assert torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), k


# --- write_cache inside a serving engine: -1 skipped, no host sync (DESIGN.md §3a) ---------------

PACKED_FP8 = """attention pk {
    heads q = 4, kv = 2
    cache paged(4) { c: e4m3[32] scale fp32 per 16  r: bf16[16] shared }
    key = c ++ r
    value = c
}"""


@pytest.mark.parametrize("text", [SEPARATE, PACKED_FP8])
def test_write_cache_skips_slot_minus_one(text):
    kernel = attncc.compile(text)
    cache = kernel.new_cache(3, device="cpu")
    gen = torch.Generator().manual_seed(1)

    def values(n):
        return {s.name: torch.randn(n, *(() if s.shared else (kernel.spec.heads_kv,)), s.dim, generator=gen)
                for s in kernel.spec.segments}

    first = values(4)
    kernel.write_cache(cache, torch.tensor([5, 0, 11, 6]), **first)
    before = {k: t.clone() for k, t in storage.cache_tensors(cache).items()}
    padded = values(5)
    kernel.write_cache(cache, torch.tensor([-1, 2, -1, 9, -1]), **padded)
    expected = {k: t.clone() for k, t in before.items()}
    reference = {k: t.clone() for k, t in before.items()}
    reference = reference if kernel.spec.separate else reference[storage.PACKED_NAME]
    storage.write(kernel.spec, reference, torch.tensor([2, 9]),
                  {n: (v if not kernel.spec.segment(n).shared else v[:, None])[[1, 3]] for n, v in padded.items()})
    for name, t in storage.cache_tensors(cache).items():
        assert torch.equal(t.view(torch.uint8), storage.cache_tensors(reference)[name].view(torch.uint8)), name
    # every slot but 2 and 9 is as it was: nothing landed where -1 pointed
    changed = {name: (t.view(torch.uint8) != expected[name].view(torch.uint8)).flatten(2).any(-1).flatten()
               for name, t in storage.cache_tensors(cache).items()}
    for name, rows in changed.items():
        assert set(rows.nonzero().flatten().tolist()) <= {2, 9}, name
    kernel.write_cache(cache, torch.tensor([-1, -1]), **values(2))  # only padding: no change
    for name, t in storage.cache_tensors(cache).items():
        assert torch.equal(t, storage.cache_tensors(reference)[name]), name


def _meta(x):
    return {k: _meta(v) for k, v in x.items()} if isinstance(x, dict) else x.to("meta")


@pytest.mark.parametrize("text", [SEPARATE, PACKED_FP8])
def test_write_cache_reads_no_value_on_the_host(text):
    """On the meta device a tensor has no values: any read of one (a host sync on CUDA:
    .item(), int(), a boolean mask, nonzero) raises. storage.write runs there."""
    kernel = attncc.compile(text)
    cache = _meta(kernel.new_cache(3, device="cpu"))
    slots = torch.tensor([3, -1, 7]).to("meta")
    values = {s.name: torch.randn(3, *(() if s.shared else (kernel.spec.heads_kv,)), s.dim).to("meta")
              for s in kernel.spec.segments}
    values = {n: v if not kernel.spec.segment(n).shared else v[:, None] for n, v in values.items()}
    written = storage.write(kernel.spec, cache, slots, values)
    assert written.device.type == "meta" and written.shape == (3,)
    with pytest.raises((RuntimeError, NotImplementedError)):
        int(written.any())  # the meta device does refuse a read


def test_device_flags_record_without_a_sync_and_check_raises_naming_the_argument():
    from attncc.devicecheck import DeviceFlags

    flags = DeviceFlags()
    flags.record(torch.tensor(False), 1)
    flags.check()  # nothing recorded
    flags.record(torch.tensor(True), 1)
    with pytest.raises(ValueError, match="^slots: write_cache got a slot outside"):
        flags.check()
    flags.check()  # cleared
    meta = DeviceFlags()
    meta.record(torch.tensor(True).to("meta"), 1)  # recording reads nothing


def test_attncc_check_makes_calls_check_at_once(monkeypatch):
    from attncc import devicecheck

    monkeypatch.delenv("ATTNCC_CHECK", raising=False)
    assert not devicecheck.synchronous()
    monkeypatch.setenv("ATTNCC_CHECK", "1")
    assert devicecheck.synchronous()
    monkeypatch.setenv("ATTNCC_CHECK", "0")
    assert not devicecheck.synchronous()


# --- caches as engines hold them (DESIGN.md §3a): views, without a copy ---------------------------

MLA_TINY = """attention mla_tiny {
    heads q = 4, kv = 1
    cache paged(4) { latent: bf16[64]  rope: bf16[16] }
    key = latent ++ rope
    value = latent
    query len <= 2 causal
}"""
MLA_TINY_SEPARATE = MLA_TINY.replace("paged(4)", "paged(4) separate").replace("mla_tiny", "mla_tiny_sep")
GQA_TINY_SEPARATE = """attention gqa_tiny_sep {
    heads q = 4, kv = 2
    cache paged(4) separate { k: bf16[32]  v: bf16[32] }
    key = k
    value = v
}"""


def _view_case(text):
    k = attncc.compile(text)
    lengths = [9, 3, 14]
    case = testing.random_case(k.spec, lengths, 2 if k.spec.max_query_len > 1 else 1, device="cpu", seed=17)
    want = k(case.q, case.cache, case.block_table, case.seqlens)
    return k, case, want


def _views(name, cache):
    """The engines' layouts of the same cache contents: (description, view, buffer)."""
    nan = float("nan")
    if name == "flashmla":  # [num_blocks, 64, 1, 576]
        return cache.unsqueeze(2).clone(), None
    if name == "wide":  # [:, :, :576] of a wider buffer
        buf = torch.full((*cache.shape[:2], cache.shape[2] + 24), nan, dtype=cache.dtype)
        buf[..., :cache.shape[2]] = cache
        return buf[..., :cache.shape[2]], buf
    if name == "flashinfer":  # kv_cache[:, 0] and kv_cache[:, 1] of [pages, 2, P, G, d]
        buf = torch.full((cache["k"].shape[0], 2, *cache["k"].shape[1:]), nan, dtype=cache["k"].dtype)
        buf[:, 0], buf[:, 1] = cache["k"], cache["v"]
        return {"k": buf[:, 0], "v": buf[:, 1]}, buf
    if name == "ckv_kpe":  # latent and rope as slices of one [pages, P, 576] buffer, no head axis
        latent, rope = cache["latent"][:, :, 0], cache["rope"][:, :, 0]
        buf = torch.cat([latent, rope], -1)
        return {"latent": buf[..., :latent.shape[-1]], "rope": buf[..., latent.shape[-1]:]}, buf
    raise AssertionError(name)


@pytest.mark.parametrize("text, name", [(MLA_TINY, "flashmla"), (MLA_TINY, "wide"),
                                        (GQA_TINY_SEPARATE, "flashinfer"), (MLA_TINY_SEPARATE, "ckv_kpe")])
def test_cache_views_are_taken_as_they_are(text, name):
    k, case, (want_out, want_lse) = _view_case(text)
    view, buf = _views(name, case.cache)
    views = storage.cache_tensors(view)
    if buf is not None:
        assert all(t.data_ptr() >= buf.data_ptr() for t in views.values()), "views of the buffer, not copies"
        assert not all(t.is_contiguous() for t in views.values())
    out, lse = k(case.q, view, case.block_table, case.seqlens)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    # writes land in the engine's buffer
    gen = torch.Generator().manual_seed(3)
    new = {s.name: torch.randn(2, *(() if s.shared else (k.spec.heads_kv,)), s.dim, generator=gen)
           for s in k.spec.segments}
    slots = torch.tensor([1, 6])
    k.write_cache(case.cache, slots, **new)
    k.write_cache(view, slots, **new)
    got, ref = storage.read(k.spec, view, slots), storage.read(k.spec, case.cache, slots)
    for seg in k.spec.segments:
        assert torch.equal(got[seg.name], ref[seg.name]), seg.name


@pytest.mark.parametrize("bad, words", [
    (lambda c: torch.empty(c.shape[0], c.shape[1], c.shape[2] * 2, dtype=c.dtype)[..., ::2], "innermost dimension contiguous"),
    (lambda c: torch.empty(c.shape[0], c.shape[1], c.shape[2] + 1, dtype=c.dtype)[..., :c.shape[2]], "16-byte aligned rows"),
])
def test_a_view_the_kernels_cannot_read_is_refused_by_name(bad, words):
    k, case, _ = _view_case(MLA_TINY)
    with pytest.raises(ValueError, match=f"^cache: expected .*{words}|^cache: expected {words}"):
        k(case.q, bad(case.cache), case.block_table, case.seqlens)


@pytest.mark.parametrize("bit, argument", [(2, "block_table"), (4, "seqlens"), (8, "indices")])
def test_each_kernel_flag_bit_names_its_argument(bit, argument):
    """The bits the kernels OR into AttnccArgs.flags are abi.h's, read from it."""
    from attncc import abi
    from attncc.devicecheck import DeviceFlags

    assert {abi.FLAG_PAGE: "block_table", abi.FLAG_SEQLEN: "seqlens", abi.FLAG_INDEX: "indices"}[bit] == argument
    flags = DeviceFlags()
    flags.word(torch.device("cpu")).fill_(bit | 16 * bit)  # as a kernel's atomicOr leaves it
    with pytest.raises(ValueError, match=f"^{argument}: "):
        flags.check()
    flags.check()  # cleared


def test_one_kernel_shares_its_flags_with_its_op():
    k = attncc.compile(MLA_TINY)
    assert k._flags is k.op.flags
