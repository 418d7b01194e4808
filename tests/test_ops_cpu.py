"""k.op as a torch.library custom op, on CPU: its name, registration once per checked
spec, opcheck, torch.compile(fullgraph=True) and the fake (meta) implementation."""
from __future__ import annotations

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import attncc
from attncc import reference, testing
from attncc.ops import cache_list

from support import GQA_SMALL, MLA_SMALL, SEPARATE_SMALL, SPARSE_SMALL

SEPARATE_BF16 = """
attention separate_bf16 {
    heads q = 8, kv = 2
    cache paged(4) separate {
        latent: bf16[64]
        rope:   bf16[32] shared
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
}
"""

SPECS = {"mla": MLA_SMALL, "gqa": GQA_SMALL, "sparse": SPARSE_SMALL, "separate": SEPARATE_SMALL,
         "separate_bf16": SEPARATE_BF16}


def op_args(k, lengths=(5, 9, 0), s_q=2, seed=1, scale=None):
    case = testing.random_case(k.spec, list(lengths), s_q, device="cpu", seed=seed)
    scale = float(k.spec.softmax_scale if scale is None else scale)
    return case, (case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                  case.indices, scale, 0)


@pytest.mark.parametrize("which", list(SPECS))
def test_op_name_is_torch_ops_attncc_name_hash(which):
    k = attncc.compile(SPECS[which])
    assert k.plan is not None  # these specs take the kernel path
    op = k.op
    qualname = f"{k.name}_{k.spec.digest[:12]}"
    assert re.fullmatch(rf"{k.name}_[0-9a-f]{{12}}", qualname)
    packet = getattr(torch.ops.attncc, qualname)
    assert packet.default is op._opoverload
    assert str(packet.default).startswith(f"attncc.{qualname}")
    schema = str(packet.default._schema)
    assert schema.startswith(f"attncc::{qualname}(Tensor q, Tensor[] cache, Tensor? block_table, "
                             "Tensor? seqlens, Tensor? indices, float scale, SymInt num_splits)") or \
        schema.startswith(f"attncc::{qualname}(Tensor q, Tensor[] cache, Tensor? block_table, "
                          "Tensor? seqlens, Tensor? indices, float scale, int num_splits)"), schema
    assert schema.endswith("-> (Tensor, Tensor)")


def test_same_spec_twice_is_the_same_op():
    first = attncc.compile(MLA_SMALL)
    second = attncc.compile(MLA_SMALL)
    assert second is not first and second.op is first.op
    # whitespace and comments do not change the checked spec
    reformatted = attncc.compile("# the same spec\n" + MLA_SMALL.replace("    ", "\t") + "\n\n")
    assert reformatted.op is first.op
    case, args = op_args(first)
    out1, lse1 = first.op(*args)
    out2, lse2 = second(case.q, case.cache, case.block_table, case.seqlens)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)


def test_edited_spec_is_another_op():
    before = attncc.compile(MLA_SMALL)
    edited = attncc.compile(MLA_SMALL.replace("paged(4)", "paged(8)"))
    rescaled = attncc.compile(MLA_SMALL.replace("scale 0.125", "scale 0.25"))
    names = {before.op._qualname, edited.op._qualname, rescaled.op._qualname}
    assert len(names) == 3, names
    assert all(n.startswith("attncc::mla_small_") for n in names)
    # both still run, each with its own layout and scale
    for k in (before, edited, rescaled):
        case, args = op_args(k)
        out, lse = k.op(*args)
        ref_out, ref_lse = reference.attention(k.spec, case.q, case.cache, case.block_table,
                                               case.seqlens, case.indices)
        assert torch.equal(out, ref_out.to(out.dtype)) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("which", ["mla", "gqa", "sparse", "separate_bf16"])
def test_opcheck_on_cpu(which):
    k = attncc.compile(SPECS[which])
    _, args = op_args(k)
    result = torch.library.opcheck(k.op, args)
    assert set(result) >= {"test_schema", "test_faketensor", "test_aot_dispatch_dynamic"}
    assert all(v == "SUCCESS" for v in result.values()), result


