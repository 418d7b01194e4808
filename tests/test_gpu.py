"""Generated ops against the reference on a real GPU (pytest -m gpu, on the device).

Every example and the extra grid of tests/specs.py, batch {1, 3, 33}, lengths including
0, 1, P, P+1 and long ones (split-KV), every s_q up to the spec's maximum; caches are
NaN wherever no token was written, outputs poisoned before each run."""
import dataclasses
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import attncc
from attncc import split, storage, testing
from attncc.families import hopper
from attncc.ops import cache_list, op_for

from specs import all_specs, without_crossover
from support import CHOICES, form_of, no_host_sync, seesaw_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SPECS = all_specs()
# (spec, family) pairs besides each spec's preferred family: name -> family
ALSO = {name: fam for name, text in SPECS.items() for fam in testing.families_of(text)[1:]}
NAMES = list(SPECS) + [f"{name}@{fam}" for name, fam in ALSO.items()]


def with_families(names):
    """The named specs, each also on its other families."""
    return names + [f"{n}@{ALSO[n]}" for n in names if n in ALSO]


@pytest.fixture(scope="session")
def kernels():
    """Every spec compiled and its library built (in parallel: nvcc is a subprocess)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a tolerated knob's "not yet applied"
        compiled = {name: attncc.compile(text) for name, text in SPECS.items()}
        # every other family that takes a spec runs it too, as name@family
        compiled.update({f"{name}@{fam}": testing.on_family(SPECS[name], fam)
                         for name, fam in ALSO.items()})
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda k: k.build(), compiled.values()))
    return compiled


def _lengths(k, batch, rng):
    """batch lengths, the special ones first: 0, 1, a page and one past it, a few pages, a long
    one (split-KV), then the kernel's KV tile - 1, + 0, + 1; the rest random."""
    P, T = k.spec.page_size, k.plan.config.tile_n
    special = [0, 1, P, P + 1, rng.randrange(2, 4 * P + 2), rng.randrange(700, 2600), T - 1, T, T + 1]
    return [special[i] if i < len(special) else rng.randrange(0, 3 * P + 50) for i in range(batch)]


def _poison(spec, batch, s_q):
    testing.poison_allocator(((batch, s_q, spec.heads_q, spec.d_v), torch.bfloat16),
                             ((batch, spec.heads_q, s_q), torch.float32))


def _run(k, case, scale=None, metadata=None, **kwargs):
    return k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices,
             scale=scale, metadata=metadata, **kwargs)


@pytest.mark.parametrize("batch", [1, 3, 33])
@pytest.mark.parametrize("name", NAMES)
def test_matches_reference(kernels, name, batch):
    k = kernels[name]
    rng = random.Random(f"{name}-{batch}")
    for s_q in range(1, k.spec.max_query_len + 1):
        lengths = _lengths(k, batch, rng)
        case = testing.random_case(k.spec, lengths, s_q, seed=rng.randrange(1 << 30))
        _poison(k.spec, batch, s_q)
        out, lse = _run(k, case)
        result = testing.compare(k.spec, case, out, lse)
        assert result.ok, f"{name} batch={batch} s_q={s_q} lengths={lengths}: {result}"


@pytest.mark.parametrize("name", with_families(["mla", "gqa8", "gla2", "mla_fp8_sparse", "gqa8_separate", "mla_page1_h128", "mla_page5_h64",
                                        "mla_fp8_page1_h64", "mla_fp8_per128_h64", "gla_fp8_e5m2", "sparse_fp8_h64",
                                        "mla_fp8_crossover", "sparse_fp8_h128"]))
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_forced_split_counts(kernels, name, splits):
    k = kernels[name]
    s_q = k.spec.max_query_len
    case = testing.random_case(k.spec, [1500, 0, 77, 1], s_q, seed=splits)
    out, lse = k.op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                    case.indices, k.spec.softmax_scale, splits)
    result = testing.compare(k.spec, case, out, lse)
    assert result.ok, f"{name} splits={splits}: {result}"


@pytest.mark.parametrize("name", with_families(["gqa8", "mla"]))
@pytest.mark.parametrize("batch", [2, 64])
def test_the_combine_by_rows_and_by_slabs(kernels, name, batch):
    """combine.cuh merges a row a warp where rows are many (split mode: >= 2048 rows; part mode:
    16-row blocks enough to fill the GPU) and a 128-column slab a warp where they are few: both
    ways in split mode (3 splits) and part mode (40 parts, so a sequence crosses many parts). In
    part mode, where a slab a warp's blocks would not fit in one wave (the decode CTAs x the
    combine's blocks an SM, CombineShape::part_tasks), a pair of slabs a warp (its own kernel),
    else a row: at batch 2 MLA's 256 rows a sequence (s_q 2) go a slab a warp on 40 parts, a pair
    on 16, a row (8 a block) on 8 and a row (16 a block) on 2."""
    k = kernels[name]
    s_q = k.spec.max_query_len
    for mode in (3, -40) + ((-16, -8, -2) if batch == 2 else ()):
        lengths = [(97 * i) % (40 * k.spec.page_size) + 1 for i in range(batch)]
        case = testing.random_case(k.spec, lengths, s_q, seed=batch + mode)
        _poison(k.spec, batch, s_q)
        out, lse = k.op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                        case.indices, k.spec.softmax_scale, mode)
        result = testing.compare(k.spec, case, out, lse)
        assert result.ok, f"{name} batch={batch} splits/parts={mode}: {result}"
    rows = batch * s_q * k.spec.heads_q
    assert (rows >= 2048) == (batch == 64), "both of the combine's ways in split mode"


