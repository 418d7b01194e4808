"""The build (attncc/build.py) on a machine with nvcc and no GPU.

(a) nvcc compile-only of every example (sm_90a and sm_80), of the extra grid of
    tests/specs.py and of each grid spec on its other families (the GPU suite's name@family
    pairs, whose session fixture builds them all): both kernels present, no spills, no stack,
    <= 255 registers, and the library's exported shared-memory size equal to the plan's;
(d) a failing build's BuildError (nvcc text, the generated source, a repro command);
(e) the progress line on stderr.
The cache of built libraries (keys, entries, locking) is tests/test_cache.py."""
from __future__ import annotations

import ctypes
import re
import shlex
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest

import attncc
import attncc.build
import attncc.render
import attncc.resources
from attncc.build import BuildError, compile_source
from attncc.split import ctas_per_split
from attncc.testing import families_of, on_family, with_config

from specs import EXTRA, all_specs, without_crossover
from support import CHOICES, combine_slabs, compile_quiet, form_of, have_nvcc, load_script

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.attn"))




pytestmark = pytest.mark.skipif(not have_nvcc(), reason="nvcc not found (CUDA toolkit needed)")

ARCH_CODE = {"sm90a": "sm_90a", "sm80": "sm_80"}




def plan_of(name: str):
    return compile_quiet(REPO / "examples" / f"{name}.attn").plan


def sm80(text: str) -> str:
    """An attention block of tests/specs.py with a `target sm80` schedule."""
    name = re.search(r"attention (\w+)", text)[1]
    return text + f"\nschedule {name} {{\n    target sm80\n}}\n"


SMALL = EXTRA["gqa4_d64"]  # the fastest compile of the grid


def small_plan():
    return compile_quiet(SMALL).plan


# --- (a) compile-only ------------------------------------------------------------------

CASES = ([(f"example:{n}", arch) for n in EXAMPLES for arch in ("sm90a", "sm80")]
         + [(f"extra:{n}", "sm90a") for n in EXTRA]
         + [(f"also:{n}@{fam}", "sm90a") for n, text in all_specs().items()
            for fam in families_of(text)[1:]]
         + [(f"sm80:{n}", None) for n in ("gqa4_d64", "mla_fp8_per64", "gla2_separate_fp16",
                                          "mla_page1")]
         # the choices the lowering does not take yet (support.CHOICES): built with the same checks, so
         # that a header change that makes one spill fails here, not on the device
         + [(f"choice:{n}:{c}", None) for n, c in CHOICES])


def case_plan(case: str):
    kind, name = case.split(":", 1)
    if kind == "choice":
        name, _, choice = name.partition(":")
        return with_config(form_of(compile_quiet(all_specs()[name.split("~")[0]]).plan, name), choice.split(":"))
    if kind == "example":
        return plan_of(name)
    if kind == "extra":
        return compile_quiet(EXTRA[name]).plan
    if kind == "also":
        name, family = name.split("@")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a tolerated knob's "not yet applied"
            return on_family(all_specs()[name], family).plan
    plan = compile_quiet(sm80(EXTRA[name])).plan
    assert plan.target == "sm80"
    return plan


