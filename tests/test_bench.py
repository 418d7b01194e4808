"""`attncc bench` on a machine without a GPU: its configurations (FlashMLA's grid, ragged
lengths) and the command's refusals. The timings themselves run on the device."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncc
from attncc import bench
from attncc.cli import main
from attncc.frontend import check_spec
from support import load_script

REPO = Path(__file__).resolve().parent.parent


def test_default_grid_is_flashmla_table_plus_pages_1_and_16():
    grid = bench.default_grid(check_spec(REPO / "examples" / "mla.attn"))
    table = {(c.heads_q, c.s_q, c.seqlen) for c in grid if c.page_size == 64}
    assert table == {(h, s, L) for h in (16, 32, 64, 128) for s in (1, 2) for L in (4096, 8192, 32768)}
    assert all(c.batch == 128 and not c.ragged for c in grid)
    assert {c.page_size for c in grid} == {1, 16, 64}


@pytest.mark.parametrize("batch,seqlen", [(128, 8192), (33, 100), (1, 7), (2, 1)])
def test_ragged_lengths_keep_the_total_and_spread(batch, seqlen):
    """Ragged: lengths in [1, 2 s_k - 1] whose total is the uniform one (so the roofline's
    bytes and FLOPs are unchanged), deterministic per seed."""
    cfg = bench.Config(batch, 2, 128, seqlen, 64, ragged=True)
    lengths = cfg.lengths()
    assert len(lengths) == batch and sum(lengths) == batch * seqlen
    assert all(1 <= n <= 2 * seqlen - 1 for n in lengths)
    assert cfg.lengths() == lengths  # deterministic
    if batch > 1 and seqlen > 1:
        assert cfg.lengths(seed=1) != lengths
    if batch >= 32 and seqlen >= 64:
        assert max(lengths) - min(lengths) > seqlen  # actually spread, not a constant
    assert bench.Config(batch, 2, 128, seqlen, 64).lengths() == [seqlen] * batch
    assert "~" in cfg.label() and "~" not in bench.Config(batch, 2, 128, seqlen, 64).label()


def _run(capsys, *argv):
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def test_ragged_sparse_spec_is_refused(capsys):
    rc, err = _run(capsys, "bench", str(REPO / "examples" / "mla_fp8_sparse.attn"), "--ragged")
    assert rc == 2 and "--ragged" in err and "sparse" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_bench_without_gpu_says_so(capsys):
    rc, err = _run(capsys, "bench", str(REPO / "examples" / "mla.attn"), "--ragged")
    assert rc == 2 and "needs a CUDA GPU" in err


@pytest.mark.parametrize("seqlen", [300, 4096])
def test_sparse_inputs_are_each_querys_topk_of_its_own_sequence(seqlen):
    """bench's sparse indices are made as a top-k selection makes them (and as FlashMLA is
    measured): distinct positions of the query's own sequence, in random order, through its
    pages; -1 only where the sequence is shorter than topk."""
    spec = check_spec(REPO / "examples" / "mla_fp8_sparse.attn")
    cfg = bench.Config(3, 2, 128, seqlen, spec.page_size)
    case = bench.inputs(spec, cfg, device="cpu")
    pages = case.cache.shape[0] // cfg.batch
    for b in range(cfg.batch):
        for t in range(cfg.s_q):
            idx = case.indices[b, t]
            valid = idx[idx >= 0]
            assert len(valid) == min(seqlen, spec.topk) and (idx[len(valid):] == -1).all()
            assert len(set(valid.tolist())) == len(valid)
            # every slot is in a page of this sequence's own: the pages are a permutation, so
            # sequence b's positions land in len(pages) distinct pages, none shared across b
            assert len(set((valid // spec.page_size).tolist())) <= pages
            assert not (valid[1:] > valid[:-1]).all()  # not sorted
    seqs = [set((case.indices[b][case.indices[b] >= 0] // spec.page_size).tolist()) for b in range(cfg.batch)]
    assert all(not (seqs[i] & seqs[j]) for i in range(cfg.batch) for j in range(i + 1, cfg.batch))


def test_stall_profile_splits_roles_at_setmaxnreg(tmp_path, capsys):
    """bench/stall_profile.py summary: rows before the first setmaxnreg are the prologue, after
    TRY_ALLOC the consumers', after DEALLOC the producer's; samples, stall reasons and opcodes
    (past predicates) add up per role; a file that is not ncu's source page is refused."""
    import gzip

    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]
    body = [("0x0", "LDC R1, c[0x0][0x28]", "2", "10", "0", "2", "9"),
            ("0x10", "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xd8", "1", "4", "1", "0", "9"),
            ("0x20", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ", "6", "8", "5", "1", "9"),
            ("0x30", "@!P0 FMUL R2, R3, R4", "3", "8", "0", "3", "9"),
            ("0x40", "USETMAXREG.DEALLOC.CTAPOOL 0x48", "0", "4", "0", "0", "9"),
            ("0x50", "F2FP.BF16.F32.PACK_AB R5, R6, R7", "7", "12", "2", "5", "9"),
            ("0x60", "@P1 FMUL R2, R3, R4", "1", "6", "1", "0", "9")]
    lines = ['"Kernel Name","decode_kernel",', ",".join(f'"{h}"' for h in header)]
    lines += [",".join(f'"{v}"' for v in row) for row in body]
    path = tmp_path / "src.csv.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    sp = load_script(REPO / "bench" / "stall_profile.py", "attncc_bench_stall_profile")
    roles = sp.summarize(sp.read_rows(gzip.decompress(path.read_bytes()).decode()))
    assert list(roles) == ["prologue", "consumers", "producer"]
    assert [roles[r].samples for r in roles] == [2, 10, 8]
    assert roles["consumers"].stalls == {"long_sb": 6, "wait": 4}  # the Not Issued column apart
    assert roles["producer"].executed == {"USETMAXREG.DEALLOC.CTAPOOL": 4, "F2FP.BF16.F32.PACK_AB": 12, "FMUL": 6}
    assert roles["consumers"].sampled["FMUL"] == 3
    assert sp.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "producer: 8 samples (40.0% of all)" in out and "long_sb 37.5%" in out
    not_ncu = tmp_path / "notes.csv"
    not_ncu.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="not ncu's source page"):
        sp.main(["summary", str(not_ncu)])


