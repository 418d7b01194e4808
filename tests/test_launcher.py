"""The compiled launcher (attncc/csrc/launcher.cpp, attncc/launcher.py), on CPU: built with the
host's C++ compiler against torch, it drives a stub kernel library that records the AttnccArgs
it is given; those must be, field for field, what the Python path packs (ops.prepare and
ops.pack) for the same call, for every kind of cache and schedule. It remembers a signature's
preparation, prepares again when a shape changes, raises validate.py's errors, and leaves to
the Python path what needs copies."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from functools import partial

import pytest
import torch

import attncc
from attncc import abi, devicecheck, launcher, ops, testing
from attncc.render import INCLUDE_DIR

from support import GQA_SMALL, MLA_SMALL, SEPARATE_SMALL, SPARSE_SMALL

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("cc") is None,
                                reason="no C/C++ compiler")

STUB = r"""
#include "attncc/abi.h"
static AttnccArgs last;
static int calls, status;
int attncc_abi_version(void) { return ATTNCC_ABI_VERSION; }
int attncc_args_size(void) { return (int)sizeof(AttnccArgs); }
int attncc_ctas_per_sm(void) { return 2; }
int attncc_launch(const AttnccArgs* a) { last = *a; ++calls; return status; }
int attncc_write_args_size(void) { return (int)sizeof(AttnccWriteArgs); }
static AttnccWriteArgs last_write;
static int writes;
int attncc_write_cache(const AttnccWriteArgs* a) { last_write = *a; ++writes; return status; }
const AttnccArgs* stub_last(void) { return &last; }
int stub_calls(void) { return calls; }
const AttnccWriteArgs* stub_last_write(void) { return &last_write; }
int stub_writes(void) { return writes; }
void stub_fail_with(int s) { status = s; }
int attncc_plan_schedule(const AttnccArgs* a, void* lines) { (void)a; (void)lines; return status; }
"""

FIELDS = [name for name, _ in abi.AttnccArgs._fields_]
POINTERS = {"q", "out", "lse", "tensors", "block_table", "seqlens", "indices", "partial_out",
            "partial_lse", "flags", "stream", "schedule"}


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    return launcher.load(launcher.build(root=tmp_path_factory.mktemp("launcher"), progress=False))


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    directory = tmp_path_factory.mktemp("stub")
    (directory / "stub.c").write_text(STUB)
    subprocess.run([shutil.which("cc") or "c++", "-shared", "-fPIC", f"-I{INCLUDE_DIR}", "-o",
                    str(directory / "kernel.so"), str(directory / "stub.c")], check=True)
    library = abi.Library(directory / "kernel.so")
    library.dll.stub_last.restype = ctypes.POINTER(abi.AttnccArgs)
    library.dll.stub_last_write.restype = ctypes.POINTER(abi.AttnccWriteArgs)
    return library


@pytest.fixture(autouse=True)
def sms(monkeypatch):
    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)  # no GPU to ask


class Counting:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def make(ext, stub, k):
    prepare = Counting(partial(ops.prepare_call, k.spec, k.plan, stub, devicecheck.DeviceFlags()))
    fast = ext.Launcher(ctypes.cast(stub.dll.attncc_launch, ctypes.c_void_p).value,
                        [t.name for t in k.plan.layout.tensors], k.spec.separate, prepare,
                        lambda index: 0x5151, stub.fail)
    return fast, prepare


def python_args(k, stub, q, cache, block_table, seqlens, indices, requested, out, lse, scale):
    views = [ops._cache_view(k.spec, k.plan, i, t) for i, t in enumerate(ops.cache_list(k.spec, cache))]
    p = ops.prepare(k.plan, stub, q, views, block_table, requested, None)
    partial_out = partial_lse = None
    if p.workspace is not None:
        partial_out, partial_lse = torch.empty(p.workspace[0]), torch.empty(p.workspace[1])
    return p, ops.pack(p, q, out, lse, views, block_table, seqlens, indices,
                       partial_out, partial_lse, scale, 0x5151)


def record(args) -> dict:
    """An AttnccArgs' or AttnccWriteArgs' fields by name, its arrays as lists."""
    return {name: list(getattr(args, name)) if issubclass(kind, ctypes.Array) else getattr(args, name)
            for name, kind in args._fields_}


def flashmla_view(cache):  # FlashMLA's [num_blocks, P, 1, record]
    return cache.unsqueeze(2)


def wide_rows(cache):  # a [..., :record] slice of wider rows
    wide = torch.zeros(*cache.shape[:-1], cache.shape[-1] + 16, dtype=cache.dtype)
    wide[..., :cache.shape[-1]] = cache
    return wide[..., :cache.shape[-1]]


CASES = [  # (spec, lengths, s_q, requested splits, cache view)
    (MLA_SMALL, [5, 0, 13], 2, 0, None),
    (MLA_SMALL, [9], 1, 3, flashmla_view),
    (MLA_SMALL, [17, 3], 2, -4, wide_rows),
    (GQA_SMALL, [6, 11, 1, 30], 1, 0, None),
    (SPARSE_SMALL, [0, 0], 2, 0, None),
    (SEPARATE_SMALL, [7, 12], 2, 2, None),
]


@pytest.mark.parametrize("source,lengths,s_q,requested,view", CASES)
@pytest.mark.parametrize("given_out", [False, True])
def test_the_launcher_packs_what_the_python_path_packs(ext, stub, source, lengths, s_q, requested, view,
                                                       given_out):
    k = attncc.compile(source)
    case = testing.random_case(k.spec, lengths, s_q, device="cpu", seed=len(lengths))
    cache = view(case.cache) if view else case.cache
    out = lse = None
    if given_out:
        out = torch.empty(len(lengths), s_q, k.spec.heads_q, k.spec.d_v, dtype=case.q.dtype)
        lse = torch.empty(len(lengths), k.spec.heads_q, s_q)
    fast, prepare = make(ext, stub, k)
    before = stub.dll.stub_calls()
    got_out, got_lse = fast(case.q, cache, case.block_table, case.seqlens, case.indices, 0.3, requested, out, lse)
    assert stub.dll.stub_calls() == before + 1
    got = record(stub.dll.stub_last().contents)
    p, want_args = python_args(k, stub, case.q, cache, case.block_table, case.seqlens, case.indices,
                               requested, got_out, got_lse, 0.3)
    want = record(want_args)
    for name in FIELDS:
        if name not in POINTERS:
            assert got[name] == want[name], name
    assert got["q"] == case.q.data_ptr() and got["out"] == got_out.data_ptr() and got["lse"] == got_lse.data_ptr()
    assert got["tensors"] == want["tensors"] and got["stream"] == 0x5151
    for name in ("block_table", "seqlens", "indices"):
        assert got[name] == want[name], name
    assert (got["partial_out"] is not None) == (got["partial_lse"] is not None) == (p.workspace is not None)
    assert got["flags"] is not None  # the op's device word (ops.prepare_call asks for it)
    assert tuple(got_out.shape) == p.out_shape and tuple(got_lse.shape) == p.lse_shape
    assert got_lse.dtype == torch.float32 and got_out.dtype == case.q.dtype
    if given_out:
        assert got_out is out and got_lse is lse
    if p.num_parts or p.num_splits > 1:
        assert p.workspace is not None
    assert (p.num_parts, p.num_splits) != (0, 0)


def test_the_step_schedule_reaches_the_launch_and_is_not_a_signature(ext, stub):
    """k.plan's schedule (a new tensor each step) is passed through as AttnccArgs.schedule, without
    a preparation of its own; a call without one passes NULL."""
    k = attncc.compile(MLA_SMALL)
    fast, prepare = make(ext, stub, k)
    case = testing.random_case(k.spec, [5, 9], 1, device="cpu")
    lines = torch.zeros(4 * abi.SCHEDULE_LINE_BYTES, dtype=torch.uint8)
    fast(case.q, case.cache, case.block_table, case.seqlens, None, 0.1, -4, None, None, lines)
    assert record(stub.dll.stub_last().contents)["schedule"] == lines.data_ptr()
    fast(case.q, case.cache, case.block_table, case.seqlens, None, 0.1, -4, None, None)
    assert record(stub.dll.stub_last().contents)["schedule"] is None
    assert prepare.calls == 1 and fast.signatures() == 1
    with pytest.raises(ValueError, match="schedule is a tensor or None"):
        fast(case.q, case.cache, case.block_table, case.seqlens, None, 0.1, -4, None, None, [1, 2])


def test_a_signature_is_prepared_once_and_again_when_a_shape_changes(ext, stub):
    k = attncc.compile(MLA_SMALL)
    fast, prepare = make(ext, stub, k)
    case = testing.random_case(k.spec, [5, 9], 1, device="cpu")
    call = lambda c, splits=0: fast(c.q, c.cache, c.block_table, c.seqlens, None, 0.1, splits, None, None)  # noqa: E731
    call(case)
    call(case)
    fresh = lambda t: t.clone()  # noqa: E731  new tensors, new values, the same metadata
    fast(fresh(case.q), fresh(case.cache), fresh(case.block_table), case.seqlens.flip(0).contiguous(),
         None, 0.7, 0, None, None)
    assert prepare.calls == 1 and fast.signatures() == 1
    call(testing.random_case(k.spec, [5, 9, 4], 1, device="cpu"))  # a new batch size
    call(case, 2)  # another split request
    assert prepare.calls == 3 and fast.signatures() == 3
    fast.forget()
    call(case)
    assert prepare.calls == 4


def test_bad_arguments_raise_validates_errors_and_are_not_remembered(ext, stub):
    k = attncc.compile(MLA_SMALL)
    fast, prepare = make(ext, stub, k)
    case = testing.random_case(k.spec, [5, 9], 1, device="cpu")
    for _ in range(2):
        with pytest.raises(TypeError, match=r"^block_table: expected dtype int32"):
            fast(case.q, case.cache, case.block_table.long(), case.seqlens, None, 0.1, 0, None, None)
    with pytest.raises(TypeError, match=r"^seqlens: required"):
        fast(case.q, case.cache, case.block_table, None, None, 0.1, 0, None, None)
    with pytest.raises(TypeError, match=r"^block_table: expected a torch.Tensor, got list"):
        fast(case.q, case.cache, case.block_table.tolist(), case.seqlens, None, 0.1, 0, None, None)
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor"):
        fast(None, case.cache, case.block_table, case.seqlens, None, 0.1, 0, None, None)
    with pytest.raises(ValueError, match=r"^out: expected shape"):
        fast(case.q, case.cache, case.block_table, case.seqlens, None, 0.1, 0, torch.empty(1), None)
    assert fast.signatures() == 0
    k2 = attncc.compile(SEPARATE_SMALL)
    fast2, _ = make(ext, stub, k2)
    case2 = testing.random_case(k2.spec, [5], 1, device="cpu")
    with pytest.raises(ValueError, match=r"^cache: expected tensors"):
        fast2(case2.q, {"latent": case2.cache["latent"]}, case2.block_table, case2.seqlens, None, 0.1, 0,
              None, None)


def test_calls_that_need_copies_are_left_to_the_python_path(ext, stub):
    k = attncc.compile(MLA_SMALL)
    fast, _ = make(ext, stub, k)
    case = testing.random_case(k.spec, [5, 9], 2, device="cpu")
    before = stub.dll.stub_calls()
    strided_q = case.q.transpose(0, 1).contiguous().transpose(0, 1)
    strided_table = torch.stack([case.block_table, case.block_table], -1)[..., 0]
    assert fast(strided_q, case.cache, case.block_table, case.seqlens, None, 0.1, 0, None, None) is None
    assert fast(case.q, case.cache, strided_table, case.seqlens, None, 0.1, 0, None, None) is None
    assert stub.dll.stub_calls() == before  # nothing launched: the Python path will


def test_a_failed_launch_raises_its_cuda_error(ext, stub):
    k = attncc.compile(MLA_SMALL)
    fast, _ = make(ext, stub, k)
    case = testing.random_case(k.spec, [5], 1, device="cpu")
    stub.dll.stub_fail_with(1)
    try:
        with pytest.raises(RuntimeError, match=r"^attncc kernel launch failed: CUDA error 1 "):
            fast(case.q, case.cache, case.block_table, case.seqlens, None, 0.1, 0, None, None)
    finally:
        stub.dll.stub_fail_with(0)


def test_batch_zero_allocates_outputs_and_launches_nothing(ext, stub):
    k = attncc.compile(MLA_SMALL)
    fast, _ = make(ext, stub, k)
    case = testing.random_case(k.spec, [5], 1, device="cpu")
    before = stub.dll.stub_calls()
    out, lse = fast(case.q[:0], case.cache, case.block_table[:0], case.seqlens[:0], None, 0.1, 0, None, None)
    assert out.shape == (0, 1, k.spec.heads_q, k.spec.d_v) and lse.shape == (0, k.spec.heads_q, 1)
    assert stub.dll.stub_calls() == before


def test_without_the_launcher_eager_calls_take_the_python_path(monkeypatch):
    monkeypatch.setenv("ATTNCC_LAUNCHER", "0")
    assert not launcher.enabled()
    assert launcher.make(None, ["cache"], False, None) is None


def test_a_failed_build_keeps_its_source_and_says_how_to_repeat_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(attncc.build.BuildError) as err:
        launcher.build(root=tmp_path, progress=False)
    assert "the C++ compiler failed building attncc's launcher" in str(err.value)
    assert err.value.source.is_file() and err.value.source.parent.parent == tmp_path / "failed"
    assert "-o" in err.value.repro


def test_the_ab_script_drives_a_library_with_the_ops_own_arguments(stub):
    """bench/ab.py (a device benchmark) packs today's ABI with ops.prepare and ops.pack: on CPU,
    with the stub, its AttnccArgs are the Python path's."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "ab.py"
    module_spec = importlib.util.spec_from_file_location("attncc_bench_ab", path)
    ab = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(ab)
    k = attncc.compile(SEPARATE_SMALL)
    lib = ab.load(str(stub.path))
    assert lib.struct is abi.AttnccArgs
    case = testing.random_case(k.spec, [7, 12, 0], 2, device="cpu", seed=5)
    args, (out, lse, po, pl, flags), (splits, parts) = ab.make_args(k.plan, lib, case, k.spec, stream=0x5151)
    p, want = python_args(k, stub, case.q, case.cache, case.block_table, case.seqlens, case.indices, 0, out, lse,
                          k.spec.softmax_scale)
    got, want = record(args), record(want)
    for name in FIELDS:
        if name not in ("partial_out", "partial_lse", "flags"):
            assert got[name] == want[name], name
    assert (splits, parts) == (p.num_splits, p.num_parts) and flags is not None and got["flags"] == flags.data_ptr()
    assert (po is None) == (p.workspace is None)