def test_opcheck_on_cpu_separate_fp8_tensors():
    # torch's SchemaCheckMode (opcheck's test_schema) cannot compare float8 tensors
    # ("mul_cpu_reduced_float" not implemented for 'Float8_e5m2'): every other check runs
    k = attncc.compile(SEPARATE_SMALL)
    _, args = op_args(k)
    assert any(t.dtype == torch.float8_e5m2 for t in args[1])
    result = torch.library.opcheck(k.op, args, test_utils=(
        "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_opcheck_with_scale_and_splits():
    k = attncc.compile(GQA_SMALL)
    _, args = op_args(k, lengths=(1, 7), s_q=1, seed=3, scale=0.3)
    args = args[:-1] + (3,)
    torch.library.opcheck(k.op, args)


@pytest.mark.parametrize("which", ["mla", "sparse", "separate"])
def test_op_on_cpu_is_the_reference(which):
    k = attncc.compile(SPECS[which])
    case, args = op_args(k, seed=7)
    out, lse = k.op(*args)
    ref_out, ref_lse = reference.attention(k.spec, case.q, case.cache, case.block_table,
                                           case.seqlens, case.indices)
    assert out.dtype == case.q.dtype and lse.dtype == torch.float32
    assert torch.equal(out, ref_out.to(out.dtype)) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("which", ["mla", "sparse", "separate"])
def test_torch_compile_fullgraph_matches_eager(which):
    k = attncc.compile(SPECS[which])
    op = k.op  # registered eagerly; see the *_first_use_* tests for the lazy case
    case, args = op_args(k, seed=5)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(q, cache, block_table, seqlens, indices):
        out, lse = op(q, cache, block_table, seqlens, indices, args[5], 0)
        return out, lse

    got_out, got_lse = step(*args[:5])
    out, lse = op(*args)
    assert torch.equal(got_out, out) and torch.equal(got_lse, lse)
    # through the registered name too
    packet = getattr(torch.ops.attncc, f"{k.name}_{k.spec.digest[:12]}")
    again = torch.compile(lambda *a: packet(*a), fullgraph=True)(*args)
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)


def test_torch_compile_fullgraph_through_the_kernel_call():
    k = attncc.compile(MLA_SMALL)
    case, _ = op_args(k, seed=6)
    eager = k(case.q, case.cache, case.block_table, case.seqlens)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(q, cache, block_table, seqlens):
        return k(q, cache, block_table, seqlens)

    got = step(case.q, case.cache, case.block_table, case.seqlens)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


def test_torch_compile_fullgraph_with_the_step_metadata_at_each_s_q():
    """k.plan(seqlens)'s metadata (one for every s_q the spec takes) passed into a compiled step
    (dynamic shapes): each s_q's call takes its own and gives the eager call's results."""
    k = attncc.compile(MLA_SMALL)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, dynamic=True)
    def step(q, cache, block_table, seqlens, metadata):
        return k(q, cache, block_table, seqlens, metadata=metadata)

    for s_q in (1, 2, 1):
        case, _ = op_args(k, s_q=s_q, seed=10 + s_q)
        metadata = k.plan(case.seqlens)
        assert metadata.for_sq(s_q).s_q == s_q
        got = step(case.q, case.cache, case.block_table, case.seqlens, metadata)
        eager = k(case.q, case.cache, case.block_table, case.seqlens)
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1]), s_q


# A fresh Kernel whose first use is inside a compiled function: DESIGN.md §3 says k.op
# "works under torch.compile"; nothing says it must be touched eagerly first.
FRESH = MLA_SMALL.replace("attention mla_small", "attention mla_fresh")