def test_stall_profile_command_profiles_the_named_kernel_of_any_command(tmp_path, capsys, monkeypatch):
    """bench/stall_profile.py command: the words after `--` are the profiled command, the kernel
    regex and the skip reach ncu, the source page and the details page land beside OUT; no
    command after `--` is refused."""
    import gzip

    sp = load_script(REPO / "bench" / "stall_profile.py", "attncc_bench_stall_profile_cmd")
    page = '"Kernel Name","peer",\n"Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n' \
           '"HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ","5","8"\n'
    calls = []

    class Done:
        def __init__(self, stdout):
            self.stdout = stdout

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return Done(page if "source" in cmd else "details of the peer")

    monkeypatch.setattr(sp.shutil, "which", lambda name: "/opt/ncu")
    monkeypatch.setattr(sp.subprocess, "run", fake_run)
    out = tmp_path / "peer.csv.gz"
    assert sp.main(["command", str(out), "--kernel", "flash_fwd", "--skip", "3", "--",
                    "python3", "peer.py", "--only", "x"]) == 0
    assert calls[0][-4:] == ["python3", "peer.py", "--only", "x"]
    assert "regex:flash_fwd" in calls[0] and calls[0][calls[0].index("--launch-skip") + 1] == "3"
    assert gzip.decompress(out.read_bytes()).decode() == page
    assert (tmp_path / "peer.details.txt").read_text() == "details of the peer"
    assert "prologue: 5 samples" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        sp.main(["command", str(out), "--kernel", "flash_fwd"])


def test_kernel_split_groups_a_profile_into_calls():
    """bench/kernel_split.py: kernel events of several calls (with the flush and spin kernels
    between, in any order) become each kernel's median duration and a call's median span; calls
    that launched different kernels, or a count that does not divide, are refused."""
    ks = load_script(REPO / "bench" / "kernel_split.py", "attncc_bench_kernel_split")
    events = []
    for i, t0 in enumerate((0.0, 1000.0, 2000.0)):
        events += [("at::native::vectorized_elementwise_kernel", t0, t0 + 50),
                   ("at::cuda::(anonymous namespace)::spin_kernel(long)", t0 + 50, t0 + 100),
                   ("void attncc::hopper::decode_parts_kernel<Cfg>", t0 + 101, t0 + 101 + 400 + i),
                   ("void attncc::combine_kernel<Cfg>", t0 + 510, t0 + 510 + 20 - i)]
    kernels, span = ks.per_call(events[::-1], 3)
    assert kernels == [("void attncc::hopper::decode_parts_kernel<Cfg>", 401.0), ("void attncc::combine_kernel<Cfg>", 19.0)]
    assert span == 428.0  # the median, call 1: 1101 -> 1529
    with pytest.raises(ValueError, match="not 4 calls"):
        ks.per_call(events, 4)
    swapped = events[:2] + [events[3], events[2]] + events[4:]  # call 0's kernels, the other way round
    swapped[2] = (swapped[2][0], 101.0, 120.0)
    swapped[3] = (swapped[3][0], 130.0, 530.0)
    with pytest.raises(ValueError, match="different kernels"):
        ks.per_call(swapped, 3)