@pytest.mark.parametrize("case, arch", CASES, ids=[f"{c}-{a or 'target'}" for c, a in CASES])
def test_compiles_without_spills(tmp_path, case, arch):
    plan = case_plan(case)
    if arch and arch not in attncc.families.by_name(plan.family).targets:
        # an sm90a-only family's example is built for sm80 as the family sm80 runs it on (without
        # `crossover`, a Hopper schedule that family refuses)
        name = case.split(":")[1]
        source = without_crossover((REPO / "examples" / f"{name}.attn").read_text(), name)
        plan = compile_quiet(source, family="mma_sync").plan
    library, kernels, log = compile_source(plan, tmp_path, arch, progress=False)
    arch = arch or plan.target
    assert library.is_file() and library == tmp_path / attncc.build.LIBRARY
    assert f"for '{ARCH_CODE[arch]}'" in log, "compiled for the requested arch"
    assert (tmp_path / "ptxas.log").read_text() == log
    names = [k.function for k in kernels]
    decode = [k for k in kernels if "decode_kernel" in k.function]
    parts = [k for k in kernels if "decode_parts_kernel" in k.function]
    combine = [k for k in kernels if "combine_kernel" in k.function]
    write = [k for k in kernels if "write_cache_kernel" in k.function]
    schedule = [k for k in kernels if "plan_schedule_kernel" in k.function]  # k.plan(seqlens)'s (core/plan.cuh)
    # each decode kernel twice: for any cache strides, and for contiguous caches (core/paging.cuh);
    # and all of them again in a plan's second form (hopper: value first for calls of few rows)
    forms = 2 if getattr(plan.config, "value_first_rows", 0) else 1
    contiguous = [k for k in decode + parts if "ContiguousCache" in k.function]
    second = [k for k in decode + parts if "ValueFirst<" in k.function]
    # the combine twice where a row has four slabs or more, an even number: a kernel of its own for
    # pairs of slabs (core/combine.cuh)
    combines = 2 if combine_slabs(plan.d_v)[1] else 1
    assert len(decode) == 2 * forms and len(parts) == 2 * forms and len(combine) == combines, names
    assert len(contiguous) == 2 * forms and len(second) == 4 * (forms - 1), names
    assert len(write) == 1 and len(schedule) == 1 and len(kernels) == 2 + combines + 4 * forms, names
    for k in decode + parts + combine + write + schedule:
        assert k.spill_stores == 0, f"{k.function}: {k.spill_stores} bytes spill stores\n{log}"
        assert k.spill_loads == 0, f"{k.function}: {k.spill_loads} bytes spill loads\n{log}"
        assert k.stack_bytes == 0, f"{k.function}: {k.stack_bytes} bytes stack\n{log}"
        assert 0 < k.registers <= 255
    # the C ABI of abi.h; the constants need no GPU to read
    lib = ctypes.CDLL(str(library))
    assert lib.attncc_smem_bytes() == plan.config.smem_bytes, "the library uses the plan's shared memory"
    assert lib.attncc_threads() == plan.config.threads
    for s_q in range(1, plan.max_sq + 1):  # the library's grid arithmetic is split.py's
        assert lib.attncc_ctas_per_split(s_q) == ctas_per_split(plan, s_q), s_q
    # the generated source is the rendered plan
    assert (tmp_path / f"{plan.name}.cu").read_text() == attncc.render.render(plan)
    # the clock trace (core/trace.cuh) is compiled out of every library attncc builds
    assert not hasattr(lib, "attncc_trace_read")


def test_clock_trace_builds_only_where_defined(tmp_path, monkeypatch):
    """bench/clock_trace.py's build of the seesaw: the trace points store %clock64 and the
    library exports the trace's readers; the same plan's PTX without ATTNCC_TRACE_CTA has none."""
    clock_trace = load_script(REPO / "bench" / "clock_trace.py", "attncc_bench_clock_trace")
    plan = plan_of("mla")
    assert plan.family == "hopper" and plan.config.seesaw
    library = clock_trace.build(plan, 3, tmp_path)
    lib = ctypes.CDLL(str(library))
    for reader in ("attncc_trace_read", "attncc_trace_read_span"):
        assert hasattr(lib, reader)
        # a buffer of another size than the array's is refused before any CUDA call (no GPU here)
        small = (ctypes.c_ulonglong * 8)()
        assert getattr(lib, reader)(small, ctypes.c_size_t(ctypes.sizeof(small))) == 1  # cudaErrorInvalidValue
        assert list(small) == [0] * 8
    assert hasattr(lib, "attncc_trace_clear")
    traced = (tmp_path / attncc.render.source_name(plan)).read_text()
    assert traced == "#define ATTNCC_TRACE_CTA 3\n" + attncc.render.render(plan)

    def ptx(source: str, name: str) -> str:
        path = tmp_path / name
        path.write_text(source)
        command = [attncc.build.nvcc(), "-std=c++17", "-O3", "-arch=sm_90a", "-ptx",
                   f"-I{attncc.build.INCLUDE_DIR}", str(path), "-o", str(path.with_suffix(".ptx"))]
        subprocess.run(command, check=True, capture_output=True)
        return path.with_suffix(".ptx").read_text()

    on, off = ptx(traced, "on.cu"), ptx(attncc.render.render(plan), "off.cu")
    # the consumers' and the producer's trace points, in each decode kernel's inlined copies
    assert "trace_clock" in on and on.count("%clock64") >= 20
    assert "trace_clock" not in off and "%clock64" not in off
    # every CTA's begin and end on the global timer (the grid's balance, the clock's rate)
    assert "trace_span" in on and on.count("%globaltimer") >= 2
    assert "trace_span" not in off and "%globaltimer" not in off
    # --build-dir: a directory holding the library of the same source is taken as it is (no
    # compile); another traced CTA's source is compiled afresh
    calls = []
    monkeypatch.setattr(clock_trace.subprocess, "run", lambda *a, **k: calls.append(a))
    assert clock_trace.build(plan, 3, tmp_path) == library and calls == []
    clock_trace.build(plan, 5, tmp_path)
    assert len(calls) == 1
    assert (tmp_path / attncc.render.source_name(plan)).read_text().startswith("#define ATTNCC_TRACE_CTA 5\n")


