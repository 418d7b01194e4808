"""The attention of a DeepSeek-V3-shaped layer stack, decoding, on random weights.

    python examples/deepseek_decode.py                 # CUDA: V3 shapes, eager and CUDA graphs
    python examples/deepseek_decode.py --device cpu    # tiny sizes through the reference

Per layer and step (absorbed MLA, as FlashMLA and the serving engines run it):
    c_q   = rms(x W_dq)                       q low-rank            [b, 1536]
    q     = c_q W_uq -> q_nope [h, 128], q_pe [h, 64]; q_pe = rope(q_pe, pos)
    q_lat = q_nope W_uk^T                     absorbed W_UK         [b, h, 512]
    c_kv, k_pe = x W_dkv -> latent [512], rope [64]; c_kv = rms(c_kv); k_pe = rope(k_pe, pos)
    write_cache(cache, slot(pos), latent=c_kv, rope=k_pe)        the new token
    o_lat = attention(q_lat ++ q_pe, cache)  attncc (examples/mla.attn) [b, h, 512]
    x    += (o_lat W_uv) W_o                  absorbed W_UV, output projection
The attention FFN is left out: this is the attention's part of a decode step. Every step
is run eagerly and, on CUDA, replayed from one captured CUDA graph (the same buffers, new
lengths and slots written into them before each replay); the two must agree.
`naive_step` is the same step with K and V decompressed (no absorption), in float32: the
check that absorbed MLA through attncc computes what MLA is."""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import attncc
from attncc import storage

HERE = Path(__file__).resolve().parent

TINY_SPEC = """attention mla_tiny {
    heads q = 4, kv = 1
    cache paged(16) {
        latent: bf16[64]
        rope:   bf16[16]
    }
    key   = latent ++ rope
    value = latent
    scale 0.1443375673
}"""


@dataclass(frozen=True)
class Shape:
    hidden: int = 7168
    heads: int = 128
    q_rank: int = 1536
    kv_rank: int = 512   # the latent
    nope: int = 128
    rope: int = 64
    v_head: int = 128
    page: int = 64

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope + self.rope)


TINY = Shape(hidden=64, heads=4, q_rank=32, kv_rank=64, nope=32, rope=16, v_head=16, page=16)


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last dim (halves rotated), positions [b]."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = pos.float()[:, None] * freq[None, :]                      # [b, half]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = angle.cos().view(shape), angle.sin().view(shape)
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)


class Layer:
    """One layer's attention weights (random, scaled so activations stay O(1))."""

    def __init__(self, s: Shape, device, dtype, gen):
        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=gen) / math.sqrt(fan_in)).to(device, dtype)

        self.w_dq = w(s.hidden, s.q_rank, fan_in=s.hidden)
        self.w_uq = w(s.q_rank, s.heads * (s.nope + s.rope), fan_in=s.q_rank)
        self.w_dkv = w(s.hidden, s.kv_rank + s.rope, fan_in=s.hidden)
        self.w_uk = w(s.heads, s.nope, s.kv_rank, fan_in=s.kv_rank)    # k_nope = c_kv W_uk^T
        self.w_uv = w(s.heads, s.kv_rank, s.v_head, fan_in=s.kv_rank)  # v = c_kv W_uv
        self.w_o = w(s.heads * s.v_head, s.hidden, fan_in=s.heads * s.v_head)


