"""Build random accepted specs on every kernel family that takes them (nvcc; no GPU).

    python3 bench/build_fuzz.py [--seed 1] [--count 40] [--out /tmp/attncc_fuzz] [--family hopper]

Draws `count` specs over the language's space (MLA, GLA, GTA, GQA and MQA shapes; bf16, fp16,
e4m3 and e5m2 with scale groups of 32 to 512; packed and separate caches; pages 1 to 256; s_q
1 to 8, causal or not; sparse top-k; the schedule knobs), and for each (spec, family) pair the
lowering accepts, renders and builds the plan for sm_90a with the JIT's checks (no spills, no
stack frame, no serialized wgmma: attncc/build.py). Prints one line a pair and, at the end, the
pairs the build refused: each is a spec the lowering promised and the JIT would refuse, a bug of
the lowering's register rules (bench/RESULTS.md, session 28). Specs no family takes are listed
with the refusal a user would see, to read for clarity. The specs are written under `out`
(fzN.attn) so that a failure can be rebuilt with `attncc compile SPEC --arch sm90a`."""
from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attncc.build import BuildError, compile_source  # noqa: E402
from attncc.errors import SpecError  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.lower import lower  # noqa: E402
from attncc.testing import families_of  # noqa: E402


def spec_text(rng: random.Random, name: str) -> str:
    """One random spec (attention block and, sometimes, a schedule)."""
    pick = rng.choice
    kind = pick(("gqa", "mqa", "gta", "gla", "gla_fp8", "mla", "mla", "mla_fp8", "mla_fp8"))
    elem = "bf16" if kind.endswith("fp8") else pick(("bf16", "bf16", "fp16"))
    fp8 = f"{pick(('e4m3', 'e5m2'))}"
    if kind in ("gqa", "mqa"):
        kv = 1 if kind == "mqa" else pick((2, 4, 8))
        group = pick((1, 4, 16, 32, 64, 128))
        dk = pick((64, 96, 128, 192, 256))
        dv = dk if rng.random() < 0.8 else pick((64, 128, 256))
        segs, key, value = f"k: {elem}[{dk}]  v: {elem}[{dv}]", "k", "v"
    elif kind == "gta":
        kv, group, d = pick((1, 2, 4, 8)), pick((4, 16, 64)), pick((128, 256))
        rope = pick((32, 64, d // 2))
        segs, key, value = f"tied: {elem}[{d}]  rope: {elem}[{rope}] shared", f"tied[0:{d - rope}] ++ rope", "tied"
    elif kind.startswith("gla"):
        kv, group, width = pick((2, 4, 8)), pick((16, 64, 96, 128)), pick((128, 256, 512))
        lat = f"{fp8}[{width}] scale fp32 per {pick((32, 64, 128))}" if kind == "gla_fp8" else f"{elem}[{width}]"
        segs, key, value = f"latent: {lat}  rope: {elem}[{pick((32, 64))}] shared", "latent ++ rope", "latent"
    else:
        kv, group = 1, pick((8, 16, 32, 64, 128, 192, 256))
        lat = f"{fp8}[512] scale fp32 per {pick((32, 64, 128, 256, 512))}" if kind == "mla_fp8" else f"{elem}[512]"
        segs, key, value = f"latent: {lat}  rope: {elem}[64]", "latent ++ rope", "latent"
    sq = pick((1, 1, 2, 3, 4, 8))
    causal = sq > 1 and rng.random() < 0.6
    topk = kind.startswith("mla") and rng.random() < 0.35
    lines = [f"attention {name} {{", f"    heads q = {kv * group}, kv = {kv}",
             f"    cache paged({pick((1, 3, 7, 16, 32, 64, 128, 256))}){' separate' if rng.random() < 0.3 else ''} "
             f"{{ {segs} }}", f"    key = {key}", f"    value = {value}"]
    if topk:
        lines.append(f"    tokens topk {pick((64, 200, 512, 2048))}")
    lines += [f"    query len <= {sq}{' causal' if causal and not topk else ''}", "}"]
    knob = rng.random()
    knobs = (["seesaw"] if knob < 0.1 else [f"stages {pick((2, 3, 4))}"] if knob < 0.2 else
             [f"split_kv {pick(('off', 2, 5))}"] if knob < 0.3 else ["crossover"] if knob < 0.35 and topk else [])
    if knobs:
        lines += [f"schedule {name} {{"] + [f"    {k}" for k in knobs] + ["}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("/tmp/attncc_fuzz"))
    ap.add_argument("--family", help="build only this family's plans")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    refused, unsupported, built = [], [], 0
    for i in range(args.count):
        path = args.out / f"fz{i}.attn"
        path.write_text(spec_text(rng, f"fz{i}"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a tolerated knob's "not yet applied"
            try:
                spec = check_spec(path)
                families = families_of(path)
                if not families:
                    lower(spec)  # raises what a user reads
            except SpecError as exc:
                unsupported.append(f"{path}: {str(exc).splitlines()[0]}")
                continue
            for family in families:
                if args.family and family != args.family:
                    continue
                start = time.time()
                directory = args.out / f"{path.stem}_{family}"
                directory.mkdir(exist_ok=True)
                try:
                    compile_source(lower(spec, family), directory, "sm90a", progress=False)
                    built += 1
                    status = "ok"
                except BuildError as exc:
                    refused.append(f"{path} ({family}): {str(exc).splitlines()[0]}")
                    status = "REFUSED"
                print(f"{path.name} {family}: {status} ({time.time() - start:.0f} s)", flush=True)
    print(f"\n{built} built, {len(refused)} refused by the build, {len(unsupported)} specs no family takes")
    for line in unsupported:
        print(f"  no family: {line}")
    for line in refused:
        print(f"  REFUSED: {line}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