def test_clock_trace_report_of_a_known_trace(capsys):
    """clock_trace's tables from arrays laid out as core/trace.cuh's: 20 pairs 1,000 cycles apart
    in two pieces 2,000 cycles apart, 132 CTAs whose spans give a 2 GHz clock; the figures
    printed are the ones put in."""
    clock_trace = load_script(REPO / "bench" / "clock_trace.py", "attncc_bench_clock_trace")
    R, S, E, C = clock_trace.ROLES, clock_trace.SLOTS, clock_trace.EVENTS, clock_trace.CTAS
    flat, span = [0] * (R * S * E), [0] * (C * 4)
    at = lambda role, slot, event: (role * S + slot) * E + event  # noqa: E731
    t0 = 10_000
    start = [t0 + 1000 * i + (2000 if i >= 10 else 0) for i in range(20)]  # each pair's first event
    for i in range(20):
        for role in (0, 1):
            for e in range(E):
                flat[at(role, i, e)] = start[i] + 100 * e + role
        for half in (0, 1):
            for e in range(E):
                flat[at(2, 2 * i + half, e)] = start[i] + 90 * e + half
    # piece 0: pairs 0..9, piece 1: pairs 10..19; each begins 300 cycles before its first pair,
    # its Q lands 100 before, its results are written 250 after its last pair's last WG0 event
    for first, last in ((0, 9), (10, 19)):
        flat[at(3, first, 0)] = start[first] - 300
        flat[at(3, first, 1)] = start[first] - 100
        flat[at(3, first, 2)] = start[last] + 700 + 250
    # the CTA's start (the start's role, slot 0), cycles after its begin (t0 - 400 on its clock)
    for e, after in enumerate((287, 3320, 3421, 4493, 4538, 5100, 5300)):
        flat[at(clock_trace.START, 0, e)] = t0 - 400 + after
    for c in range(132):
        span[4 * c: 4 * c + 4] = [1_000_000 + c, 5, 1_000_000 + 20_000 + 10 * c, 5]
    span[4 * 7: 4 * 7 + 4] = [1_000_000, t0 - 400, 1_000_000 + 12_000, t0 - 400 + 24_000]
    clock_trace.report(flat, span, 7, True, "known")
    out = capsys.readouterr().out
    assert "CTA 7, 20 pairs, 16 steady" in out  # all but the first and last two
    assert "period (WG0's pair to pair)    1000" in out
    assert "132 CTAs" in out and "SM clock 2.000 GHz" in out
    assert "24000 cycles begin to end; 20 pairs x the steady period = 20000 (83.3%)" in out
    assert "2 pieces ([0, 10] their first pairs): the CTA's begin -> the first piece 100" in out
    assert "Q wait (piece begins -> Q landed) 400 in all, 200 median" in out
    assert "WG0's last event -> results written 500 in all" in out
    assert "results written -> the next piece begins 1750 in all" in out
    assert "the last results -> the CTA's end 1650" in out
    assert ("start, cycles from the CTA's begin: barriers 287 | walk started 3320 | CTA met 3421 | producer 4493, "
            "consumers 4538 past setmaxnreg | producer: piece 0's length read 5100, tile 0's page numbers read 5300 | "
            "tile 0: EMPTY wait 400, early passed 490, late passed 580, copies issued 670 | piece 0: Q issued 100, "
            "Q landed 300 | WG0's first S: boxes landed 500") in out
    spans = clock_trace.spans_ns(span)  # --spans: ns from the grid's first begin
    assert len(spans) == 132 and spans[0] == [0, 20_000] and spans[7] == [0, 12_000] and spans[131] == [131, 21_310]



