"""GLA decode attention split over tensor-parallel ranks, beside MLA replicated on every rank.

    torchrun --nproc-per-node 2 examples/tp_decode.py --layout gla2       # NCCL on GPUs
    torchrun --nproc-per-node 2 examples/tp_decode.py --layout mla
    torchrun --nproc-per-node 2 examples/tp_decode.py --device cpu        # gloo, tiny sizes
    torchrun --nproc-per-node 2 examples/tp_decode.py --bench             # per-step time, cache bytes

GLA's point (Zadouri et al. 2025, §3.3.2): its n latent heads shard across N ranks, each rank
caching n / N of them (plus the shared rope key), where MLA's one latent head must be cached
whole on every rank. Each rank runs the same `.attn` layout with its own head counts:
h_q / N query heads over n / N latent heads (MLA: h_q / N over the one latent, replicated).

A layer, per rank (absorbed, as in examples/deepseek_decode.py):
    q      = x W_q[rank's heads]           -> q_nope, q_pe (RoPE)       column parallel
    c      = x W_dkv[rank's latent heads], k_pe = rope(x W_kr)          (rope key replicated)
    write_cache(c, k_pe) for the new tokens; o_lat = attention(q_nope W_uk^T ++ q_pe, cache)
    partial = (o_lat W_uv) W_o[rank's heads];  x += all_reduce(partial)  row parallel
Weights come from one seed, so any N gives the single-process result (tests/test_tp.py)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

import attncc


@dataclass(frozen=True)
class Shape:
    layout: str = "gla2"   # gla<n> (n latent heads, rope shared) or mla (one latent head)
    hidden: int = 7168
    heads: int = 128
    latent: int = 256      # per latent head (MLA: 512)
    rope: int = 64
    nope: int = 128
    v_head: int = 128
    page: int = 64
    max_sq: int = 2

    @property
    def latent_heads(self) -> int:
        return 1 if self.layout == "mla" else int(self.layout.removeprefix("gla"))

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope + self.rope)

    def local(self, world: int) -> tuple[int, int]:
        """(query heads, latent heads) of one rank; MLA replicates its latent head."""
        if self.heads % world:
            raise ValueError(f"{self.heads} query heads do not split over {world} ranks")
        if self.layout == "mla":
            return self.heads // world, 1
        if self.latent_heads % world:
            raise ValueError(f"{self.latent_heads} latent heads do not split over {world} ranks")
        return self.heads // world, self.latent_heads // world

    def spec(self, world: int) -> str:
        """The rank's spec: the model's layout with the rank's head counts."""
        h, n = self.local(world)
        shared = "" if self.layout == "mla" else " shared"
        return f"""attention {self.layout}_tp{world} {{
    heads q = {h}, kv = {n}
    cache paged({self.page}) {{
        latent: bf16[{self.latent}]
        rope:   bf16[{self.rope}]{shared}
    }}
    key   = latent ++ rope
    value = latent
    query len <= {self.max_sq} causal
    scale {self.scale!r}
}}"""


def shape_for(layout: str, tiny: bool) -> Shape:
    s = Shape(layout=layout, latent=512 if layout == "mla" else 256)
    if tiny:
        s = replace(s, hidden=32, heads=4, latent=64 if layout == "mla" else 32, rope=16, nope=16,
                    v_head=16, page=4)
    return s


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last dim (halves rotated); pos broadcasts over x's leading dims."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = pos.float()[..., None] * freq
    while angle.dim() < x.dim():
        angle = angle.unsqueeze(-2)
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)