def test_torch_compile_fullgraph_first_use_of_op():
    k = attncc.compile(FRESH.replace("mla_fresh", "mla_fresh_op"))
    case, args = op_args(k, seed=8)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(q, cache, block_table, seqlens, indices):
        return k.op(q, cache, block_table, seqlens, indices, args[5], 0)

    got = step(*args[:5])
    ref = k.op(*args)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_torch_compile_fullgraph_first_use_of_kernel_call():
    k = attncc.compile(FRESH.replace("mla_fresh", "mla_fresh_call"))
    case, _ = op_args(k, seed=9)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(q, cache, block_table, seqlens):
        return k(q, cache, block_table, seqlens)

    got = step(case.q, case.cache, case.block_table, case.seqlens)
    ref = reference.attention(k.spec, case.q, case.cache, case.block_table, case.seqlens)
    assert torch.equal(got[0], ref[0].to(got[0].dtype)) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize("which", list(SPECS))
def test_fake_impl_shapes_and_dtypes(which):
    k = attncc.compile(SPECS[which])
    _, args = op_args(k, lengths=(3, 4, 5), s_q=2)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor)
                else [mode.from_tensor(t) for t in a] if isinstance(a, list) else a
                for a in args]
        out, lse = k.op(*fake)
        assert isinstance(out, FakeTensor) and isinstance(lse, FakeTensor)
    spec = k.spec
    assert tuple(out.shape) == (3, 2, spec.heads_q, spec.d_v)
    assert out.dtype == args[0].dtype
    assert tuple(lse.shape) == (3, spec.heads_q, 2) and lse.dtype == torch.float32


def test_fake_impl_on_meta_tensors_follows_q():
    k = attncc.compile(GQA_SMALL)
    q = torch.empty(5, 1, 8, 64, dtype=torch.float16, device="meta")
    cache = [torch.empty(9, 4, 2 * 2 * 64, dtype=torch.float16, device="meta")]
    table = torch.empty(5, 3, dtype=torch.int32, device="meta")
    seqlens = torch.empty(5, dtype=torch.int32, device="meta")
    out, lse = k.op(q, cache, table, seqlens, None, 0.1, 0)
    assert out.device.type == "meta" and tuple(out.shape) == (5, 1, 8, 64)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert tuple(lse.shape) == (5, 8, 1)


def test_unsupported_spec_has_no_op():
    k = attncc.compile("""
attention narrow {
    heads q = 4, kv = 2
    cache paged(4) {
        k: bf16[8]
        v: bf16[8]
    }
    key   = k
    value = v
}
""")
    with pytest.raises(attncc.SpecError):
        k.op


def test_launch_schedule_comes_from_shapes(monkeypatch):
    """ops._schedule: (num_splits, num_parts) of a launch from the op's num_splits argument
    and shapes only (no lengths: CUDA-graph safe). Compute-bound plans balance parts, one
    per SM's worth of CTAs; the others split each sequence; the argument overrides both."""
    import warnings

    from attncc import ops, split

    class Library:  # the occupancy the built library would report
        def __init__(self, per_sm):
            self.per_sm = per_sm

        def ctas_per_sm(self):
            return self.per_sm

    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mla = attncc.compile("examples/mla.attn").plan
    gqa = attncc.compile(GQA_SMALL).plan
    table = torch.zeros(128, 128, dtype=torch.int32)
    assert ops._schedule(mla, Library(1), 128, 2, table, 0, 0) == (1, 33)
    assert ops._schedule(mla, Library(2), 128, 1, table, 0, 0) == (1, 132)
    assert ops._schedule(mla, Library(1), 128, 2, table, 3, 0) == (3, 0)
    assert ops._schedule(mla, Library(1), 128, 2, table, -5, 0) == (1, 5)
    assert not split.balanced(gqa)
    expected = split.num_splits(gqa, 3, 1, 128 * gqa.page_size, 132)
    assert ops._schedule(gqa, Library(4), 3, 1, table[:3], 0, 0) == (expected, 0)


# --- inside a serving engine (DESIGN.md §3a): preallocated outputs, split counts, shapes --------