def test_clock_trace_report_past_the_producers_slots(capsys):
    """A CTA of more pairs than half the slots (MLA b = 128 s_k 32768 s_q 2: ~1,000 pairs): the
    producer's tiles past the slots are not recorded, and its lines are of the pairs that were."""
    clock_trace = load_script(REPO / "bench" / "clock_trace.py", "attncc_bench_clock_trace")
    R, S, E, C = clock_trace.ROLES, clock_trace.SLOTS, clock_trace.EVENTS, clock_trace.CTAS
    flat, span = [0] * (R * S * E), [0] * (C * 4)
    at = lambda role, slot, event: (role * S + slot) * E + event  # noqa: E731
    pairs = S // 2 + 100
    for i in range(pairs):
        for role in (0, 1):
            for e in range(E):
                flat[at(role, i, e)] = 10_000 + 1000 * i + 100 * e + role
        for half in (0, 1):
            if 2 * i + half < S:
                for e in range(E):
                    flat[at(2, 2 * i + half, e)] = 10_000 + 1000 * i + 90 * e + half
    flat[at(3, 0, 0)], flat[at(3, 0, 1)], flat[at(3, 0, 2)] = 9_700, 9_900, 10_000 + 1000 * pairs
    for c in range(132):
        span[4 * c: 4 * c + 4] = [1_000_000 + c, 5, 2_000_000 + c, 5]
    span[4 * 7: 4 * 7 + 4] = [1_000_000, 9_000, 1_000_000 + 350_000, 9_000 + 700_000]
    clock_trace.report(flat, span, 7, True, "long")
    out = capsys.readouterr().out
    assert f"CTA 7, {pairs} pairs, {pairs - 4} steady" in out and "period (WG0's pair to pair)    1000" in out
    assert f"the {S // 2 - 3} steady pairs whose tiles fit the trace's {S} slots" in out
    assert "producer, tile a: " in out and "producer, tile b: " in out

def test_parse_ptxas_report():
    log = textwrap.dedent("""\
        ptxas info    : 0 bytes gmem
        ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
        ptxas info    : Function properties for _Z3fooPf
            8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
        ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'
        ptxas info    : Function properties for _Z3barv
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 8 registers, used 0 barriers, 380 bytes cmem[0]
        """)
    foo, bar = attncc.build.parse_ptxas(log)
    assert (foo.registers, foo.smem_bytes, foo.stack_bytes, foo.spill_stores, foo.spill_loads) == (
        40, 1024, 8, 4, 12)
    assert "foo" in foo.function
    assert (bar.registers, bar.smem_bytes, bar.stack_bytes, bar.spill_stores, bar.spill_loads) == (
        8, 0, 0, 0, 0)


# --- (d) a failing build ---------------------------------------------------------------

BROKEN = "attncc_test_broken_on_purpose"


