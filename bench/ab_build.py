"""Build the libraries bench/ab.py compares, from one checkout of attncc (CPU, nvcc).

    python3 bench/ab_build.py REPO TAG OUTDIR [--config FIELD=VALUE ...] [--only NAME,...]

e.g. a worktree of c98427d as `old` and . as `new`, or . twice, once with a kernel-config
choice the lowering does not take (`--config skip_unmoved=true`, attncc.testing.with_config; a
configuration whose family's config lacks the field is built as lowered, and says so), or on
another kernel family than the lowering's (`--family mma_sync`).
Writes OUTDIR/TAG_mla.so (MLA h_q 128), TAG_mla_h64.so, TAG_mla_h16.so, TAG_mla_h16_p1.so, TAG_mla_p1.so (page 1), TAG_mla_h64_p1.so, TAG_mla_p8.so, TAG_mla_p16.so, TAG_mla_p32.so,
TAG_gla2.so (GLA-2 h_q 128), TAG_gla2_p1.so, TAG_gla2_p16.so, TAG_gla2_seesaw.so (the same with `seesaw`) and
TAG_sparse_fp8{,_h64}.so (bench/sparse_fp8.attn), TAG_mqa256{,_h64,_p1}.so (bench/mqa256.attn at h_q 128, 64;
page 1), TAG_mqa_h128.so (examples/mqa.attn at h_q 128, page 16), those whose spec REPO has, each built
by REPO's own lowering and templates, and beside each TAG_name.json (the spec, h_q, page size
and overrides it was built with, which bench/ab.py checks); carry OUTDIR to the device."""
import argparse
import dataclasses
import json
import shutil
import sys
import warnings
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("repo", type=Path)
ap.add_argument("tag")
ap.add_argument("out_dir", type=Path)
ap.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE")
ap.add_argument("--only", help="the configurations to build (names below), comma-separated")
ap.add_argument("--family", help="build each on this kernel family, not the lowering's choice (an A/B of two "
                "families; bench/ab.py drives it with that family's plan)")
args = ap.parse_args()
repo, tag, out_dir = args.repo.resolve(), args.tag, args.out_dir.resolve()
sys.path.insert(0, str(repo))
warnings.simplefilter("ignore")

from attncc import bench, testing  # noqa: E402
from attncc.build import compile_source  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402


def any_family_field(name: str) -> bool:
    """Whether some family's kernel config has the field (imported here: REPO may predate them)."""
    from attncc.families.hopper import HopperConfig
    from attncc.families.mma_sync import MmaSyncConfig

    return any(name == f.name for cls in (HopperConfig, MmaSyncConfig) for f in dataclasses.fields(cls))


CONFIGS = (("mla", "examples/mla.attn", 128, 64), ("mla_h64", "examples/mla.attn", 64, 64),
           ("mla_h16", "examples/mla.attn", 16, 64), ("mla_h16_p1", "examples/mla.attn", 16, 1),
           ("mla_p1", "examples/mla.attn", 128, 1), ("mla_h64_p1", "examples/mla.attn", 64, 1),
           ("mla_p8", "examples/mla.attn", 128, 8),
           ("mla_p16", "examples/mla.attn", 128, 16), ("mla_p32", "examples/mla.attn", 128, 32),
           ("gla2", "examples/gla2.attn", 128, 64), ("gla2_p1", "examples/gla2.attn", 128, 1),
           ("gla2_p16", "examples/gla2.attn", 128, 16),
           ("gla2_seesaw", "bench/gla2_seesaw.attn", 128, 64),
           ("sparse_fp8", "bench/sparse_fp8.attn", 128, 64), ("sparse_fp8_h64", "bench/sparse_fp8.attn", 64, 64),
           ("mqa256", "bench/mqa256.attn", 128, 64), ("mqa256_h64", "bench/mqa256.attn", 64, 64),
           ("mqa256_p1", "bench/mqa256.attn", 128, 1), ("mqa_h128", "examples/mqa.attn", 128, 16))
out_dir.mkdir(parents=True, exist_ok=True)
for name, path, heads, page in CONFIGS:
    if not (repo / path).exists() or (args.only and name not in args.only.split(",")):
        continue
    spec = bench.variant(check_spec(repo / path), heads, page)
    plan = Kernel(spec, args.family).plan
    fields = {f.name for f in dataclasses.fields(plan.config)}
    missing = [c for c in args.config if c.partition("=")[0] not in fields]
    if unknown := [c for c in missing if not any_family_field(c.partition("=")[0])]:
        raise SystemExit(f"--config {', '.join(unknown)}: a field of no family's kernel config")
    if missing:
        print(tag, name, f"({plan.family}: no {', '.join(missing)}; built as lowered)")
    applied = [c for c in args.config if c not in missing]
    plan = testing.with_config(plan, applied)
    build_dir = out_dir / f"build_{tag}_{name}"
    library, kernels, _ = compile_source(plan, build_dir, progress=False)
    shutil.copy(library, out_dir / f"{tag}_{name}.so")
    # what the library is a build of, for bench/ab.py's check (it drives the spec at these values)
    (out_dir / f"{tag}_{name}.json").write_text(json.dumps(
        {"spec": path, "heads_q": heads, "page_size": page, "config": applied, "family": plan.family}))
    shutil.rmtree(build_dir)
    print(tag, name, [(k.function.split("(")[0].split("::")[-1], k.registers) for k in kernels])