class Stack:
    """The decode state of a batch: weights, the paged cache of every layer, lengths."""

    def __init__(self, s: Shape, kernel, layers: int, batch: int, context: int, steps: int,
                 device, seed: int = 0):
        self.s, self.k, self.device = s, kernel, device
        self.dtype = torch.bfloat16
        gen = torch.Generator().manual_seed(seed)
        self.layers = [Layer(s, device, self.dtype, gen) for _ in range(layers)]
        pages_per_seq = -(-(context + steps) // s.page)
        self.block_table = torch.arange(batch * pages_per_seq, dtype=torch.int32,
                                        device=device).view(batch, pages_per_seq)
        self.caches = [kernel.new_cache(batch * pages_per_seq, device=device) for _ in range(layers)]
        # the context already cached: random latents and rope keys
        n = batch * context
        pos = torch.arange(context, device=device).repeat(batch)
        slots = self._slots(torch.arange(batch, device=device).repeat_interleave(context), pos)
        for cache in self.caches:
            kernel.write_cache(cache, slots,
                               latent=rms(torch.randn(n, 1, s.kv_rank, generator=gen).to(device, self.dtype)),
                               rope=torch.randn(n, 1, s.rope, generator=gen).to(device, self.dtype))
        self.seqlens = torch.full((batch,), context, dtype=torch.int32, device=device)
        self.x = torch.randn(batch, s.hidden, generator=gen).to(device, self.dtype)

    def _slots(self, seq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        page = self.block_table[seq, pos // self.s.page].long()
        return page * self.s.page + pos % self.s.page

    def step(self, x: torch.Tensor, seqlens: torch.Tensor) -> torch.Tensor:
        """One decode step through every layer: the new token of each sequence sits at
        position seqlens (before the step); returns the new hidden state. Graph-safe: no
        host sync, no allocation that depends on values."""
        s, b = self.s, x.shape[0]
        pos = seqlens.long()
        slots = self._slots(torch.arange(b, device=x.device), pos)
        lengths = seqlens + 1
        for layer, cache in zip(self.layers, self.caches):
            c_q = rms(x @ layer.w_dq)
            q = (c_q @ layer.w_uq).view(b, s.heads, s.nope + s.rope)
            q_nope, q_pe = q[..., :s.nope], rope(q[..., s.nope:], pos)
            q_lat = torch.einsum("bhn,hnc->bhc", q_nope, layer.w_uk)               # absorbed W_UK
            kv = x @ layer.w_dkv
            c_kv, k_pe = rms(kv[:, :s.kv_rank]), rope(kv[:, s.kv_rank:], pos)
            self.k.write_cache(cache, slots, latent=c_kv[:, None], rope=k_pe[:, None])
            query = torch.cat([q_lat, q_pe], -1)[:, None]                          # [b, 1, h, 576]
            o_lat, _ = self.k(query, cache, self.block_table, lengths)             # [b, 1, h, 512]
            o = torch.einsum("bhc,hcv->bhv", o_lat[:, 0], layer.w_uv)             # absorbed W_UV
            x = x + o.reshape(b, -1) @ layer.w_o
        return x

    def naive_step(self, x: torch.Tensor, seqlens: torch.Tensor) -> torch.Tensor:
        """The same step in float32 with K and V decompressed per head (no absorption) and
        plain softmax attention over each sequence's cache (read back from attncc's cache)."""
        s, b = self.s, x.shape[0]
        pos = seqlens.long()
        x = x.float()
        for layer, cache in zip(self.layers, self.caches):
            f = {name: getattr(layer, name).float() for name in ("w_dq", "w_uq", "w_dkv", "w_uk", "w_uv", "w_o")}
            q = (rms(x @ f["w_dq"]) @ f["w_uq"]).view(b, s.heads, s.nope + s.rope)
            q_nope, q_pe = q[..., :s.nope], rope(q[..., s.nope:], pos)
            kv = x @ f["w_dkv"]
            c_new, pe_new = rms(kv[:, :s.kv_rank]), rope(kv[:, s.kv_rank:], pos)
            rows = []
            for i in range(b):
                length = int(seqlens[i]) + 1
                old = storage.read(self.k.spec, cache, self._slots(torch.full((length - 1,), i, device=x.device),
                                                                          torch.arange(length - 1, device=x.device)))
                c_kv = torch.cat([old["latent"][:, 0], c_new[i:i + 1]])           # [L, 512]
                k_pe = torch.cat([old["rope"][:, 0], pe_new[i:i + 1]])            # [L, 64]
                k_nope = torch.einsum("lc,hnc->hln", c_kv, f["w_uk"])              # decompressed K
                v = torch.einsum("lc,hcv->hlv", c_kv, f["w_uv"])                   # decompressed V
                scores = (torch.einsum("hn,hln->hl", q_nope[i], k_nope)
                          + torch.einsum("hr,lr->hl", q_pe[i], k_pe)) * s.scale
                rows.append(torch.einsum("hl,hlv->hv", scores.softmax(-1), v).reshape(-1))
            x = x + torch.stack(rows) @ f["w_o"]
        return x


def compile_spec(device):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # `seesaw`: a Hopper schedule, not yet applied
        return attncc.compile(HERE / "mla.attn" if device.type == "cuda" else TINY_SPEC)


def run(device="cuda", layers=None, batch=None, context=None, steps=None, check=True, out=print):
    """Decode `steps` steps eagerly and (CUDA) by graph replay; returns the two final states
    and the per-step times in ms."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    shape = Shape() if cuda else TINY
    layers = layers or (8 if cuda else 2)
    batch, context, steps = batch or (32 if cuda else 3), context or (4096 if cuda else 40), steps or (8 if cuda else 3)
    kernel = compile_spec(device)
    assert kernel.spec.heads_q == shape.heads and kernel.spec.d_v == shape.kv_rank
    assert abs(kernel.spec.softmax_scale - shape.scale) < 1e-6, "the spec's scale is 1/sqrt(nope + rope)"
    results, times = {}, {}
    for mode in ("eager", "graph") if cuda else ("eager",):
        stack = Stack(shape, kernel, layers, batch, context, steps, device)
        x, seqlens = stack.x.clone(), stack.seqlens.clone()
        graph = None
        if mode == "graph":
            static_x, static_len = x.clone(), seqlens.clone()
            stack.step(static_x, static_len)  # warm up (builds, loads) before capture
            torch.cuda.synchronize()
            stack = Stack(shape, kernel, layers, batch, context, steps, device)  # fresh caches
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = stack.step(static_x, static_len)
        elapsed = []
        for i in range(steps):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            if graph is None:
                if check and not cuda and i == steps - 1:
                    want = stack.naive_step(x, seqlens)
                x = stack.step(x, seqlens)
                if check and not cuda and i == steps - 1:
                    err = ((x.float() - want).norm() / want.norm()).item()
                    out(f"absorbed MLA through attncc vs decompressed MLA: rel. error {err:.2e}")
                    assert err < 2e-2, err
            else:
                static_x.copy_(x)
                static_len.copy_(seqlens)
                graph.replay()
                x = static_out.clone()
            if cuda:
                torch.cuda.synchronize()
            elapsed.append((time.perf_counter() - start) * 1e3)
            seqlens = seqlens + 1
        results[mode], times[mode] = x, elapsed
        out(f"{mode:>5}: {layers} layers, batch {batch}, context {context}: "
            f"{sorted(elapsed)[len(elapsed) // 2]:.2f} ms per step (median of {steps})")
    if "graph" in results:
        diff = ((results["graph"].float() - results["eager"].float()).norm()
                / results["eager"].float().norm()).item()
        out(f"eager vs graph: rel. difference {diff:.2e}")
    return results, times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--context", type=int)
    ap.add_argument("--steps", type=int)
    args = ap.parse_args(argv)
    run(args.device, args.layers, args.batch, args.context, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