def test_threads_that_meet_in_prepare_keep_their_own_signatures(ext, stub):
    """prepare runs Python, where another thread can call the same launcher: each call must
    remember its own signature's preparation (a shared one would be overwritten)."""
    import threading
    import time

    k = attncc.compile(MLA_SMALL)
    inner = partial(ops.prepare_call, k.spec, k.plan, stub, devicecheck.DeviceFlags())
    both_inside = threading.Barrier(2)

    def slow_prepare(*args):
        both_inside.wait(timeout=10)  # both threads inside prepare at once
        time.sleep(0.01)
        return inner(*args)

    fast = ext.Launcher(ctypes.cast(stub.dll.attncc_launch, ctypes.c_void_p).value, ["cache"], False,
                        slow_prepare, lambda index: 0, stub.fail)
    cases = {batch: testing.random_case(k.spec, [5] * batch, 1, device="cpu", seed=batch) for batch in (2, 3)}
    call = lambda c: fast(c.q, c.cache, c.block_table, c.seqlens, None, 0.1, 0, None, None)  # noqa: E731
    threads = [threading.Thread(target=call, args=(c,)) for c in cases.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fast.signatures() == 2
    for batch, case in cases.items():  # remembered now: no prepare (the barrier would time out)
        out, lse = call(case)
        assert out.shape[0] == batch and lse.shape[0] == batch
        assert stub.dll.stub_last().contents.batch == batch


def test_where_the_launcher_cannot_be_built_one_warning_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    launcher.module.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"no compiled launcher \(the C\+\+ compiler failed.*Python path"):
            assert launcher.module() is None
        assert launcher.module() is None  # remembered: no second build, no second warning
    finally:
        launcher.module.cache_clear()