def _check_on_parts(k, lengths, parts, seed):
    """Every s_q on `parts` forced balanced parts, outputs poisoned, against the reference."""
    for s_q in range(1, k.spec.max_query_len + 1):
        case = testing.random_case(k.spec, lengths, s_q, seed=seed + 10 * s_q)
        _poison(k.spec, len(lengths), s_q)
        out, lse = k.op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                        case.indices, k.spec.softmax_scale, -parts)
        result = testing.compare(k.spec, case, out, lse)
        assert result.ok, f"{k.name} parts={parts} batch={len(lengths)} s_q={s_q}: {result}"


@pytest.mark.parametrize("name", with_families(["mla", "gqa8", "gla2", "mla_fp8_sparse", "gqa8_separate", "mla_page1_h128", "mla_page5_h64",
                                        "mla_fp8_page1_h64", "mla_fp8_per128_h64", "gla_fp8_e5m2", "sparse_fp8_h64",
                                        "mla_fp8_crossover", "sparse_fp8_h128"]))
@pytest.mark.parametrize("parts", [1, 2, 5, 64])
def test_forced_part_counts(kernels, name, parts):
    """Balanced parts (schedule.cuh) on a ragged batch with empty sequences: sequences
    inside one part, crossing several, more parts than tiles (64), every s_q."""
    k = kernels[name]
    _check_on_parts(k, [0, 1500, 0, 77, 1, 0, 3 * k.spec.page_size + 1, 0], parts, seed=parts)


@pytest.mark.parametrize("name", with_families(["mla_fp8_sparse", "sparse_bf16_h128", "sparse_fp8_h64"]))
def test_ready_words_of_an_earlier_call_are_never_taken(kernels, name):
    """Part mode with ready words (core/ready.cuh: sparse plans, sequences >= parts): calls one
    after another on the same shapes get the same workspace back from the caching allocator,
    its words set by the call before; each call's combine must still wait for its own decode
    kernel's partials (each decode CTA clears its words before it lets the combine launch).
    Six calls on fresh inputs, 16 queries on 5 parts, each against the reference, the workspace
    poisoned before each (NaN: its words read as set, its partials as NaN) and the outputs too."""
    k = kernels[name]
    s_q = k.spec.max_query_len
    lengths = [1, 0, 2000, 77, 3 * k.spec.page_size + 1, 500, 0, 1200]
    assert k.plan.config.ready_words and len(lengths) * s_q >= 5, "sequences (queries) >= parts: the words are on"
    for i in range(6):
        case = testing.random_case(k.spec, lengths, s_q, seed=7000 + i)
        _poison(k.spec, len(lengths), s_q)
        testing.poison_allocator(*((shape, torch.float32) for shape in split.workspace_shapes(k.plan, len(lengths), s_q, 1, 5)))
        out, lse = k.op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                        case.indices, k.spec.softmax_scale, -5)
        result = testing.compare(k.spec, case, out, lse)
        assert result.ok, f"{name} call {i}: {result}"


@pytest.mark.parametrize("name", with_families(["mla", "gqa8", "gla2", "mla_fp8_sparse", "gqa8_separate", "mla_page1_h128", "mla_page5_h64",
                                        "mla_fp8_page1_h64", "mla_fp8_per128_h64", "gla_fp8_e5m2", "sparse_fp8_h64",
                                        "mla_fp8_crossover", "sparse_fp8_h128"]))
@pytest.mark.parametrize("batch", [16, 31, 32])
def test_uniform_batch_on_33_parts(kernels, name, batch):
    """Equal sequences on the H200's 33 parts (MLA h_q 128): a cut inside most sequences,
    at a different place in each; 16 sequences: every sequence crosses two or three parts;
    32: parts of whole sequences (schedule.cuh; 31 are too few: 33/31 > 17/16)."""
    k = kernels[name]
    _check_on_parts(k, [5 * k.spec.page_size + 3] * batch, 33, seed=batch)


@pytest.mark.parametrize("name", with_families(["mla", "gqa8", "gla2", "mla_fp8_sparse", "gqa8_separate", "mla_page1_h128", "mla_page5_h64",
                                        "mla_fp8_page1_h64", "mla_fp8_per128_h64", "gla_fp8_e5m2", "sparse_fp8_h64",
                                        "mla_fp8_crossover", "sparse_fp8_h128"]))
def test_whole_sequence_parts(kernels, name):
    """Parts of whole sequences (schedule.cuh) and cut parts, one call after another on the same
    33 parts (the same workspace back from the caching allocator, poisoned before the first: NaN
    partials; each cut call finds the word of the whole call before it), each against the reference
    with its outputs poisoned: a combine that took a cut call for whole would leave its crossing
    sequences unmerged, one that merged a sequence the decode kernel wrote whole would read NaN.
    Whole: 64 equal sequences (one or two a part) among 7 empty ones at the seams of the kernels'
    32-sequence scans (0, 31, 32, 33, 63, 64, 70: an empty run just before a sequence that holds
    a cut); sparse: 64 queries. Cut: 24 ragged sequences (sparse: 24 s_q queries). A plan whose
    lowering keeps whole parts off (whole_parts) runs them all cut; CHOICES runs one of those on."""
    k = kernels[name]
    P = k.spec.page_size
    empty = {0, 31, 32, 33, 63, 64, 70}
    for s_q in range(1, k.spec.max_query_len + 1):
        whole = [5 * P + 3] * (64 // s_q) if k.spec.sparse else [0 if i in empty else 5 * P + 3 for i in range(71)]
        cut = [(97 * i) % (9 * P) + 1 for i in range(24)]
        testing.poison_allocator(*((shape, torch.float32) for shape in split.workspace_shapes(k.plan, 1, s_q, 1, 33)))
        for call, lengths in enumerate([whole, cut, whole, cut]):
            case = testing.random_case(k.spec, lengths, s_q, seed=100 * s_q + call)
            _poison(k.spec, len(lengths), s_q)
            out, lse = k.op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                            case.indices, k.spec.softmax_scale, -33)
            result = testing.compare(k.spec, case, out, lse)
            assert result.ok, f"{name} s_q={s_q} call {call} ({'whole' if call % 2 == 0 else 'cut'}): {result}"