class Layer:
    """The whole layer's weights from one seed, then this rank's shard of them."""

    def __init__(self, s: Shape, rank: int, world: int, gen: torch.Generator, device, dtype):
        def w(*shape, fan_in):
            return torch.randn(*shape, generator=gen) / math.sqrt(fan_in)

        n = s.latent_heads
        w_q = w(s.hidden, s.heads, s.nope + s.rope, fan_in=s.hidden)
        w_dkv = w(s.hidden, n, s.latent, fan_in=s.hidden)
        w_kr = w(s.hidden, s.rope, fan_in=s.hidden)
        w_uk = w(s.heads, s.nope, s.latent, fan_in=s.latent)
        w_uv = w(s.heads, s.latent, s.v_head, fan_in=s.latent)
        w_o = w(s.heads, s.v_head, s.hidden, fan_in=s.heads * s.v_head)
        h, n_local = s.local(world)
        heads = slice(rank * h, (rank + 1) * h)
        latents = slice(0, 1) if s.layout == "mla" else slice(rank * n_local, (rank + 1) * n_local)
        put = lambda t: t.contiguous().to(device, dtype)  # noqa: E731
        self.w_q, self.w_uk, self.w_uv, self.w_o = (put(w_q[:, heads]), put(w_uk[heads]),
                                                    put(w_uv[heads]), put(w_o[heads]))
        self.w_dkv, self.w_kr = put(w_dkv[:, latents]), put(w_kr)