@pytest.mark.parametrize("which", ["mla", "sparse", "separate"])
def test_out_and_lse_are_written_in_place(which):
    k = attncc.compile(SPECS[which])
    case, _ = op_args(k)
    want_out, want_lse = k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices)
    b, s_q = case.q.shape[:2]
    out = torch.full((b, s_q, k.spec.heads_q, k.spec.d_v), float("nan"), dtype=case.q.dtype)
    lse = torch.full((b, k.spec.heads_q, s_q), float("nan"))
    got = k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    only = torch.zeros_like(out)
    got = k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, out=only,
            return_lse=False)
    assert got is only and torch.equal(only, want_out)
    alone = k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, return_lse=False)
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, want_out)


@pytest.mark.parametrize("bad, name, kind", [
    (lambda o, l: (o[:, :, :-1], l), "out", ValueError),
    (lambda o, l: (o.float(), l), "out", TypeError),
    (lambda o, l: (o, l.double()), "lse", TypeError),
    (lambda o, l: (o, l[:, :, :1]), "lse", ValueError),
    (lambda o, l: (o.transpose(2, 3).contiguous().transpose(2, 3), l), "out", ValueError),
    (lambda o, l: (o.to("meta"), l), "out", ValueError),
])
def test_out_and_lse_are_checked(bad, name, kind):
    k = attncc.compile(MLA_SMALL)
    case, _ = op_args(k)
    b, s_q = case.q.shape[:2]
    out = torch.empty(b, s_q, k.spec.heads_q, k.spec.d_v, dtype=case.q.dtype)
    lse = torch.empty(b, k.spec.heads_q, s_q)
    out, lse = bad(out, lse)
    with pytest.raises(kind, match=f"^{name}: expected"):
        k(case.q, case.cache, case.block_table, case.seqlens, out=out, lse=lse)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_num_splits_must_be_a_positive_int(bad):
    k = attncc.compile(MLA_SMALL)
    case, _ = op_args(k)
    with pytest.raises(ValueError, match="^num_splits: expected a positive int"):
        k(case.q, case.cache, case.block_table, case.seqlens, num_splits=bad)


def test_num_splits_reaches_the_op(monkeypatch):
    k = attncc.compile(MLA_SMALL)
    case, _ = op_args(k)
    seen = []
    real = k.op

    class Spy:
        def __call__(self, *args):
            seen.append(args[-1])
            return real(*args)

        into = real.into

    monkeypatch.setattr(k, "_op", Spy())
    k(case.q, case.cache, case.block_table, case.seqlens, num_splits=3)
    k(case.q, case.cache, case.block_table, case.seqlens, metadata=attncc.split.DecodeMetadata(2, 9))
    k(case.q, case.cache, case.block_table, case.seqlens, num_splits=4,
      metadata=attncc.split.DecodeMetadata(2, 9))
    assert seen == [3, 2, 4]


def test_opcheck_of_the_in_place_op():
    k = attncc.compile(SEPARATE_BF16)
    case, args = op_args(k)
    b, s_q = case.q.shape[:2]
    out = torch.empty(b, s_q, k.spec.heads_q, k.spec.d_v, dtype=case.q.dtype)
    lse = torch.empty(b, k.spec.heads_q, s_q)
    torch.library.opcheck(k.op.into, (*args, out, lse))