def test_build_error_carries_nvcc_text_source_and_repro(tmp_path, monkeypatch):
    plan = small_plan()
    real_render = attncc.build.render
    monkeypatch.setattr(attncc.build, "render", lambda p: real_render(p) + f"\n#error {BROKEN}\n")
    with pytest.raises(BuildError) as info:
        compile_source(plan, tmp_path, progress=False)
    exc = info.value
    text = str(exc)
    assert BROKEN in text and "error" in text.lower()
    assert str(exc.source) in text and exc.source == tmp_path / f"{plan.name}.cu"
    assert exc.source.is_file() and BROKEN in exc.source.read_text()
    assert exc.repro in text and "nvcc" in exc.repro and str(exc.source) in exc.repro
    assert BROKEN in exc.log
    # the repro command reproduces the failure, from anywhere
    out = subprocess.run(shlex.split(exc.repro), cwd="/", capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and BROKEN in out.stdout + out.stderr


def test_build_error_for_missing_headers(tmp_path, monkeypatch):
    plan = small_plan()
    empty = tmp_path / "empty-include"
    empty.mkdir()
    monkeypatch.setattr(attncc.build, "INCLUDE_DIR", empty)
    with pytest.raises(BuildError) as info:
        compile_source(plan, tmp_path / "work", progress=False)
    text = str(info.value)
    assert "attncc/abi.h" in text and str(empty) in info.value.repro
    assert f"source: {tmp_path / 'work' / (plan.name + '.cu')}" in text
    assert "repro: " in text


STACK_KERNEL = """
extern "C" __global__ void attncc_test_stack(float* out, int i) {  // stored at run-time indices: local memory
  float local[256];
  for (int j = 0; j < 256; ++j) local[(j * i) & 255] = out[j];
  out[0] = local[i & 255];
}
"""


def test_a_build_with_a_stack_frame_is_refused(tmp_path, monkeypatch):
    plan = small_plan()
    real_render = attncc.build.render
    monkeypatch.setattr(attncc.build, "render", lambda p: real_render(p) + STACK_KERNEL)
    with pytest.raises(BuildError, match=r"is refused: attncc_test_stack: a \d+-byte stack frame") as info:
        compile_source(plan, tmp_path / "strict", progress=False)
    assert info.value.source.is_file() and "repro: " in str(info.value)
    _, kernels, log = compile_source(plan, tmp_path / "loose", progress=False, strict=False)  # attncc compile's table
    assert [p.split(":")[0] for p in attncc.build.unfit(kernels, log)] == ["attncc_test_stack"]


def test_spills_and_serialized_wgmma_make_a_build_unfit():
    R = attncc.build.KernelResources
    clean = R("ok", 100, 0, 0, 0, 0)
    assert attncc.build.unfit([clean], "ptxas info    : Used 100 registers") == []
    spilled = R("spiller", 255, 0, 0, 8, 16)
    warning = ("ptxas warning : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
               "serialized due to the presence of Extern calls in the function 'k'.")
    problems = attncc.build.unfit([clean, spilled], warning + "\n" + warning)
    assert problems == ["spiller: 8 bytes spill stores, 16 bytes spill loads", warning]
    assert attncc.build.unfit([], "ptxas warning : (C7511) wgmma.mma_async serialized") != []


# --- (e) progress ----------------------------------------------------------------------

def test_progress_line_on_stderr(tmp_path, capsys):
    plan = small_plan()
    compile_source(plan, tmp_path, progress=True)
    out, err = capsys.readouterr()
    assert "attncc: building" not in out
    lines = [line for line in re.split(r"[\r\n]", err) if line]
    assert lines[0].startswith(f"attncc: building {plan.name} for sm90a ... ")
    assert re.fullmatch(rf"attncc: building {plan.name} for sm90a \.\.\. \d+\.\ds done", lines[-1]), err
    assert float(re.search(r"(\d+\.\d)s done", lines[-1])[1]) > 0


def test_progress_line_reports_failure(tmp_path, capsys, monkeypatch):
    plan = small_plan()
    real_render = attncc.build.render
    monkeypatch.setattr(attncc.build, "render", lambda p: real_render(p) + f"\n#error {BROKEN}\n")
    with pytest.raises(BuildError):
        compile_source(plan, tmp_path, progress=True)
    err = capsys.readouterr().err
    assert re.search(rf"attncc: building {plan.name} for sm90a \.\.\. \d+\.\ds \(failed\)", err), err


def test_no_progress_when_disabled(tmp_path, capsys):
    compile_source(small_plan(), tmp_path, "sm80", progress=False)
    assert "attncc: building" not in capsys.readouterr().err


def test_crossover_barriers_are_cta_scope_and_its_consumers_do_not_fence(tmp_path):
    """The crossover plan's remote arrivals and waits at CTA scope (the cluster-scope forms compile
    to MEMBAR.ALL.GPU and an L1 invalidation, CCTL.IVALL, each time: hopper/cluster.cuh), and its
    consumers issuing no proxy fence for a crossover box: in the PTX of the sparse example (a
    crossover plan) no `.release.cluster` / `.acquire.cluster` mbarrier operation, remote arrivals
    present, and fewer proxy fences than the same spec without `crossover` issues where its
    consumers fence its 16-bit box (producer_fences off: the relay takes it on, which leaves the
    consumers no fence either)."""
    def ptx(text: str, *choices) -> str:
        plan = with_config(compile_quiet(text).plan, choices)
        source = tmp_path / f"{plan.name}_{plan.config.crossover}.cu"
        source.write_text(attncc.render.render(plan))
        out = source.with_suffix(".ptx")
        result = subprocess.run([str(attncc.build.nvcc()), "-std=c++17", "-ptx", "-gencode=arch=compute_90a,code=compute_90a",
                                 "-I", str(attncc.render.INCLUDE_DIR), str(source), "-o", str(out)],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        return out.read_text()

    text = (REPO / "examples" / "mla_fp8_sparse.attn").read_text()
    crossover = ptx(text)
    assert compile_quiet(text).plan.config.crossover
    assert "mbarrier.arrive.shared::cluster.b64" in crossover
    assert not re.search(r"mbarrier\.\S*(release|acquire)\.cluster", crossover)
    alone = ptx(without_crossover(text, "mla_fp8_sparse_alone"), "producer_fences=false")
    assert crossover.count("fence.proxy.async") < alone.count("fence.proxy.async")
