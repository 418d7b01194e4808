"""write_cache's kernel (templates/include/attncc/core/write.cuh) on a real GPU (pytest -m gpu).

The contract is storage.write, the torch ops that write a cache on CPU: the kernel must store
the same bytes (fp8 quantized with scale = amax / max finite per group, 16-bit values rounded
to nearest even) for every spec of the GPU suite, values in fp32, bf16 and fp16, int32 and
int64 slots, cache views; skip -1 and flag out-of-range slots without touching the cache; be
one kernel and no host sync."""
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import attncc
from attncc import storage, testing

from specs import all_specs
from support import no_host_sync

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SPECS = all_specs()
_COMPILED: dict = {}


@pytest.fixture(scope="module", autouse=True)
def built():
    """Every spec compiled and its library built, in parallel (nvcc is a subprocess)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _COMPILED.update({name: attncc.compile(text) for name, text in SPECS.items()})
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda k: k.build(), _COMPILED.values()))


def compiled(name):
    return _COMPILED[name]


def _values(spec, n, dtype, seed):
    """Random values per segment ([n, kv heads, dim], [n, dim] shared), each token at its own
    magnitude (10^-3 .. 10^3) so that scales and fp8 subnormals vary."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for seg in spec.segments:
        shape = (n, seg.dim) if seg.shared else (n, spec.heads_kv, seg.dim)
        size = 10.0 ** (torch.rand(n, generator=gen) * 6 - 3)
        v = torch.randn(shape, generator=gen) * size.view(-1, *([1] * (len(shape) - 1)))
        if seg.dtype.is_fp8 or dtype == torch.float32:
            out[seg.name] = v.to(dtype)
        else:  # in range of the 16-bit dtype: no inf from fp16 inputs
            out[seg.name] = v.clamp(-6e4, 6e4).to(dtype)
    return out


