"""examples/tp_decode.py: GLA tensor parallel over two processes (gloo, CPU) gives the
single-process result of the whole layer; so does MLA, replicated. On two GPUs (NCCL) the
same check runs under pytest -m gpu where two are present."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import load_example

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tp_decode.py"

WORKER = """
import os, sys, torch
import torch.distributed as dist
sys.path.insert(0, {examples!r})
import tp_decode
layout, out, device, store = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
# a file rendezvous: no TCP port to pick (a free port found, released, then taken by another
# process made this test flaky)
dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method=f"file://{{store}}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank, world = dist.get_rank(), dist.get_world_size()
if device == "cuda":
    torch.cuda.set_device(rank)
    device = f"cuda:{{rank}}"
s = tp_decode.shape_for(layout, tiny=device == "cpu")
x = tp_decode.decode(s, layers=2, batch=3, context=11, steps=2, s_q=2, rank=rank, world=world, device=device)
torch.save(x.float().cpu(), f"{{out}}.{{rank}}")
# both ranks past their last collective before either tears its group down: a rank destroying
# its gloo group while the peer's background thread still talked to it aborted the peer once
# ("terminate called without an active exception", CI on 354714f)
dist.barrier()
dist.destroy_process_group()
"""


def load():
    return load_example("tp_decode")


def run_ranks(tmp_path, layout: str, world: int, device: str = "cpu") -> list[torch.Tensor]:
    script = tmp_path / "tp_worker.py"
    script.write_text(WORKER.format(examples=str(ROOT / "examples")))
    out = tmp_path / f"{layout}_{world}"
    store = tmp_path / f"{layout}_{world}.store"  # the rendezvous file: fresh for each run
    env = dict(os.environ, WORLD_SIZE=str(world),
               NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    procs = [subprocess.Popen([sys.executable, str(script), layout, str(out), device, str(store)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    return [torch.load(f"{out}.{r}") for r in range(world)]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("layout", ["gla2", "mla"])
def test_two_ranks_give_the_single_process_result(tmp_path, layout):
    whole, = run_ranks(tmp_path, layout, 1)
    ranks = run_ranks(tmp_path, layout, 2)
    assert torch.equal(ranks[0], ranks[1]), "every rank holds the all-reduced state"
    assert torch.isfinite(whole).all()
    assert rel(ranks[0], whole) < 2e-2, rel(ranks[0], whole)  # bf16 partial sums, reduced in fp32


def test_a_rank_caches_its_share_of_the_latent_heads():
    m = load()
    gla, mla = m.shape_for("gla2", tiny=True), m.shape_for("mla", tiny=True)
    assert gla.local(2) == (2, 1) and gla.local(1) == (4, 2)
    assert mla.local(2) == (2, 1) and mla.local(1) == (4, 1)  # replicated
    for world in (1, 2):
        g = m.TPAttention(gla, 1, 2, 8, 1, 0, world, "cpu")
        ml = m.TPAttention(mla, 1, 2, 8, 1, 0, world, "cpu")
        assert g.k.spec.heads_kv == 2 // world and ml.k.spec.heads_kv == 1
        per_token_gla = (2 // world) * gla.latent * 2 + gla.rope * 2
        assert g.k.spec.record_bytes == per_token_gla
        assert ml.k.spec.record_bytes == mla.latent * 2 + mla.rope * 2
    with pytest.raises(ValueError, match="latent heads do not split over 4 ranks"):
        m.shape_for("gla2", tiny=True).local(4)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("layout", ["gla2", "mla"])
def test_two_gpus_give_the_single_gpu_result(tmp_path, layout):
    whole, = run_ranks(tmp_path, layout, 1, "cuda")
    ranks = run_ranks(tmp_path, layout, 2, "cuda")
    assert torch.equal(ranks[0], ranks[1])
    assert rel(ranks[0], whole) < 2e-2
