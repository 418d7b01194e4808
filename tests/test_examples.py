"""examples/deepseek_decode.py: a DeepSeek-V3-shaped decode step through attncc.

On CPU, tiny sizes through the reference, checked against the same step with K and V
decompressed (no absorption) in float32. On a GPU (pytest -m gpu): V3 shapes, eager steps
and CUDA-graph replays of one captured step agree."""
from __future__ import annotations

import pytest
import torch

from support import load_example



def load():
    return load_example("deepseek_decode")


def test_cpu_steps_match_decompressed_mla():
    lines = []
    results, times = load().run("cpu", out=lines.append)  # asserts the rel. error itself
    assert any(line.startswith("absorbed MLA through attncc vs decompressed MLA") for line in lines)
    assert torch.isfinite(results["eager"].float()).all() and len(times["eager"]) == 3


def test_rope_rotates_by_position():
    m = load()
    x = torch.randn(2, 3, 8)
    assert torch.allclose(m.rope(x, torch.zeros(2, dtype=torch.long)), x)
    rotated = m.rope(x, torch.tensor([1, 5]))
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_eager_and_graph_steps_agree_on_cuda():
    lines = []
    results, _ = load().run("cuda", layers=2, batch=4, context=300, steps=3, out=lines.append)
    eager, graph = results["eager"].float(), results["graph"].float()
    assert torch.isfinite(eager).all()
    assert ((graph - eager).norm() / eager.norm()).item() < 1e-5, lines