def test_torch_compile_fullgraph_with_dynamic_batch_and_lengths():
    """Two batch sizes and new lengths under fullgraph with the batch marked dynamic: one
    compile, the reference's results (validate.py used to format a symbolic size)."""
    import torch._dynamo

    k = attncc.compile(MLA_SMALL)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(q, cache, block_table, seqlens, out):
        o, lse = k(q, cache, block_table, seqlens, out=out)
        return o * 2, lse

    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch, seed in ((3, 1), (5, 2), (2, 3)):
            case = testing.random_case(k.spec, [7 * (i + seed) % 13 for i in range(batch)], 2,
                                       device="cpu", seed=seed)
            for t in (case.q, case.block_table, case.seqlens, case.cache):  # cache: its pages
                torch._dynamo.mark_dynamic(t, 0)
            torch._dynamo.mark_dynamic(case.block_table, 1)  # pages per sequence
            out = torch.empty(batch, 2, k.spec.heads_q, k.spec.d_v, dtype=case.q.dtype)
            torch._dynamo.mark_dynamic(out, 0)
            doubled, lse = step(case.q, case.cache, case.block_table, case.seqlens, out)
            ref_out, ref_lse = reference.attention(k.spec, case.q, case.cache, case.block_table, case.seqlens)
            assert torch.equal(doubled, ref_out.to(case.q.dtype) * 2) and torch.equal(out, ref_out.to(case.q.dtype))
            assert torch.equal(lse, ref_lse.float())


def test_cache_views_reach_the_launch_as_byte_strides():
    """What cuda_forward puts into AttnccArgs for the views of DESIGN.md §3a (the canonical
    [pages, P(, heads), dim] view; head strides only where heads are a tensor dimension)."""
    from attncc.ops import _cache_view, _strides

    k = attncc.compile(SEPARATE_SMALL)
    plan, spec = k.plan, k.spec
    cache = k.new_cache(6, device="cpu")
    assert [(t.name, t.head_axis) for t in plan.layout.tensors] == [
        ("latent", True), ("latent_scale", True), ("rope", False)]
    # FlashInfer's halves: latent a [:, 0] view of [pages, 2, P, heads, 64]
    both = torch.zeros(6, 2, 4, 2, 64, dtype=cache["latent"].dtype)
    latent = _cache_view(spec, plan, 0, both[:, 1])
    assert _strides(latent, True) == (2 * 4 * 2 * 64, 2 * 64, 64)  # e5m2: one byte an element
    rope = _cache_view(spec, plan, 2, cache["rope"])
    assert _strides(rope, False) == (4 * 32 * 2, 32 * 2, 0)
    k = attncc.compile(MLA_SMALL)
    wide = torch.zeros(5, 4, 96 + 8, dtype=torch.bfloat16)  # a [:, :, :96] slice of wider rows
    view = _cache_view(k.spec, k.plan, 0, wide[..., :96])
    assert _strides(view, k.plan.layout.tensors[0].head_axis) == (4 * 104 * 2, 104 * 2, 0)
    flashmla = _cache_view(k.spec, k.plan, 0, torch.zeros(5, 4, 1, 96, dtype=torch.bfloat16))
    assert flashmla.shape == (5, 4, 96)
    with pytest.raises(ValueError, match=r"^cache tensor 0 \(`cache`\): expected the innermost dimension"):
        _cache_view(k.spec, k.plan, 0, torch.zeros(5, 4, 192, dtype=torch.bfloat16)[..., ::2])
    with pytest.raises(ValueError, match=r"^cache tensor 0 \(`cache`\): expected 16-byte aligned rows"):
        _cache_view(k.spec, k.plan, 0, torch.zeros(5, 4, 100, dtype=torch.bfloat16)[..., :96])


def test_only_plain_cuda_tensors_outside_compilation_skip_the_op_dispatch():
    from attncc.kernel import _direct_launch

    assert not _direct_launch(torch.zeros(1))
    assert not _direct_launch(torch.zeros(1, device="meta"))
    with FakeTensorMode():
        assert not _direct_launch(torch.zeros(1))


# --- write_cache's kernel arguments (the kernel runs on the device: tests/test_gpu_write.py) ---

