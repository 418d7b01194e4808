"""compute-sanitizer over every example and the GPU test grid's specs, at small sizes (GPU).

    python3 bench/sanitize.py [--tools memcheck,racecheck,synccheck,initcheck] [--specs a,b]
                              [--log DIR] [--print-limit N] [--quick] [--jobs N]

(--specs mla_page1_h128:producer_fences=true: a spec's plan with a kernel-config choice the
lowering did not take; without --specs every spec and every choice of tests/support.py's CHOICES.)

For each tool, one process under `compute-sanitizer --tool T` (only attncc's kernels are
instrumented) runs every spec on a few small cases: split mode and part mode, lengths
0, 1, P, P + 1 and a few tiles, every s_q, NaN in the unused pages, each checked against the
reference, and write_cache's kernel on a few tokens. Prints one line per tool with the sanitizer's summary, and exits non-zero if any
tool reports an error or hazard, or a case is wrong. Keep it for every kernel change.
The libraries are built (outside the sanitizer) first. initcheck, with its host-API checks on,
did not finish GLA-2's 6 cases in 100 s (racecheck runs all 21 specs in 56 s) and reported only
torch's own copies; it now checks kernel accesses only, and --quick runs 2 cases a spec. With
the API checks off, initcheck reported reads of cache pages that torch had filled (fill_ of a
uint8 view) and the test had written, with correct results (H200, session 8). Rewriting them
with a kernel (add_ of 0) did not help (session 9): with the kernel filter, initcheck tracks no
write by torch's kernels. So for initcheck the worker rewrites every input from a host copy
(--host-init: a cudaMemcpy, which it tracks) before the launch; the workspace and outputs
are written by attncc's own kernels, which it instruments."""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


def _specs(names):
    """name -> spec text. A name may carry kernel-config choices the lowering did not take,
    `spec[~seesaw]:FIELD=VALUE[:FIELD=VALUE]` (attncc.testing.with_config; ~seesaw: a relay plan's
    seesaw form), run as that plan; the default is every spec and every choice of
    tests/support.py's CHOICES."""
    from specs import all_specs
    from support import CHOICES

    specs = all_specs()
    if not names:
        names = list(specs) + [f"{n}:{c}" for n, c in CHOICES]
    return {n: specs[n.split(":")[0].split("~")[0]] for n in names}


def _op(name, k):
    """The op `name` runs: the spec's own, or its plan (or form) with the name's choices (a build of its own)."""
    from attncc import testing
    from attncc.ops import op_for
    from support import form_of

    base, *choices = name.split(":")
    if "~" not in base and not choices:
        return k.op
    tag = "_" + "_".join(c.replace("=", "_") for c in [base.partition("~")[2], *choices] if c)
    return op_for(k.spec, testing.with_config(form_of(k.plan, base), choices), tag)


def _rewrite_by_copy(*tensors) -> None:
    """Write every byte of each tensor (or dict of tensors) again, with the value it has, by a
    host-to-device copy: with the kernel filter (kns=attncc), initcheck tracks no write by
    torch's kernels (a fill, an index_put), but it tracks a cudaMemcpy."""
    for t in tensors:
        for u in (t.values() if isinstance(t, dict) else (t,) if t is not None else ()):
            u.copy_(u.cpu())


def _extents(case) -> str:
    """Each input's device address range (to place an initcheck report's address)."""
    named = {"q": case.q, "block_table": case.block_table, "seqlens": case.seqlens, "indices": case.indices}
    cache = case.cache if isinstance(case.cache, dict) else {"cache": case.cache}
    named.update({f"cache[{n}]": t for n, t in cache.items()})
    return " ".join(f"{n}=[{t.data_ptr():#x},{t.data_ptr() + t.numel() * t.element_size():#x})"
                    for n, t in named.items() if t is not None)