class TPAttention:
    """This rank's part of a stack of attention layers, and its paged caches."""

    def __init__(self, s: Shape, layers: int, batch: int, context: int, steps: int, rank: int,
                 world: int, device, seed: int = 0, kernel=None):
        import warnings

        self.s, self.rank, self.world, self.device = s, rank, world, torch.device(device)
        self.dtype = torch.bfloat16
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.k = kernel or attncc.compile(s.spec(world))
        self.h, self.n = s.local(world)
        gen = torch.Generator().manual_seed(seed)
        self.layers = [Layer(s, rank, world, gen, self.device, self.dtype) for _ in range(layers)]
        pages_per_seq = -(-(context + steps * s.max_sq) // s.page)
        self.block_table = torch.arange(batch * pages_per_seq, dtype=torch.int32,
                                        device=self.device).view(batch, pages_per_seq)
        self.caches = [self.k.new_cache(batch * pages_per_seq, device=self.device) for _ in range(layers)]
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=self.device)
        self.x = (torch.randn(batch, s.max_sq, s.hidden, generator=gen)).to(self.device, self.dtype)
        self.context = context

    def cache_bytes(self) -> int:
        """Bytes of KV cache this rank holds (all layers)."""
        return sum(t.numel() * t.element_size() for c in self.caches
                   for t in attncc.storage.cache_tensors(c).values())

    def prefill(self, gen_seed: int = 1) -> None:
        """Random cached context (not a real prefill: decode only reads the cache). Every rank
        draws the whole model's latents from one seed and keeps its own heads."""
        s, b, L = self.s, self.seqlens.shape[0], self.context
        gen = torch.Generator().manual_seed(gen_seed)
        pos = torch.arange(L, device=self.device).repeat(b)
        seq = torch.arange(b, device=self.device).repeat_interleave(L)
        slots = self._slots(seq, pos)
        first = 0 if s.layout == "mla" else self.rank * self.n
        for cache in self.caches:
            latent = torch.randn(b * L, s.latent_heads, s.latent, generator=gen)[:, first:first + self.n]
            k_pe = torch.randn(b * L, s.rope, generator=gen)
            self.k.write_cache(cache, slots, latent=rms(latent).to(self.device, self.dtype),
                               rope=self._rope_arg(k_pe.to(self.device, self.dtype)))
        self.seqlens.fill_(L)

    def _rope_arg(self, k_pe: torch.Tensor) -> torch.Tensor:
        return k_pe if self.s.layout != "mla" else k_pe[:, None]  # per-head (kv = 1) in MLA

    def _slots(self, seq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        page = self.block_table[seq, pos // self.s.page].long()
        return page * self.s.page + pos % self.s.page

    def step(self, x: torch.Tensor, seqlens: torch.Tensor, group=None) -> torch.Tensor:
        """One decode step of s_q = x.shape[1] new tokens per sequence through every layer;
        the tokens sit at positions seqlens .. seqlens + s_q - 1."""
        s, (b, s_q, _) = self.s, x.shape
        pos = seqlens.long()[:, None] + torch.arange(s_q, device=x.device)      # [b, s_q]
        seq = torch.arange(b, device=x.device)[:, None].expand(b, s_q)
        slots = self._slots(seq.reshape(-1), pos.reshape(-1))
        lengths = seqlens + s_q
        for layer, cache in zip(self.layers, self.caches):
            q = torch.einsum("btd,dhe->bthe", x, layer.w_q)                      # [b, s_q, h, nope+rope]
            q_nope, q_pe = q[..., :s.nope], rope(q[..., s.nope:], pos)
            q_lat = torch.einsum("bthn,hnc->bthc", q_nope, layer.w_uk)           # absorbed W_UK
            c = rms(torch.einsum("btd,dnc->btnc", x, layer.w_dkv)).reshape(b * s_q, self.n, s.latent)
            k_pe = rope(x @ layer.w_kr, pos).reshape(b * s_q, s.rope)
            self.k.write_cache(cache, slots, latent=c, rope=self._rope_arg(k_pe))
            o_lat, _ = self.k(torch.cat([q_lat, q_pe], -1), cache, self.block_table, lengths)
            o = torch.einsum("bthc,hcv->bthv", o_lat, layer.w_uv)                # absorbed W_UV
            partial = torch.einsum("bthv,hvd->btd", o, layer.w_o)               # this rank's heads
            if self.world > 1:
                partial = partial.float()
                dist.all_reduce(partial, group=group)
            x = x + partial.to(x.dtype)
        return x


def decode(s: Shape, layers: int, batch: int, context: int, steps: int, s_q: int, rank: int,
           world: int, device, group=None) -> torch.Tensor:
    """`steps` decode steps from the same start on every rank; the final hidden state."""
    tp = TPAttention(s, layers, batch, context, steps, rank, world, device)
    tp.prefill()
    x, seqlens = tp.x[:, :s_q].clone(), tp.seqlens.clone()
    for _ in range(steps):
        x = tp.step(x, seqlens, group)
        seqlens = seqlens + s_q
    return x


def bench(s: Shape, layers: int, rank: int, world: int, device, out=print) -> list[dict]:
    """Per-step time and per-GPU cache bytes, b=128, s_k 8192 and 32768, s_q 1 and 2."""
    rows = []
    for context in (8192, 32768):
        tp = TPAttention(s, layers, 128, context, 4, rank, world, device)
        tp.prefill()
        for s_q in (1, 2):
            x, seqlens = tp.x[:, :s_q].contiguous(), tp.seqlens.clone()
            tp.step(x, seqlens)  # warm up
            torch.cuda.synchronize()
            dist.barrier()
            times = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                tp.step(x, seqlens)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / layers)
            row = dict(layout=s.layout, world=world, batch=128, s_k=context, s_q=s_q,
                       ms_per_layer_step=sorted(times)[2], cache_bytes_per_gpu=tp.cache_bytes() // layers)
            rows.append(row)
            if rank == 0:
                out(f"{s.layout} over {world} rank(s): b=128 s_k={context} s_q={s_q}: "
                    f"{row['ms_per_layer_step']:.3f} ms per layer-step, "
                    f"{row['cache_bytes_per_gpu'] / 2**30:.2f} GiB cache per GPU per layer")
        del tp
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layout", default="gla2", help="gla<n> or mla")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    s = shape_for(args.layout, tiny=not cuda)
    if args.bench:
        bench(s, args.layers, rank, world, device)
    else:
        start = time.perf_counter()
        x = decode(s, args.layers, args.batch, args.context, args.steps, args.sq, rank, world, device)
        if rank == 0:
            print(f"{s.layout} over {world} rank(s): {args.steps} steps in {time.perf_counter() - start:.2f} s; "
                  f"|x| = {x.float().norm():.4f}")
    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