# --- write_cache (WriteLauncher) ---------------------------------------------------------------

def make_write(ext, stub, k, flags=None):
    flags = flags or devicecheck.DeviceFlags()
    prepare = Counting(partial(ops.prepare_write, k.spec, k.plan, flags))
    fast = ext.WriteLauncher(ctypes.cast(stub.dll.attncc_write_cache, ctypes.c_void_p).value,
                             [t.name for t in k.plan.layout.tensors], k.spec.separate,
                             [s.name for s in k.spec.segments], prepare, lambda index: 0x5252, stub.fail)
    return fast, prepare, flags


def write_values(k, n, dtype=torch.bfloat16, seed=0, spread=False):
    """Random values of every segment, [n, copies, dim] ([n, dim] shared); spread: each a view of
    every other row of a larger tensor (a token stride of two rows, the last dim contiguous)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for seg in k.spec.segments:
        shape = (n, seg.dim) if seg.shared else (n, k.spec.heads_kv, seg.dim)
        t = torch.randn((2 * n, *shape[1:]) if spread else shape, generator=g).to(dtype)
        out[seg.name] = t[::2] if spread else t
    return out


WRITE_CASES = [  # (spec, tokens, slot dtype, value dtype, values spread, cache view)
    (MLA_SMALL, 5, torch.int64, torch.bfloat16, False, None),
    (MLA_SMALL, 3, torch.int32, torch.float32, True, flashmla_view),
    (MLA_SMALL, 4, torch.int64, torch.float16, False, wide_rows),
    (GQA_SMALL, 7, torch.int32, torch.float16, True, None),
    (SPARSE_SMALL, 6, torch.int64, torch.bfloat16, False, None),
    (SEPARATE_SMALL, 5, torch.int32, torch.float32, False, None),
    (SEPARATE_SMALL, 2, torch.int64, torch.bfloat16, True, None),
]


@pytest.mark.parametrize("source,n,slot_dtype,value_dtype,spread,view", WRITE_CASES)
def test_the_write_launcher_packs_what_the_python_path_packs(ext, stub, source, n, slot_dtype, value_dtype,
                                                             spread, view):
    """k.write_cache through WriteLauncher: the library gets, field for field (pointers and the
    flag word included), the AttnccWriteArgs ops.pack_write packs for the same call, for packed
    and separate caches, shared segments, fp8 records, cache views, int32 and int64 slots and
    values of each dtype the kernel reads, contiguous or a row apart."""
    k = attncc.compile(source)
    cache = k.new_cache(4, device="cpu")
    cache = view(cache) if view else cache
    slots = torch.tensor([1, 14, -1, 6, 9, 2, 15][:n], dtype=slot_dtype)
    values = write_values(k, n, value_dtype, seed=n, spread=spread)
    fast, prepare, flags = make_write(ext, stub, k)
    before = stub.dll.stub_writes()
    assert fast(cache, slots, values) is True
    assert stub.dll.stub_writes() == before + 1 and prepare.calls == 1
    got = record(stub.dll.stub_last_write().contents)
    want_args, _ = ops.pack_write(k.spec, k.plan, cache, slots, values, flags.word(slots.device))
    want = record(want_args)
    assert got.pop("stream") == 0x5252 and want.pop("stream") is None
    assert got == want
    assert got["flags"] == flags.word(slots.device).data_ptr() and got["slots"] == slots.data_ptr()
    assert got["values"][:len(values)] == [values[s.name].data_ptr() for s in k.spec.segments]


def test_a_write_signature_is_prepared_once_and_again_when_a_shape_changes(ext, stub):
    k = attncc.compile(SEPARATE_SMALL)
    fast, prepare, _ = make_write(ext, stub, k)
    cache = k.new_cache(4, device="cpu")
    slots = torch.tensor([3, 7, 0], dtype=torch.int32)
    fast(cache, slots, write_values(k, 3))
    fast({name: t.clone() for name, t in cache.items()}, slots.flip(0).contiguous(), write_values(k, 3, seed=9))
    fast(cache, slots, dict(reversed(list(write_values(k, 3).items()))))  # keyword order is not the signature
    assert prepare.calls == 1 and fast.signatures() == 1
    fast(cache, slots[:2], write_values(k, 2))  # another token count
    fast(cache, slots.long(), write_values(k, 3))  # 64-bit slots
    fast(cache, slots, write_values(k, 3, torch.float32))  # fp32 values
    assert prepare.calls == 4 and fast.signatures() == 4
    fast.forget()
    fast(cache, slots, write_values(k, 3))
    assert prepare.calls == 5


def test_bad_write_arguments_are_the_python_paths_or_raise_validates_errors(ext, stub):
    """An argument that cannot be signed (not a tensor, a segment missing or unknown) is left to
    the Python path, which raises validate.py's error; one that can raises it from prepare and
    is not remembered."""
    k = attncc.compile(SEPARATE_SMALL)
    fast, prepare, _ = make_write(ext, stub, k)
    cache = k.new_cache(4, device="cpu")
    slots = torch.tensor([3, 7], dtype=torch.int64)
    values = write_values(k, 2)
    before = stub.dll.stub_writes()
    assert fast(cache, slots.tolist(), values) is False
    assert fast(cache, slots, {"latent": values["latent"]}) is False
    assert fast(cache, slots, {**values, "extra": values["rope"]}) is False
    assert fast({"latent": cache["latent"]}, slots, values) is False
    assert prepare.calls == 0
    with pytest.raises(TypeError, match=r"^slots: expected a 1-D integer tensor"):
        fast(cache, slots.float(), values)
    with pytest.raises(ValueError, match=r"^rope: expected shape"):
        fast(cache, slots, {**values, "rope": values["rope"][:1]})
    assert fast.signatures() == 0 and stub.dll.stub_writes() == before


def test_writes_that_need_copies_or_torch_ops_are_left_to_the_python_path(ext, stub):
    """Slots the kernel does not read as they are (int16, strided), values whose last dim is not
    contiguous, values of a dtype the kernel does not read (torch ops write them): remembered as
    the Python path's, nothing enqueued."""
    k = attncc.compile(MLA_SMALL)
    fast, _, _ = make_write(ext, stub, k)
    cache = k.new_cache(4, device="cpu")
    slots = torch.tensor([3, 7, 1], dtype=torch.int64)
    values = write_values(k, 3)
    before = stub.dll.stub_writes()
    assert fast(cache, slots.to(torch.int16), values) is False
    assert fast(cache, torch.stack([slots, slots], 1)[:, 0], values) is False
    every_other = torch.cat([values["latent"], values["latent"]], -1)[..., ::2]  # a last-dim stride of 2
    assert fast(cache, slots, {**values, "latent": every_other}) is False
    assert fast(cache, slots, {name: t.double() for name, t in values.items()}) is False
    assert stub.dll.stub_writes() == before and fast.signatures() == 4