def test_determinism_compares_calls_bit_for_bit(capsys):
    """bench/determinism.py: calls equal bit for bit (a NaN left in both included) are the same;
    one element off, a NaN in one call only, or a zero's sign are not; without a GPU it says so."""
    det = load_script(REPO / "bench" / "determinism.py", "attncc_bench_determinism")
    out = torch.randn(4, 3, dtype=torch.bfloat16)
    out[1, 2] = float("nan")
    lse = torch.randn(3, 4)
    runs = [(out.clone(), lse.clone()) for _ in range(3)]
    assert det.difference(runs) == (True, 0.0)
    runs[2][1][0, 1] += 0.25
    same, diff = det.difference(runs)
    assert not same and diff == pytest.approx(0.25, abs=1e-6)
    runs[2][1].copy_(lse)
    runs[1][0][0, 0] = float("nan")
    assert det.difference(runs) == (False, float("inf"))
    zeros = [(torch.zeros(2),), (-torch.zeros(2),)]
    assert det.difference(zeros) == (False, 0.0)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            det.main([str(REPO / "examples" / "gla2.attn")])


def test_ab_drives_each_library_at_what_it_was_built_as(tmp_path):
    """bench/ab.py varies the spec by --heads/--page as bench/ab_build.py does, and refuses a
    library built as another variant (its TAG_name.json), or, without a record, one driven at
    other values than its spec's (session 20 timed an h_q 128 build at 64 heads)."""
    import json

    ab = load_script(REPO / "bench" / "ab.py", "attncc_bench_ab_variants")
    mla = str(REPO / "examples" / "mla.attn")
    a, b = tmp_path / "old_mla_h64.so", tmp_path / "new_mla_h64.so"
    for lib in (a, b):
        lib.with_suffix(".json").write_text(json.dumps({"spec": "examples/mla.attn", "heads_q": 128, "page_size": 64,
                                                         "config": []}))
    with pytest.raises(SystemExit, match=r"old_mla_h64.so is a build of h_q 128, page 64; driven at h_q 64, page 64"):
        ab.main([mla, str(a), str(b), "--heads", "64"])
    bare_a, bare_b = tmp_path / "a.so", tmp_path / "b.so"
    with pytest.raises(SystemExit, match=r"a.so is a build of h_q 128, page 64; driven at h_q 128, page 16"):
        ab.main([mla, str(bare_a), str(bare_b), "--page", "16"])
    b.with_suffix(".json").write_text(json.dumps({"spec": "examples/mla.attn", "heads_q": 64, "page_size": 64, "config": []}))
    with pytest.raises(SystemExit, match=r"old_mla_h64.so is a build of h_q 128"):  # A still the wrong one
        ab.main([mla, str(a), str(b), "--heads", "64"])
    a.with_suffix(".json").write_text(b.with_suffix(".json").read_text())
    with pytest.raises(OSError):  # both right: on to loading them (no such files here)
        ab.main([mla, str(a), str(b), "--heads", "64"])


def test_sanitize_runs_every_spec_and_every_choice_not_taken():
    """bench/sanitize.py's default names are every spec and every (spec[~seesaw], choice) of
    support.CHOICES; a name with a choice maps to its spec's text and runs an op of its own, a
    plain name the spec's own op."""
    from specs import all_specs
    from support import CHOICES

    san = load_script(REPO / "bench" / "sanitize.py", "attncc_bench_sanitize")
    names = san._specs([])
    assert set(names) == set(all_specs()) | {f"{n}:{c}" for n, c in CHOICES}
    form = "mla_fp8_per128_h64~seesaw:skip_unmoved=false"
    assert names[form] == all_specs()["mla_fp8_per128_h64"]
    k = attncc.compile(names["mla_page1_h128"])
    assert san._op("mla_page1_h128", k) is k.op
    assert san._op("mla_page1_h128:producer_fences=true", k) is not k.op
    with pytest.raises(ValueError, match="FIELD a field of the hopper kernel config"):
        san._op("mla_page1_h128:producer_fence=true", k)


def test_build_fuzz_draws_specs_of_the_language():
    """bench/build_fuzz.py's specs (the build fuzz of session 28): each is checked without a bare
    Python error, either accepted with its families asked in turn or refused by a positioned
    SpecError; over 300 draws some run on each family and some on none."""
    import random
    import warnings

    from attncc.errors import SpecError
    from attncc.testing import families_of

    fuzz = load_script(REPO / "bench" / "build_fuzz.py", "attncc_bench_build_fuzz")
    rng = random.Random(5)
    seen, refused = set(), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(300):
            text = fuzz.spec_text(rng, f"fz{i}")
            try:
                check_spec(text)
                seen.update(families_of(text) or ["none"])
            except SpecError as exc:
                assert str(exc).startswith("<string>:"), str(exc)
                refused += 1
    assert {"hopper", "mma_sync", "none"} <= seen
    assert refused < 150