@pytest.mark.parametrize("name", with_families(["mla", "gla2", "gqa8", "mla_fp8_sparse", "sparse_bf16_h128"]))
def test_sharp_softmax(kernels, name):
    """A large scale: row maxima keep jumping by more than the lazy-rescale slack (2^8), so O
    is rescaled often, not only in the first tiles."""
    k = kernels[name]
    s_q = k.spec.max_query_len
    case = testing.random_case(k.spec, [2000, 333, 64, 1], s_q, seed=21)
    _poison(k.spec, 4, s_q)
    out, lse = _run(k, case, scale=1.0)
    result = testing.compare(k.spec, case, out, lse, scale=1.0)
    assert result.ok, f"{name}: {result}"


def test_scale_override_and_metadata(kernels):
    k = kernels["mla"]
    case = testing.random_case(k.spec, [300, 1200, 5], 2, seed=3)
    metadata = k.plan(case.seqlens)
    out, lse = _run(k, case, scale=0.3, metadata=metadata)
    result = testing.compare(k.spec, case, out, lse, scale=0.3)
    assert result.ok, str(result)


@pytest.mark.parametrize("name", with_families(["mla", "gqa8", "gla2", "mla_fp8_sparse", "mla_page1", "mla_page1_h128",
                                                 "mla_fp8_crossover"]))
def test_deterministic(kernels, name):
    """Two calls give the same bits, at every s_q (a plan's rows can fall into different
    schedules by s_q: the stacked schedule's split mode at s_q 1)."""
    k = kernels[name]
    for s_q in range(1, k.spec.max_query_len + 1):
        case = testing.random_case(k.spec, [2000, 333, 64], s_q, seed=11)
        first = _run(k, case)
        second = _run(k, case)
        assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1]), f"s_q {s_q}"


def _split_mode_s_q(spec, tile_m=hopper.STACKED_TILE_M, group_rows=hopper.TILE_M):
    """The first s_q at which some row block of a kv head holds 64 rows or fewer (the stacked
    schedule's split mode: its groups take alternate tiles), or None."""
    group = spec.heads_q // spec.heads_kv
    return next((s for s in range(1, spec.max_query_len + 1) if 0 < (group * s) % tile_m <= group_rows), None)


STACKED_ODD = ["gla2", "gla2_page5", "gla_g96", "gla_fp8_e5m2", "gla_fp8_per128"]  # stacked plans of 3 stages


@pytest.mark.parametrize("splits", [4, None])
@pytest.mark.parametrize("name", STACKED_ODD)
def test_the_stacked_split_mode_is_deterministic_over_long_sequences(kernels, name, splits):
    """The stacked schedule's split mode on sequences of 100+ tiles a CTA: with an odd number of
    stages a stage's consecutive tiles belong to different groups, and a group that took the
    other's phase for its own read a stage still landing (session 35: GLA-2 s_q 1 differed call
    to call, up to 0.04, and failed launches at b = 128)."""
    k = kernels[name]
    assert k.plan.config.stages % 2 == 1 and not k.plan.config.seesaw, "the case this test is for"
    s_q = _split_mode_s_q(k.spec)
    assert s_q is not None
    rng = random.Random(5)
    case = testing.random_case(k.spec, [rng.randrange(6000, 8193) for _ in range(16)], s_q, seed=5)
    runs = []
    for _ in range(3):
        _poison(k.spec, 16, s_q)
        runs.append(_run(k, case, num_splits=splits))
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])
    result = testing.compare(k.spec, case, *runs[0])
    assert result.ok, str(result)


@pytest.mark.parametrize("name", with_families(["mla", "gla2", "mla_fp8_sparse", "mla_page1_h128", "gla_fp8_e5m2",
                                                 "mla_fp8_crossover"]))
def test_cuda_graph_replay_with_new_inputs(kernels, name):
    k = kernels[name]
    s_q = k.spec.max_query_len
    static = testing.random_case(k.spec, [900, 64, 17], s_q, seed=1)
    _run(k, static)  # warm up: build, load, set the shared-memory attribute
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = _run(k, static)
    fresh = testing.random_case(k.spec, [900, 64, 17], s_q, seed=2)
    static.q.copy_(fresh.q)
    for mine, theirs in zip(cache_list(k.spec, static.cache), cache_list(k.spec, fresh.cache)):
        mine.copy_(theirs)
    for name_ in ("block_table", "seqlens", "indices"):
        if getattr(static, name_) is not None:
            getattr(static, name_).copy_(getattr(fresh, name_))
    graph.replay()
    torch.cuda.synchronize()
    result = testing.compare(k.spec, fresh, out, lse)
    assert result.ok, str(result)


def test_torch_compile_fullgraph(kernels):
    k = kernels["gla2"]
    case = testing.random_case(k.spec, [400, 3, 129], 2, seed=5)

    @torch.compile(fullgraph=True)
    def step(q, cache, block_table, seqlens):
        out, lse = k(q, cache, block_table, seqlens)
        return out * 2, lse

    out, lse = step(case.q, case.cache, case.block_table, case.seqlens)
    eager = _run(k, case)
    assert torch.equal(out, eager[0] * 2) and torch.equal(lse, eager[1])


def test_opcheck_on_cuda(kernels):
    k = kernels["gqa8"]
    case = testing.random_case(k.spec, [100, 17], 1, seed=9)
    args = (case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens, None,
            k.spec.softmax_scale, 0)
    torch.library.opcheck(k.op, args)