def test_pack_write_points_at_the_callers_tensors_with_their_strides():
    from attncc import abi
    from attncc.ops import pack_write

    from support import compile_quiet

    k = compile_quiet(SEPARATE_SMALL)
    cache = k.new_cache(3, device="cpu")
    n = 5
    latent = torch.randn(n, 4, k.spec.heads_kv, 64, dtype=torch.bfloat16)[:, 1]  # token stride 4*2*64
    rope = torch.randn(n, 32, 2)[..., 0]  # not contiguous in its last dim: copied
    slots = torch.tensor([3, -1, 0, 7, 11], dtype=torch.int16)  # another integer dtype: made int64
    flags = torch.zeros(1, dtype=torch.int32)
    args, keep = pack_write(k.spec, k.plan, cache, slots, {"latent": latent, "rope": rope}, flags)
    names = [t.name for t in k.plan.layout.tensors]
    for i, name in enumerate(names):
        t = cache[name]
        assert args.tensors[i] == t.data_ptr(), name
        assert args.page_stride[i] == t.stride(0) * t.element_size()
        assert args.token_stride[i] == t.stride(1) * t.element_size()
        assert args.head_stride[i] == (t.stride(2) * t.element_size() if k.plan.layout.tensors[i].head_axis else 0)
    assert args.num_pages == 3 and args.n == n and args.slots_are_64bit == 1
    assert keep[0].dtype == torch.int64 and args.slots == keep[0].data_ptr()
    assert torch.equal(keep[0], slots.long())
    assert args.values[0] == latent.data_ptr() and args.value_dtype[0] == abi.VALUE_DTYPES["bfloat16"]
    assert (args.value_token_stride[0], args.value_head_stride[0]) == (latent.stride(0), latent.stride(1))
    copied = keep[2]
    assert args.values[1] == copied.data_ptr() != rope.data_ptr() and torch.equal(copied, rope)
    assert args.value_dtype[1] == abi.VALUE_DTYPES["float32"]
    assert (args.value_token_stride[1], args.value_head_stride[1]) == (32, 0)  # shared: no head stride
    assert args.flags == flags.data_ptr()


def test_the_stores_place_every_segment_whole():
    from support import compile_quiet

    packed = compile_quiet(SPARSE_SMALL).plan.layout.stores
    assert [(s.segment, s.tensor, s.offset_bytes, s.head_stride_bytes, s.copies, s.dim, s.dtype, s.scale_group,
             s.scale_tensor, s.scale_offset_bytes, s.max_finite) for s in packed] == [
        ("latent", 0, 0, 64 + 16, 1, 64, "e4m3", 16, 0, 64, 448.0),  # 64 e4m3 then 4 fp32 scales
        ("rope", 0, 80, 64, 1, 32, "bf16", 0, -1, 0, 0.0)]
    separate = compile_quiet(SEPARATE_SMALL).plan
    names = [t.name for t in separate.layout.tensors]
    latent, rope = separate.layout.stores
    assert names[latent.tensor] == "latent" and names[latent.scale_tensor] == "latent_scale"
    assert latent.max_finite == 57344.0  # e5m2
    assert (latent.copies, latent.offset_bytes, latent.scale_offset_bytes) == (2, 0, 0)
    assert names[rope.tensor] == "rope" and rope.copies == 1 and rope.scale_tensor == -1


def test_writes_that_the_kernel_takes_and_those_torch_ops_write():
    from attncc.ops import writes_on_device
    from support import compile_quiet

    spec = compile_quiet(SPARSE_SMALL).spec
    some = {"latent": torch.zeros(1, 64), "rope": torch.zeros(1, 32, dtype=torch.bfloat16)}
    assert writes_on_device(spec, some)
    assert writes_on_device(spec, {**some, "latent": torch.zeros(1, 64, dtype=torch.float16)})
    # float64 is rounded once by the contract's torch ops: not converted to fp32 first
    assert not writes_on_device(spec, {**some, "latent": torch.zeros(1, 64, dtype=torch.float64)})
    many = "attention many {\n heads q = 4, kv = 1\n cache paged(4) {\n" + "".join(
        f"  s{i}: bf16[16]\n" for i in range(9)) + " }\n key = " + " ++ ".join(f"s{i}" for i in range(9)) + \
        "\n value = s0\n}\n"
    spec = compile_quiet(many).spec
    assert not writes_on_device(spec, {f"s{i}": torch.zeros(1, 16) for i in range(9)})