def _bytes(cache) -> dict:
    return {n: t.view(torch.uint8).cpu() for n, t in storage.cache_tensors(cache).items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", list(SPECS))
def test_the_kernel_stores_the_bytes_the_contract_stores(name, dtype):
    k = compiled(name)
    spec = k.spec
    n = 37
    pages = max(5, -(-2 * n // spec.page_size))  # room for n distinct slots at any page size
    cache = k.new_cache(pages)
    testing.fill_nan(cache)  # what no slot names stays all-ones
    gen = torch.Generator().manual_seed(len(name))
    slots = torch.randperm(pages * spec.page_size, generator=gen)[:n]
    slots[::7] = -1  # padding
    slots = slots.to("cuda", torch.int32 if dtype != torch.float32 else torch.int64)
    values = {s: v.cuda() for s, v in _values(spec, n, dtype, seed=len(name) + 1).items()}
    want = testing.written_as_contract(spec, cache, slots, values)
    with no_host_sync():
        k.write_cache(cache, slots, **values)
    got = _bytes(cache)
    for tensor, t in want.items():
        assert torch.equal(got[tensor], t.view(torch.uint8)), (tensor, (got[tensor] != t.view(torch.uint8)).sum())
    k.check()  # -1 is padding, not an error


@pytest.mark.parametrize("name", ["mla_fp8_sparse", "gla_fp8_e5m2", "fp8_separate_e5m2", "mla_fp8_page1_h64"])
def test_nan_and_inf_quantize_as_the_contract_says(name):
    """A NaN in a group: scale 1, the NaN stays NaN, the rest clamped to the finite range; an
    inf: scale inf, the inf becomes NaN, the rest 0; a group of zeros: scale 1, zeros."""
    k = compiled(name)
    spec = k.spec
    cache = k.new_cache(4)  # 4 slots at least
    values = {s: v.cuda() for s, v in _values(spec, 4, torch.float32, seed=9).items()}
    fp8 = next(s for s in spec.segments if s.dtype.is_fp8)
    group = fp8.scale_group
    v = values[fp8.name].view(4, -1)
    v[0, 3] = float("nan")
    v[1, group + 1] = float("inf")
    v[2, :group] = 0.0
    v[3, 5] = -float("inf")
    slots = torch.tensor([0, 3, 1, 2], device="cuda")
    want = testing.written_as_contract(spec, cache, slots, values)
    k.write_cache(cache, slots, **values)
    got = storage.read(spec, cache, slots)
    expected = storage.read(spec, want if spec.separate else want[storage.PACKED_NAME], slots.cpu())
    for seg in spec.segments:
        a, b = got[seg.name].cpu(), expected[seg.name]
        assert torch.equal(a.isnan(), b.isnan()), seg.name
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), seg.name
    lat = got[fp8.name].cpu().view(4, -1)
    assert lat[0, 3].isnan() and lat[1, group + 1].isnan() and lat[3, 5].isnan()
    assert (lat[2, :group] == 0).all()


def test_views_are_written_in_place_and_nothing_beside_them():
    """DESIGN.md §3a's views: a slice of wider rows, FlashMLA's 4-D, a page-strided slice, and
    FlashInfer's halves of one [pages, 2, P, G, d] buffer."""
    k = compiled("mla_fp8_sparse")
    spec = k.spec
    n = 20
    slots = torch.randperm(3 * spec.page_size)[:n].cuda()
    values = {s: v.cuda() for s, v in _values(spec, n, torch.bfloat16, seed=3).items()}
    plain = k.new_cache(3)
    k.write_cache(plain, slots, **values)
    pages, page, record = plain.shape
    wide = torch.full((pages, page, record + 48), 0xAB, dtype=torch.uint8, device="cuda")
    tall = torch.full((pages, page + 3, record), 0xAB, dtype=torch.uint8, device="cuda")
    wide[..., :record] = 0  # the views start as new_cache's zeros; the bytes beside them are 0xAB
    tall[:, :page] = 0
    for buffer, view in ((wide, wide[..., :record]), (tall, tall[:, :page]), (None, k.new_cache(3).unsqueeze(2))):
        k.write_cache(view, slots, **values)
        assert torch.equal(view.reshape(pages, page, record) if buffer is None else view, plain)
        if buffer is wide:
            assert (wide[..., record:] == 0xAB).all()
        if buffer is tall:
            assert (tall[:, page:] == 0xAB).all()
    k = compiled("gqa8_separate")
    spec = k.spec
    slots = torch.randperm(3 * spec.page_size)[:n].cuda()  # this spec's pages: its own slots
    values = {s: v.cuda() for s, v in _values(spec, n, torch.float32, seed=4).items()}
    plain = k.new_cache(3)
    k.write_cache(plain, slots, **values)
    names = list(plain)
    both = torch.full((3, 2, *plain[names[0]].shape[1:]), float("nan"), dtype=plain[names[0]].dtype, device="cuda")
    view = {name: both[:, i] for i, name in enumerate(names)}
    k.write_cache(view, slots, **values)
    written = torch.zeros(3 * spec.page_size, dtype=torch.bool, device="cuda")
    written[slots] = True
    for name in names:
        got, want = view[name].flatten(0, 1), plain[name].flatten(0, 1)  # [slots, heads, dim]
        assert torch.equal(got[written], want[written]), name
        assert got[~written].isnan().all(), name  # the buffer's NaN where no slot was written


@pytest.mark.parametrize("name", ["mla_fp8_sparse", "gqa8_separate"])
def test_out_of_range_slots_are_flagged_and_touch_nothing(name):
    k = compiled(name)
    spec = k.spec
    cache = k.new_cache(2)
    testing.fill_nan(cache)
    before = _bytes(cache)
    values = {s: v.cuda() for s, v in _values(spec, 3, torch.float32, seed=5).items()}
    k.write_cache(cache, torch.tensor([-1, -2, 2 * spec.page_size], device="cuda", dtype=torch.int32), **values)
    after = _bytes(cache)
    assert all(torch.equal(before[t], after[t]) for t in before)
    with pytest.raises(ValueError, match="^slots: write_cache got a slot outside"):
        k.check()
    k.check()  # cleared


def _written(n: int, dtype, seed: int):
    """The sparse example's kernel, a 2-page cache with slots 0 .. n - 1 written once (warm)."""
    k = compiled("mla_fp8_sparse")
    cache = k.new_cache(2)
    values = {s: v.cuda() for s, v in _values(k.spec, n, dtype, seed=seed).items()}
    slots = torch.arange(n, device="cuda")
    k.write_cache(cache, slots, **values)
    torch.cuda.synchronize()
    return k, cache, slots, values


@pytest.mark.parametrize("name", ["mla", "mla_fp8_sparse", "gla_fp8_e5m2", "fp8_separate_e5m2", "gqa8_separate"])
def test_the_compiled_write_launcher_stores_what_the_python_path_stores(name):
    """Eager writes go through the compiled launcher (csrc/launcher.cpp: WriteLauncher); it must
    be there on the device and store, byte for byte, what the Python path (ops.cuda_write_cache)
    stores for the same call: int32 and int64 slots, values of each dtype, a slot of -1; slots
    the kernel does not read as they are (int16) take the Python path, still the contract's bytes."""
    k = compiled(name)
    spec = k.spec
    fast = k.op.fast_write()
    assert fast is not None, "no compiled write launcher on the device"
    fast.forget()  # one launcher a spec for the whole process: other tests' calls signed it already
    n = 21
    pages = max(5, -(-2 * n // spec.page_size))
    for i, (slot_dtype, dtype) in enumerate(((torch.int32, torch.bfloat16), (torch.int64, torch.float32),
                                             (torch.int64, torch.float16), (torch.int16, torch.bfloat16))):
        fast_cache, python_cache = k.new_cache(pages), k.new_cache(pages)
        testing.fill_nan(fast_cache)
        testing.fill_nan(python_cache)
        gen = torch.Generator().manual_seed(30 + i)
        slots = torch.randperm(pages * spec.page_size, generator=gen)[:n]
        slots[3] = -1
        slots = slots.to("cuda", slot_dtype)
        values = {s: v.cuda() for s, v in _values(spec, n, dtype, seed=40 + i).items()}
        with no_host_sync():
            k.write_cache(fast_cache, slots, **values)
        k.op.write_cache(python_cache, slots, values)
        base = k.new_cache(pages)
        testing.fill_nan(base)
        want = testing.written_as_contract(spec, base, slots, values)
        got, python = _bytes(fast_cache), _bytes(python_cache)
        for tensor in got:
            assert torch.equal(got[tensor], python[tensor]), (tensor, slot_dtype, dtype)
            assert torch.equal(got[tensor], want[tensor].view(torch.uint8)), (tensor, slot_dtype, dtype)
    assert fast.signatures() == 4  # three enqueued by it, the int16 slots remembered as the Python path's
    k.check()


def test_a_write_is_one_kernel():
    k, cache, slots, values = _written(16, torch.bfloat16, seed=6)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        k.write_cache(cache, slots, **values)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "write_cache_kernel" in kernels[0], kernels


def test_a_write_in_a_cuda_graph_replays_with_new_slots_and_values():
    k, cache, slots, values = _written(8, torch.float32, seed=7)
    spec = k.spec
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k.write_cache(cache, slots, **values)
    fresh = _values(spec, 8, torch.float32, seed=8)
    for s, v in values.items():
        v.copy_(fresh[s].cuda())
    slots.copy_(torch.arange(100, 108))
    want = testing.written_as_contract(spec, cache, slots, values)
    graph.replay()
    got = _bytes(cache)
    assert all(torch.equal(got[t], w.view(torch.uint8)) for t, w in want.items())