def test_sass_loops_are_backward_branches_without_an_exit():
    """bench/sass.py loops: a backward branch is a loop of its function (body from the target to
    the branch, the opcode mix without predicates and modifiers); one whose body passes an EXIT
    (an mbarrier wait's retry stub after the exits, branching back into the code) is not, nor is
    one shorter than the minimum."""
    sass = load_script(REPO / "bench" / "sass.py", "attncc_bench_sass")
    listing = "\n".join([
        "\t\tFunction : _Z6kernelv",
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;      /* 0x0 */",
        "        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;",
        "        /*0020*/              @!P0 BRA 0x90 ;",
        "        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;",
        "        /*0040*/                   F2FP.BF16.F32.PACK_AB R3, R4, R5 ;",
        "        /*0050*/                   F2FP.BF16.F32.PACK_AB R6, R7, R8 ;",
        "        /*0060*/              @P1 BRA 0x10 ;",
        "        /*0070*/                   EXIT ;",
        "        /*0080*/                   BRA 0x80 ;",
        "        /*0090*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;",
        "        /*00a0*/              @!P0 BRA 0x90 ;",
        "        /*00b0*/                   BRA 0x30 ;",
        "\t\tFunction : _Z5otherv",
        "        /*0000*/                   NOP ;",
        "        /*0010*/                   BRA 0x0 ;",
    ])
    functions = sass.functions(listing)
    assert list(functions) == ["_Z6kernelv", "_Z5otherv"]
    assert len(functions["_Z6kernelv"]) == 12
    found = sass.loops(functions["_Z6kernelv"], min_size=2)
    assert [(a, b, len(body)) for a, b, body in found] == [(0x10, 0x60, 6), (0x90, 0xa0, 2)]
    assert [sass.opcode(t) for t in found[0][2]] == ["SYNCS", "BRA", "HGMMA", "F2FP", "F2FP", "BRA"]
    assert sass.loops(functions["_Z6kernelv"], min_size=3) == found[:1]
    assert sass.loops(functions["_Z5otherv"], min_size=2) == [(0, 0x10, ["NOP", "BRA 0x0"])]
    # the costly instructions a loop holds: only those present, each counted
    assert sass.costly(["MEMBAR.ALL.GPU", "@!P0 MEMBAR.ALL.CTA", "MEMBAR.ALL.CTA", "FENCE.VIEW.ASYNC.S",
                        "CCTL.IVALL", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24"]) == {
        "MEMBAR.ALL.GPU": 1, "CCTL.IVALL": 1, "MEMBAR.ALL.CTA": 2, "FENCE.VIEW.ASYNC": 1}
    assert sass.costly(found[0][2]) == {}


def test_sass_compare_tells_identical_kernels_loops_and_differences(tmp_path, capsys):
    """bench/sass.py compare: per spec and kind of kernel, identical instructions, identical main
    loops (each function's longest loop) with other code changed, or a difference in a loop."""
    sass = load_script(REPO / "bench" / "sass.py", "attncc_bench_sass")

    def listing(prologue, loop_op):
        return "\n".join([
            "\t\tFunction : attncc_decode_kernel",
            f"        /*0000*/                   {prologue} ;",
            "        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;",
            f"        /*0020*/                   {loop_op} ;",
            "        /*0030*/              @P1 BRA 0x10 ;",
            "        /*0040*/                   EXIT ;",
            "\t\tFunction : attncc_combine_kernel",
            "        /*0000*/                   NOP ;",
            "        /*0010*/                   EXIT ;",
        ])

    for side, (prologue, op) in {"a": ("MOV R1, R2", "FMUL R3, R4, R5"), "b": ("MOV R1, R6", "FMUL R3, R4, R5")}.items():
        (tmp_path / side).mkdir()
        (tmp_path / side / "one-sm90a.sass").write_text(listing(prologue, op))
        (tmp_path / side / "two-sm90a.sass").write_text(listing("MOV R1, R2", op if side == "a" else "FADD R3, R4, R5"))
    assert sass.compare(tmp_path / "a", tmp_path / "b") == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["one-sm90a decode: differs outside its main loops",
                   "two-sm90a decode: DIFFERS (5 vs 5 instructions)",
                   "2 kernels identical, 1 with identical main loops, 1 different"]
    assert sass.compare(tmp_path / "a", tmp_path / "a") == 0