def test_misaligned_q_view_is_refused_and_row_strided_block_table_works(kernels):
    k = kernels["gqa8"]
    case = testing.random_case(k.spec, [100, 17], 1, seed=4)
    flat = torch.empty(case.q.numel() + 1, dtype=case.q.dtype, device="cuda")
    shifted = flat[1:].view(case.q.shape)  # contiguous, but 2 bytes past a 16-byte boundary
    shifted.copy_(case.q)
    with pytest.raises(ValueError, match="q: expected a 16-byte aligned"):
        k(shifted, case.cache, case.block_table, case.seqlens)
    wide = torch.zeros(2, case.block_table.shape[1] + 5, dtype=torch.int32, device="cuda")
    wide[:, :case.block_table.shape[1]] = case.block_table
    narrow = wide[:, :case.block_table.shape[1]]  # rows strided by the wider table
    out, lse = k(case.q, case.cache, narrow, case.seqlens)
    assert testing.compare(k.spec, case, out, lse).ok


# --- inside a serving engine (DESIGN.md §3a) -------------------------------------------------------

def test_out_and_lse_in_place_on_cuda(kernels):
    k = kernels["mla"]
    case = testing.random_case(k.spec, [900, 64, 17], 2, seed=31)
    want_out, want_lse = _run(k, case)
    out = torch.full_like(want_out, float("nan"))
    lse = torch.full_like(want_lse, float("nan"))
    got = k(case.q, case.cache, case.block_table, case.seqlens, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    alone = k(case.q, case.cache, case.block_table, case.seqlens, out=torch.empty_like(out), return_lse=False)
    assert torch.equal(alone, want_out)
    split = k(case.q, case.cache, case.block_table, case.seqlens, num_splits=3)
    assert testing.compare(k.spec, case, *split).ok


@pytest.mark.parametrize("name", with_families(["mla", "mla_fp8_sparse", "gqa8_separate"]))
def test_write_cache_on_cuda_skips_minus_one_without_a_sync(kernels, name):
    k = kernels[name]
    spec = k.spec
    cache = k.new_cache(4)
    testing.fill_nan(cache)
    gen = torch.Generator(device="cuda").manual_seed(5)
    n = 9
    values = {s.name: torch.randn(n, *(() if s.shared else (spec.heads_kv,)), s.dim, device="cuda", generator=gen)
              for s in spec.segments}
    slots = torch.tensor([3, -1, 0, 17, -1, 40, 5, -1, 2], device="cuda")
    with no_host_sync():
        k.write_cache(cache, slots, **values)
    k.check()  # -1 is padding, not an error
    keep = (slots >= 0).cpu()
    got = storage.read(spec, cache, slots[slots >= 0])
    cpu_cache = {n_: t.cpu() for n_, t in storage.cache_tensors(k.new_cache(4)).items()}
    cpu_cache = cpu_cache if spec.separate else cpu_cache[storage.PACKED_NAME]
    storage.write(spec, cpu_cache, slots.cpu()[keep],
                  {n_: (v if not spec.segment(n_).shared else v[:, None]).cpu()[keep] for n_, v in values.items()})
    want = storage.read(spec, cpu_cache, slots.cpu()[keep])
    for seg in spec.segments:
        assert torch.equal(got[seg.name].cpu(), want[seg.name]), seg.name
    bad = torch.tensor([1, 10_000], device="cuda")
    k.write_cache(cache, bad, **{n_: v[:2] for n_, v in values.items()})  # no error here: on the device
    with pytest.raises(ValueError, match="^slots: write_cache got a slot outside"):
        k.check()


def test_write_cache_and_attention_in_one_cuda_graph(kernels):
    k = kernels["mla"]
    spec = k.spec
    case = testing.random_case(spec, [300, 77], 1, seed=41)
    new = {s.name: torch.randn(2, spec.heads_kv, s.dim, device="cuda") for s in spec.segments}
    slots = torch.tensor([-1, -1], device="cuda")
    k.write_cache(case.cache, slots, **new)
    _run(k, case)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k.write_cache(case.cache, slots, **new)
        out, lse = _run(k, case)
    # the step's new tokens: the last position of each sequence
    last = case.seqlens.long() - 1
    page = case.block_table.gather(1, (last // spec.page_size)[:, None]).squeeze(1).long()
    slots.copy_(page * spec.page_size + last % spec.page_size)
    for t in new.values():
        t.normal_()
    graph.replay()
    torch.cuda.synchronize()
    assert testing.compare(spec, case, out, lse).ok, "the replayed write is what the attention read"


def _case_with(case, **changes):
    fields = dict(q=case.q, cache=case.cache, block_table=case.block_table, seqlens=case.seqlens,
                  indices=case.indices)
    fields.update(changes)
    return testing.Case(**fields)


def test_cache_views_on_cuda_give_the_reference(kernels):
    """The views of DESIGN.md §3a, read in place by the kernels (strides in AttnccArgs)."""
    k = kernels["mla"]
    case = testing.random_case(k.spec, [100, 7, 300], 1, seed=43)
    wide = torch.full((*case.cache.shape[:2], case.cache.shape[2] + 64), float("nan"),
                      dtype=case.cache.dtype, device="cuda")
    wide[..., :case.cache.shape[2]] = case.cache
    pages, page = case.cache.shape[:2]
    tall = torch.full((pages, page + 3, case.cache.shape[2]), float("nan"), dtype=case.cache.dtype, device="cuda")
    tall[:, :page] = case.cache
    # a slice of wider rows, FlashMLA's 4-D, a page-strided slice (tokens contiguous, pages not:
    # the kernels for contiguous caches must not be chosen), and the contiguous cache itself
    for view in (wide[..., :case.cache.shape[2]], case.cache.unsqueeze(2), tall[:, :page], case.cache):
        out, lse = k(case.q, view, case.block_table, case.seqlens)
        assert testing.compare(k.spec, case, out, lse).ok
        out, lse = k.op(case.q, cache_list(k.spec, view), case.block_table, case.seqlens, case.indices,
                        k.spec.softmax_scale, -5)  # the part-mode kernels, 5 balanced parts
        assert testing.compare(k.spec, case, out, lse).ok
    # FlashInfer's kv_cache[:, 0] and [:, 1] halves of one [pages, 2, P, G, d] buffer
    k = kernels["gqa8_separate"]
    case = testing.random_case(k.spec, [100, 7, 300], 1, seed=44)
    names = list(case.cache)
    both = torch.stack([case.cache[n] for n in names], dim=1)
    view = {n: both[:, i] for i, n in enumerate(names)}
    assert not any(v.is_contiguous() for v in view.values())
    out, lse = k(case.q, view, case.block_table, case.seqlens)
    assert testing.compare(k.spec, case, out, lse).ok


def test_a_cache_view_the_kernels_cannot_read_is_refused_by_name(kernels):
    k = kernels["mla"]
    case = testing.random_case(k.spec, [100], 1, seed=45)
    odd = torch.zeros(*case.cache.shape[:2], case.cache.shape[2] + 4, dtype=case.cache.dtype, device="cuda")
    with pytest.raises(ValueError, match="cache.*aligned rows"):
        k(case.q, odd[..., :case.cache.shape[2]], case.block_table, case.seqlens)


@pytest.mark.parametrize("name", with_families(["mla", "gqa8", "gla2", "mla_fp8_sparse", "gqa8_separate", "mla_page1"]))
def test_the_compiled_launcher_runs_eager_calls_as_the_python_path_does(kernels, name):
    """Eager CUDA calls go through the compiled launcher (csrc/launcher.cpp); it must be there on
    the device, and give, bitwise, what the Python path (ops.cuda_forward) gives for the same
    call: the schedule chosen, split and part requests, metadata, out=, a FlashMLA-shaped view."""
    k = kernels[name]
    fast = k.op.fast()
    assert fast is not None, "no compiled launcher on the device"
    for seed, lengths in enumerate(([1000, 0, 37], [5], [300] * 9)):
        case = testing.random_case(k.spec, lengths, k.spec.max_query_len, seed=70 + seed)
        metadata = k.plan(case.seqlens if case.seqlens is not None else lengths, s_q=k.spec.max_query_len)
        for splits, kwargs in ((0, {}), (3, {"num_splits": 3}), (-4, None), (metadata.num_splits, {"metadata": metadata})):
            python = k.op.launch(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens,
                                 case.indices, k.spec.softmax_scale, splits)
            if kwargs is None:  # part mode: only the op's num_splits reaches it (-p)
                got = fast(case.q, case.cache, case.block_table, case.seqlens, case.indices, k.spec.softmax_scale,
                           splits, None, None)
            else:
                got = _run(k, case, **kwargs)
            assert torch.equal(got[0], python[0]) and torch.equal(got[1], python[1]), (lengths, splits)
        out, lse = torch.full_like(python[0], float("nan")), torch.full_like(python[1], float("nan"))
        assert k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, out=out, lse=lse)[0] is out
        want = _run(k, case)
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
        assert testing.compare(k.spec, case, out, lse).ok
        if not k.spec.separate:
            flashmla = k(case.q, case.cache.unsqueeze(2), case.block_table, case.seqlens, indices=case.indices)
            assert torch.equal(flashmla[0], want[0])
    assert fast.signatures() >= 3


def test_an_eager_call_does_not_sync(kernels):
    k = kernels["mla"]
    case = testing.random_case(k.spec, [100, 7, 300], 2, seed=46)
    _run(k, case)  # built and warmed up
    with no_host_sync():
        out, lse = _run(k, case)
    assert testing.compare(k.spec, case, out, lse).ok
    k.check()


@pytest.mark.parametrize("name", with_families(["mla", "gqa8_separate", "mla_page1", "mla_page1_h128"]))
def test_a_bad_page_is_never_read_and_is_flagged(kernels, name):
    """Its tokens count as absent: the result is the reference's with the sequence ending
    where the bad page starts (its last page), and k.check() names block_table."""
    k = kernels[name]
    P = k.spec.page_size
    lengths = [3 * P + 2, 2 * P + 1, P + 1]
    case = testing.random_case(k.spec, lengths, 1, seed=47)
    k.check()
    bad = case.block_table.clone()
    num_pages = storage.num_pages(case.cache)
    for b, length in enumerate(lengths):
        bad[b, (length - 1) // P] = (num_pages + 1000, -7, 1 << 30)[b]
    out, lse = k(case.q, case.cache, bad, case.seqlens)
    torch.cuda.synchronize()
    cut = torch.tensor([(n - 1) // P * P for n in lengths], dtype=torch.int32, device="cuda")
    assert testing.compare(k.spec, _case_with(case, seqlens=cut), out, lse).ok
    with pytest.raises(ValueError, match="^block_table: "):
        k.check()
    k.check()  # cleared


def test_a_length_past_the_block_table_is_clamped_and_flagged(kernels):
    k = kernels["mla"]
    P = k.spec.page_size
    case = testing.random_case(k.spec, [2 * P, P + 3], 1, seed=48)
    table = case.block_table[:, :2].contiguous()  # room for 2 P tokens a sequence
    long = torch.tensor([2 * P + 40, -5], dtype=torch.int32, device="cuda")
    out, lse = k(case.q, case.cache, table, long)
    torch.cuda.synchronize()
    clamped = torch.tensor([2 * P, 0], dtype=torch.int32, device="cuda")
    assert testing.compare(k.spec, _case_with(case, block_table=table, seqlens=clamped), out, lse).ok
    with pytest.raises(ValueError, match="^seqlens: "):
        k.check()


@pytest.mark.parametrize("name", with_families(["mla_fp8_sparse", "sparse_fp8_h64", "sparse_bf16_h128", "sparse_fp8_h128"]))
def test_an_out_of_range_sparse_index_is_never_read_and_is_flagged(kernels, name):
    k = kernels[name]
    case = testing.random_case(k.spec, [1, 1], 1, seed=49, empty_rows=False)
    num_slots = storage.num_pages(case.cache) * k.spec.page_size
    bad = case.indices.clone()
    bad[0, 0, 0], bad[1, 0, 3] = num_slots + 5, -9
    out, lse = k(case.q, case.cache, seqlens=case.seqlens, indices=bad)
    torch.cuda.synchronize()
    holes = bad.clone()
    holes[0, 0, 0], holes[1, 0, 3] = -1, -1
    assert testing.compare(k.spec, _case_with(case, indices=holes), out, lse).ok
    with pytest.raises(ValueError, match="^indices: "):
        k.check()


def _assert_same_bits(k, op_a, op_b, seed, batch=5):
    """Two ops of k's spec give bitwise equal outputs, both right against the reference: every
    s_q, `batch` sequences of special lengths (tokens without a slot; 9: a long one and the KV
    tile +- 1 too), the chosen split count, 3 forced splits and 7 balanced parts."""
    rng = random.Random(seed)
    for s_q in range(1, k.spec.max_query_len + 1):
        lengths = _lengths(k, batch, rng)
        case = testing.random_case(k.spec, lengths, s_q, seed=rng.randrange(1 << 30))
        for splits in (0, 3, -7):  # chosen, 3 splits, 7 balanced parts
            (a_out, a_lse), (b_out, b_lse) = (
                op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens, case.indices,
                   k.spec.softmax_scale, splits) for op in (op_a, op_b))
            assert torch.equal(a_out, b_out) and torch.equal(a_lse, b_lse), (s_q, splits, lengths)
            assert testing.compare(k.spec, case, a_out, a_lse).ok, (s_q, splits, lengths)


@pytest.mark.parametrize("name", ["mla_fp8_sparse", "mla_fp8_crossover"])
def test_crossover_on_and_off_give_the_same_bits(kernels, name):
    """The cluster's CTAs convert half of each tile each and share it; without crossover each
    converts all of it. The staged values are the same (an exact conversion), so the outputs
    are bitwise equal to the seesaw's without crossover, over forced splits and parts, with
    tokens without a slot. (Without crossover the lowering runs the relay: test_relay_...)"""
    k = kernels[name]
    assert k.plan.config.crossover and not k.plan.config.relay
    text = open(SPECS[name]).read() if SPECS[name].endswith(".attn") else SPECS[name]
    off = attncc.compile(without_crossover(text, f"{name}_off"))
    assert off.plan.family == "hopper" and not off.plan.config.crossover and off.plan.config.relay
    _assert_same_bits(k, k.op, op_for(off.spec, seesaw_of(off.plan), "_seesaw"), name)


@pytest.mark.parametrize("name,choice", CHOICES, ids=[f"{n}-{c}" for n, c in CHOICES])
def test_a_config_choice_not_taken_gives_the_same_bits(kernels, name, choice):
    """Each choice moves work, not sums: the outputs are bitwise those of the plan as lowered, with
    a long sequence among the lengths (rows whose max settles, many tiles a piece), tokens
    without a slot, and forced splits and parts."""
    base, _, form = name.partition("~")
    k = kernels[base]
    plan = form_of(k.plan, name)
    fields = [c.partition("=") for c in choice.split(":")]
    field, _, value = fields[0]  # (the choice's first field is the one the lowering decided)
    assert plan.family == "hopper" and str(getattr(plan.config, field)).lower() != value, (name, "the choice is taken")
    as_lowered = op_for(k.spec, plan, "_seesaw") if form else k.op
    other = op_for(k.spec, testing.with_config(plan, choice.split(":")), "_" + "_".join([form, *(f"{f}_{v}" for f, _, v in fields)]))
    assert other.library().path != as_lowered.library().path
    _assert_same_bits(k, as_lowered, other, name, batch=9)


def test_the_value_first_form_runs_where_a_call_has_few_rows(kernels):
    """A plan with a second form (mla_page1_h128: the value-first seesaw for calls of at most 128
    query rows a kv head) launches it at s_q 1 (128 rows) and its own form at s_q 2 (256), both
    right against the reference (the kernels' names, from the profiler, say which ran)."""
    k = kernels["mla_page1_h128"]
    assert k.plan.config.value_first_rows == 128 and not k.plan.config.value_first
    for s_q, second in ((1, True), (2, False)):
        case = testing.random_case(k.spec, [300, 77, 1], s_q, seed=17 + s_q)
        _poison(k.spec, 3, s_q)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out, lse = _run(k, case)
            torch.cuda.synchronize()
        decode = [e.name for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA and "decode" in e.name and "kernel" in e.name]
        assert decode and all(("ValueFirst<" in n) == second for n in decode), (s_q, decode)
        assert testing.compare(k.spec, case, out, lse).ok, s_q


RELAY = ["sparse_fp8_h128", "sparse_fp8_h64", "mla_fp8_page1_h64", "mla_fp8_per128_h64", "mla_fp8_per32_page16"]


@pytest.mark.parametrize("name", RELAY)
def test_the_relay_agrees_with_the_seesaw(kernels, name):
    """The relay (WG0 alone computes S and hands P to WG1) sums the same products in another
    order than the seesaw (one running max, not two handed back and forth): both right against
    the reference and within rounding of each other, every s_q, tokens without a slot, the
    chosen split count, 3 forced splits and 7 balanced parts."""
    k = kernels[name]
    assert k.plan.family == "hopper" and k.plan.config.relay, name
    seesaw = op_for(k.spec, seesaw_of(k.plan), "_seesaw")
    assert seesaw.library().path != k.op.library().path
    rng = random.Random(name)
    for s_q in range(1, k.spec.max_query_len + 1):
        lengths = _lengths(k, 5, rng)
        case = testing.random_case(k.spec, lengths, s_q, seed=rng.randrange(1 << 30))
        for splits in (0, 3, -7):
            (a_out, a_lse), (b_out, b_lse) = (
                op(case.q, cache_list(k.spec, case.cache), case.block_table, case.seqlens, case.indices,
                   k.spec.softmax_scale, splits) for op in (k.op, seesaw))
            for out, lse in ((a_out, a_lse), (b_out, b_lse)):
                assert testing.compare(k.spec, case, out, lse).ok, (s_q, splits, lengths)
            torch.testing.assert_close(a_out.float(), b_out.float(), atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(a_lse, b_lse, atol=1e-3, rtol=1e-4)


PACED = ["sparse_fp8_h128", "sparse_fp8_h64", "mla_fp8_page1_h64", "mla_fp8_crossover"]  # the fp8 plans whose producer sets the pace


@pytest.mark.parametrize("name", PACED)
def test_the_producer_paced_order_gives_the_same_bits(kernels, name):
    """value_first (the seesaw's WG1 products of tile a before S_b; crossover plans) and
    slots_ahead (the next tile's slots loaded a tile ahead) reorder work, not sums: the outputs
    are bitwise those of the plan without them, over forced splits and parts, with tokens
    without a slot."""
    k = kernels[name]
    cfg = k.plan.config
    assert k.plan.family == "hopper" and cfg.slots_ahead and cfg.value_first != cfg.relay, name
    plain = dataclasses.replace(k.plan, config=dataclasses.replace(cfg, value_first=False, slots_ahead=False))
    off = op_for(k.spec, plain, "_unpaced")
    assert off.library().path != k.op.library().path  # its own build, not the cached paced one
    _assert_same_bits(k, k.op, off, name)


@pytest.mark.parametrize("name", ["sparse_fp8_h128", "sparse_fp8_h64", "mla_fp8_per128_h64"])
def test_scale_records_give_the_same_bits(kernels, name):
    """Scale records (a token's 4 scales by one 16-byte copy a tile, read by every box pair's
    conversion) move the same fp32 scales: the outputs are bitwise those of the plan that copies
    a scale a token and pair, over forced splits and parts, with tokens without a slot (their
    records zero-filled)."""
    k = kernels[name]
    cfg = k.plan.config
    assert k.plan.family == "hopper" and cfg.scale_record_bytes == 16, name
    smem = cfg.smem_bytes - cfg.stages * cfg.tile_n * cfg.scale_record_bytes
    plain = dataclasses.replace(k.plan, config=dataclasses.replace(cfg, scale_record_bytes=0, smem_bytes=smem))
    off = op_for(k.spec, plain, "_no_records")
    assert off.library().path != k.op.library().path
    _assert_same_bits(k, k.op, off, name)


def test_attncc_check_raises_before_the_launch(kernels, monkeypatch):
    k = kernels["mla"]
    case = testing.random_case(k.spec, [100], 1, seed=50)
    bad = case.block_table.clone()
    bad[0, 0] = -3
    monkeypatch.setenv("ATTNCC_CHECK", "1")
    with pytest.raises(ValueError, match="^block_table: entry \\[0, 0\\] = -3"):
        k(case.q, case.cache, bad, case.seqlens)
    k.check()  # nothing launched, nothing flagged


def _schedule_lines(metadata):
    """The lines of a step's schedule (core/work.cuh ScheduleLine): (total, begin, end, first_seq, whole) a part."""
    words = metadata.schedule.view(torch.int64).view(-1, 6).cpu()
    return [(int(w[0]), int(w[1]), int(w[2]), int(w[5]) & 0xffffffff, int(w[5]) >> 32) for w in words]


def _host_bounds(k, tiles, parts, s_q):
    """The line's length, the parts' bounds and whether they hold whole sequences, by the host's
    mirror (attncc/split.py; the line: tiles and a piece's cost each)."""
    cost = k.plan.config.piece_cost_tiles
    total = sum(split.line_lengths(tiles, cost))
    possible = len(tiles) * (split.WHOLE_SLACK + 1) >= parts * split.WHOLE_SLACK
    if k.plan.config.whole_parts and possible:
        bounds, whole = split.whole_parts(tiles, parts, split.whole_slack_tiles(k.plan, s_q), cost)
        if whole:
            return total, bounds, True
    return total, [p * total // parts for p in range(parts + 1)], False


@pytest.mark.parametrize("name", with_families(["mla", "gla2", "mla_fp8_sparse", "mla_page1_h128", "gqa8", "mla_page64_h16"]))
def test_step_schedule_made_on_the_device(kernels, name):
    """k.plan(seqlens) with the lengths on the device cuts a part-mode step's parts there (core/plan.cuh),
    without a host sync; each line is the host mirror's (split.py), and a call reading it gives,
    bitwise, what a call whose CTAs cut the same parts themselves gives, and the reference."""
    k = kernels[name]
    rng = random.Random(name)
    for s_q in range(1, k.spec.max_query_len + 1):
        for lengths in (_lengths(k, 9, rng), [rng.randrange(0, 3000) for _ in range(150)], [4100] * 40, [0, 0, 5]):
            case = testing.random_case(k.spec, lengths, s_q, seed=rng.randrange(1 << 30))
            on_device = case.seqlens if case.seqlens is not None else torch.zeros(len(lengths), dtype=torch.int32, device="cuda")
            with no_host_sync():
                metadata = k.plan(on_device, s_q=s_q)
            assert metadata.num_splits < 0 and metadata.schedule is not None, metadata
            parts = -metadata.num_splits
            tile_n, batch = k.plan.config.tile_n, len(lengths)
            if k.spec.sparse:
                tiles = [-(-k.plan.topk // tile_n)] * (batch * s_q)
            else:
                tiles = [-(-n // tile_n) for n in lengths]
            line_total, bounds, whole = _host_bounds(k, tiles, parts, s_q)
            lines = _schedule_lines(metadata)
            assert len(lines) == parts
            for p, (total, begin, end, _, line_whole) in enumerate(lines):
                assert (total, begin, end, line_whole) == (line_total, bounds[p], bounds[p + 1], int(whole)), \
                    f"s_q {s_q} lengths {lengths[:12]} part {p} of {parts}"
            _poison(k.spec, batch, s_q)
            read = _run(k, case, metadata=metadata)
            _poison(k.spec, batch, s_q)
            cut = _run(k, case, metadata=dataclasses.replace(metadata, schedule=None))  # the same parts, cut by the CTAs
            assert torch.equal(read[0], cut[0]) and torch.equal(read[1], cut[1]), f"s_q {s_q} lengths {lengths[:12]}"
            with no_host_sync():
                every = k.plan(on_device)  # no s_q: each s_q's parts and lines, the call's taken
            assert every.for_sq(s_q).num_splits == metadata.num_splits and _schedule_lines(every.for_sq(s_q)) == lines
            _poison(k.spec, batch, s_q)
            taken = _run(k, case, metadata=every)
            assert torch.equal(read[0], taken[0]) and torch.equal(read[1], taken[1]), f"s_q {s_q} lengths {lengths[:12]}"
            result = testing.compare(k.spec, case, *read)
            assert result.ok, f"s_q {s_q} lengths {lengths[:12]}: {result}"
    k.check()  # no schedule was refused, no value flagged


def test_a_schedule_of_other_lengths_is_not_used(kernels):
    """A schedule made for lengths whose tile counts differ from the call's (the lengths changed
    after k.plan) is refused by its key: the CTAs cut their own parts (right results), and
    k.check() says so; lengths moved within their last tile keep the key and the schedule."""
    k = kernels["mla"]
    tile_n = k.plan.config.tile_n
    old = [3 * tile_n + 5, 700, 2 * tile_n, 1] * 10
    same_tiles = [n + 1 if n % tile_n else n for n in old]  # one more token in a tile not yet full
    more_tiles = [n + tile_n for n in old]
    metadata = k.plan(torch.tensor(old, dtype=torch.int32, device="cuda"), s_q=2)
    assert metadata.schedule is not None
    k.check()
    case = testing.random_case(k.spec, same_tiles, 2, seed=61)
    assert testing.compare(k.spec, case, *_run(k, case, metadata=metadata)).ok
    k.check()  # the same tile counts: the schedule was used, nothing flagged
    case = testing.random_case(k.spec, more_tiles, 2, seed=62)
    out, lse = _run(k, case, metadata=metadata)
    assert testing.compare(k.spec, case, out, lse).ok, "a stale schedule gave wrong results"
    with pytest.raises(ValueError, match="^metadata: a schedule made by k.plan"):
        k.check()
    case = testing.random_case(k.spec, old[:7], 2, seed=63)  # another batch: another key
    assert testing.compare(k.spec, case, *_run(k, case, metadata=metadata)).ok
    with pytest.raises(ValueError, match="^metadata: "):
        k.check()
    other = kernels["mla_page1_h128"]  # another plan's schedule: its key differs
    case = testing.random_case(other.spec, old, 2, seed=64)
    assert testing.compare(other.spec, case, *_run(other, case, metadata=metadata, return_lse=True)).ok
    with pytest.raises(ValueError, match="^metadata: "):
        other.check()


@pytest.mark.parametrize("name", ["mla", "gla2"])
def test_step_schedule_in_a_cuda_graph(kernels, name):
    """k.plan(seqlens) and the layers' calls captured together: each replay cuts the parts of that
    step's lengths once, and every call reads them."""
    k = kernels[name]
    static = testing.random_case(k.spec, [4100] * 5, 2, seed=71)  # the cache holds 4100 tokens a sequence
    metadata = k.plan(static.seqlens, s_q=2)
    _run(k, static, metadata=metadata)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        metadata = k.plan(static.seqlens, s_q=2)
        first = _run(k, static, metadata=metadata)
        second = _run(k, static, metadata=metadata)
    for lengths in ([2000, 1, 640, 65, 4097], [0, 3333, 64, 129, 1000], [4100] * 5):
        static.seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        for out, lse in (first, second):
            assert testing.compare(k.spec, _case_with(static, seqlens=static.seqlens.clone()), out, lse).ok, lengths
    k.check()  # each replay's schedule was of its lengths


@pytest.mark.parametrize("name", with_families(["gqa8", "mla_page64_h16"]))
def test_plan_metadata_of_a_split_plan_without_a_sync(kernels, name):
    """k.plan reads no length: balanced parts without max_seqlen, splits with it; both right."""
    k = kernels[name]
    case = testing.random_case(k.spec, [3000, 17, 900], 1, seed=51)
    with no_host_sync():
        plans = [k.plan(case.seqlens), k.plan(case.seqlens, max_seqlen=3000)]
    assert plans[0].num_splits < 0 and plans[1].num_splits >= 1
    for metadata in plans:
        out, lse = _run(k, case, metadata=metadata)
        assert testing.compare(k.spec, case, out, lse).ok, metadata