def test_a_failed_write_raises_its_cuda_error(ext, stub):
    k = attncc.compile(MLA_SMALL)
    fast, _, _ = make_write(ext, stub, k)
    stub.dll.stub_fail_with(2)
    try:
        with pytest.raises(RuntimeError, match=r"^attncc kernel launch failed: CUDA error 2 "):
            fast(k.new_cache(4, device="cpu"), torch.tensor([3]), write_values(k, 1))
    finally:
        stub.dll.stub_fail_with(0)


def test_without_the_launcher_writes_take_the_python_path(monkeypatch):
    monkeypatch.setenv("ATTNCC_LAUNCHER", "0")
    assert launcher.make_write(None, ["cache"], False, ["latent"], None) is None


def test_records_the_write_kernel_does_not_take_get_no_write_launcher(monkeypatch):
    """More segments than abi.h's ATTNCC_MAX_SEGMENTS: write_cache takes torch ops, and no
    WriteLauncher is asked for (ops.kernel_writes is the one place of the rule)."""
    asked = []
    monkeypatch.setattr(launcher, "make_write", lambda *a, **kw: asked.append(a[3]) or "launcher")
    n = abi.MAX_SEGMENTS + 1
    segments = "\n".join(f"        s{i}: bf16[16]" for i in range(n))
    wide = attncc.compile(f"""attention nine {{
    heads q = 8, kv = 1
    cache paged(16) {{
{segments}
    }}
    key = {' ++ '.join(f's{i}' for i in range(n))}
    value = {' ++ '.join(f's{i}' for i in range(n - 1))}
}}
""")
    assert not ops.kernel_writes(wide.spec)
    assert not ops.writes_on_device(wide.spec, write_values(wide, 2))
    assert wide._op.fast_write() is None and asked == []
    k = attncc.compile(MLA_SMALL.replace("mla_small", "mla_small_write_rule"))  # an op no other test made
    assert ops.kernel_writes(k.spec)
    assert k._op.fast_write() == "launcher" and asked == [[s.name for s in k.spec.segments]]
