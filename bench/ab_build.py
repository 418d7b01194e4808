"""Build the libraries bench/ab.py compares, from one checkout of attncc (CPU, nvcc).

    python3 bench/ab_build.py REPO TAG OUTDIR      # e.g. a worktree of c98427d as `old`, . as `new`

writes OUTDIR/TAG_mla.so (MLA h_q 128), TAG_mla_h64.so, TAG_mla_h16.so, TAG_gla2.so (GLA-2
h_q 128) and TAG_gla2_seesaw.so (the same with `seesaw`, where REPO has that file), each built by REPO's own lowering and templates; carry OUTDIR to the device."""
import shutil
import sys
import warnings
from pathlib import Path

repo, tag, out_dir = Path(sys.argv[1]).resolve(), sys.argv[2], Path(sys.argv[3]).resolve()
sys.path.insert(0, str(repo))
warnings.simplefilter("ignore")

from attncc import bench  # noqa: E402
from attncc.build import compile_source  # noqa: E402
from attncc.frontend import check_spec  # noqa: E402
from attncc.kernel import Kernel  # noqa: E402

CONFIGS = (("mla", "examples/mla.attn", 128, 64), ("mla_h64", "examples/mla.attn", 64, 64),
           ("mla_h16", "examples/mla.attn", 16, 64), ("gla2", "examples/gla2.attn", 128, 64),
           ("gla2_seesaw", "bench/gla2_seesaw.attn", 128, 64))
out_dir.mkdir(parents=True, exist_ok=True)
for name, path, heads, page in CONFIGS:
    if not (repo / path).exists():
        continue
    spec = bench.variant(check_spec(repo / path), heads, page)
    build_dir = out_dir / f"build_{tag}_{name}"
    library, kernels, _ = compile_source(Kernel(spec).plan, build_dir, progress=False)
    shutil.copy(library, out_dir / f"{tag}_{name}.so")
    shutil.rmtree(build_dir)
    print(tag, name, [(k.function.split("(")[0].split("::")[-1], k.registers) for k in kernels])