def worker(names, quick: bool = False, host_init: bool = False) -> int:
    """Run the small cases of every spec (under the sanitizer); non-zero on a wrong result.
    quick: only the largest s_q, in 2 splits and in 3 parts (initcheck is slow). host_init:
    inputs rewritten by a host copy first (initcheck: see the module's docstring)."""
    import torch

    import attncc
    from attncc import testing
    from attncc.ops import cache_list

    failed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels = {n: attncc.compile(t) for n, t in _specs(names).items()}
    for name, k in kernels.items():
        start = time.perf_counter()
        spec = k.spec
        P = spec.page_size
        lengths = [0, 1, P, P + 1, 3 * P + 5] if not spec.sparse else [1, 1]
        for s_q in range(spec.max_query_len if quick else 1, spec.max_query_len + 1):
            for splits in (2, -3) if quick else (0, 2, -3):  # the launch's choice, 2 splits, 3 parts
                case = testing.random_case(spec, lengths, s_q, seed=7 * s_q + splits)
                if host_init:
                    _rewrite_by_copy(case.q, case.cache, case.block_table, case.seqlens, case.indices)
                    print(f"inputs of {name} s_q={s_q} splits={splits}: {_extents(case)}", flush=True)
                out, lse = _op(name, k)(case.q, cache_list(spec, case.cache), case.block_table, case.seqlens,
                                case.indices, spec.softmax_scale, splits)
                torch.cuda.synchronize()
                result = testing.compare(spec, case, out, lse)
                if not result.ok:
                    failed += 1
                    print(f"WRONG {name} s_q={s_q} splits={splits}: {result}", flush=True)
            if ":" not in name and "~" not in name:  # the spec's own plan: the step's schedule (k.plan(seqlens) on the device)
                failed += _schedule_case(name, k, lengths, s_q, host_init)
        failed += _write_case(name, k, host_init)
        print(f"case {name}: done in {time.perf_counter() - start:.1f} s", flush=True)
    return 1 if failed else 0


def _schedule_case(name, k, lengths, s_q: int, host_init: bool) -> int:
    """A call reading the step's schedule (core/plan.cuh: each CTA loads its part's line) and one
    given a schedule of other lengths (refused by its key: the CTAs cut their own, and the flag
    is set); 1 on a wrong result."""
    import torch

    from attncc import testing

    spec = k.spec
    case = testing.random_case(spec, lengths, s_q, seed=11 * s_q)
    if host_init:
        _rewrite_by_copy(case.q, case.cache, case.block_table, case.seqlens, case.indices)
    on_device = case.seqlens if case.seqlens is not None else torch.zeros(len(lengths), dtype=torch.int32, device="cuda")
    failed = 0
    for label, meta in (("schedule", k.plan(on_device, s_q=s_q)), ("stale schedule", k.plan(on_device + 700, s_q=s_q))):
        out, lse = k(case.q, case.cache, case.block_table, case.seqlens, indices=case.indices, metadata=meta)
        torch.cuda.synchronize()
        result = testing.compare(spec, case, out, lse)
        if not result.ok:
            failed = 1
            print(f"WRONG {name} s_q={s_q} {label}: {result}", flush=True)
    try:
        k.check()  # the stale schedule's flag (a dense plan's; sparse lines depend on no length)
    except ValueError:
        pass
    return failed


def _write_case(name, k, host_init: bool) -> int:
    """write_cache's kernel on a few tokens, padding and an out-of-range slot among them, against
    the contract's bytes (storage.write on CPU); 1 if they differ."""
    import torch

    from attncc import storage, testing

    spec, P = k.spec, k.spec.page_size
    cache = k.new_cache(3)
    slots = torch.tensor([0, -1, 3 * P - 1, 3 * P, P], device="cuda")  # distinct at any P
    gen = torch.Generator(device="cuda").manual_seed(11)
    values = {s.name: torch.randn(5, *(() if s.shared else (spec.heads_kv,)), s.dim, device="cuda", generator=gen)
              for s in spec.segments}
    if host_init:
        _rewrite_by_copy(*storage.cache_tensors(cache).values(), slots, *values.values())
    want = testing.written_as_contract(spec, cache, slots, values)
    k.write_cache(cache, slots, **values)
    torch.cuda.synchronize()
    try:
        k.check()
        flagged = False
    except ValueError:
        flagged = True
    got = storage.cache_tensors(cache)
    if not flagged or any(not torch.equal(got[n].cpu().view(torch.uint8), w.view(torch.uint8)) for n, w in want.items()):
        print(f"WRONG {name} write_cache (flagged: {flagged})", flush=True)
        return 1
    return 0


def build(names) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import attncc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels = {n: attncc.compile(t) for n, t in _specs(names).items()}
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda item: _op(*item).library(), kernels.items()))


SUMMARY = re.compile(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: \d+ hazards? displayed.*)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--specs", default="", help="comma-separated names (default: all), each NAME[:FIELD=VALUE...]")
    ap.add_argument("--log", default=None, help="directory for each tool's full log")
    ap.add_argument("--print-limit", type=int, default=20, help="reports printed per tool")
    ap.add_argument("--quick", action="store_true", help="fewer cases a spec (largest s_q; 2 splits, 3 parts)")
    ap.add_argument("--jobs", type=int, default=1, help="sanitizer processes side by side, each a share of the specs")
    ap.add_argument("--deadline", type=float, default=0, help="seconds a tool may run (then its processes are "
                    "stopped and it is reported unfinished); 0: no limit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--host-init", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [n for n in args.specs.split(",") if n]
    if args.worker:
        return worker(names, args.quick, args.host_init)
    build(names)
    # each tool's log, written as it runs, so a run cut short (initcheck is slow) leaves what it found
    log_dir = Path(args.log) if args.log else Path(tempfile.mkdtemp())
    log_dir.mkdir(parents=True, exist_ok=True)
    bad = 0
    names = list(_specs(names))
    jobs = max(1, min(args.jobs, len(names)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (timeout's) stop: the finally below stops the tools
    for tool in args.tools.split(","):
        cmd = ["compute-sanitizer", "--tool", tool, "--kernel-name", "kns=attncc", "--error-exitcode", "3",
               "--print-limit", str(args.print_limit)]
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        if tool == "initcheck":
            # the API checks report torch's own device copies (H200, torch 2.11: `.any()` copies a
            # partly written scratch byte), thousands of reports before the first spec: kernels only
            cmd += ["--check-api-memory-access", "no"]
        cmd += [sys.executable, str(Path(__file__).resolve()), "--worker"]
        cmd += (["--quick"] if args.quick else []) + (["--host-init"] if tool == "initcheck" else [])
        # `jobs` processes side by side, each a share of the specs (the sanitizer is host-bound)
        logs = [log_dir / (f"sanitize_{tool}.log" if jobs == 1 else f"sanitize_{tool}_{j}.log") for j in range(jobs)]
        procs, start, unfinished = [], time.monotonic(), False
        try:
            for j, log in enumerate(logs):
                with open(log, "w") as sink:
                    procs.append(subprocess.Popen(cmd + ["--specs", ",".join(names[j::jobs])], stdout=sink,
                                                  stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                                  start_new_session=True))  # a group: stopped with its target
            for proc in procs:
                left = args.deadline - (time.monotonic() - start) if args.deadline else None
                try:
                    proc.wait(timeout=max(left, 0.1) if left is not None else None)
                except subprocess.TimeoutExpired:
                    unfinished = True
                    break
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        codes = [proc.returncode for proc in procs]
        text = "\n".join(log.read_text() for log in logs)
        returncode = max(codes, key=abs)
        summary = "; ".join(dict.fromkeys(SUMMARY.findall(text))) or "no summary"
        wrong = text.count("WRONG ")
        done = text.count("case ")
        ok = returncode == 0 and not wrong and not unfinished
        bad += not ok
        verdict = "clean" if ok else f"UNFINISHED after {args.deadline:.0f} s" if unfinished else "FAILED"
        print(f"{tool:<10} {verdict} (exit {returncode}; {summary}; {done} of {len(names)} specs run, "
              f"{wrong} wrong results)", flush=True)
        if not ok:
            print("\n".join(text.splitlines()[-40:]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
