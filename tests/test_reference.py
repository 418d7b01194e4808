"""`attncc.reference` against an independent, naive per-token loop in float64.

The naive side knows nothing of attncc's storage code: it decodes every record by hand
from the cache's bytes (packed) or tensors (separate), following DESIGN.md §2, from a
test-side description of the spec (`Desc`), which is also what renders the spec text."""
from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attncc
from attncc import reference, storage

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# --- the test's own description of a spec -------------------------------------------------


@dataclass(frozen=True)
class Seg:
    name: str
    dtype: str      # bf16 fp16 e4m3 e5m2
    dim: int
    shared: bool = False
    group: int = 0  # values per fp32 scale (fp8 only)


@dataclass(frozen=True)
class Desc:
    name: str
    hq: int
    hkv: int
    page: int
    segs: tuple
    key: tuple      # ((segment, lo, hi), ...)
    value: tuple
    qlen: int = 1
    causal: bool = False
    topk: int = 0
    scale: float | None = None
    separate: bool = False

    def text(self) -> str:
        segs = "\n".join(
            f"        {s.name}: {s.dtype}[{s.dim}]{' shared' if s.shared else ''}"
            f"{f' scale fp32 per {s.group}' if s.group else ''}" for s in self.segs)

        def proj(parts):
            return " ++ ".join(f"{n}[{lo}:{hi}]" for n, lo, hi in parts)

        lines = [f"attention {self.name} {{",
                 f"    heads q = {self.hq}, kv = {self.hkv}",
                 f"    cache paged({self.page}){' separate' if self.separate else ''} {{",
                 segs, "    }",
                 f"    key = {proj(self.key)}", f"    value = {proj(self.value)}",
                 f"    query len <= {self.qlen}{' causal' if self.causal else ''}"]
        if self.topk:
            lines.append(f"    tokens topk {self.topk}")
        if self.scale is not None:
            lines.append(f"    scale {self.scale!r}")
        lines.append("}")
        return "\n".join(lines)

    @property
    def d_k(self):
        return sum(hi - lo for _, lo, hi in self.key)

    @property
    def d_v(self):
        return sum(hi - lo for _, lo, hi in self.value)

    @property
    def default_scale(self):
        return self.scale if self.scale is not None else 1 / math.sqrt(self.d_k)

    def seg(self, name):
        return next(s for s in self.segs if s.name == name)


# The examples, as the test reads them (not from attncc's IR).
EXAMPLE_DESCS = {
    "mla": Desc("mla", 128, 1, 64, (Seg("latent", "bf16", 512), Seg("rope", "bf16", 64)),
                (("latent", 0, 512), ("rope", 0, 64)), (("latent", 0, 512),),
                qlen=2, causal=True, scale=0.0721687836),
    "mla_fp8_sparse": Desc("mla_fp8_sparse", 128, 1, 64,
                           (Seg("latent", "e4m3", 512, group=128), Seg("rope", "bf16", 64)),
                           (("latent", 0, 512), ("rope", 0, 64)), (("latent", 0, 512),),
                           qlen=2, topk=2048),
    "gla2": Desc("gla2", 128, 2, 64, (Seg("latent", "bf16", 256), Seg("rope", "bf16", 64, True)),
                 (("latent", 0, 256), ("rope", 0, 64)), (("latent", 0, 256),),
                 qlen=2, causal=True),
    "gta4": Desc("gta4", 32, 4, 16, (Seg("tied", "bf16", 128), Seg("rope", "bf16", 64, True)),
                 (("tied", 0, 64), ("rope", 0, 64)), (("tied", 0, 128),)),
    "gqa8": Desc("gqa8", 32, 8, 16, (Seg("k", "bf16", 128), Seg("v", "bf16", 128)),
                 (("k", 0, 128),), (("v", 0, 128),)),
    "mqa": Desc("mqa", 32, 1, 16, (Seg("k", "bf16", 128), Seg("v", "bf16", 128)),
                (("k", 0, 128),), (("v", 0, 128),)),
}


# --- decoding bytes by hand ------------------------------------------------------------------


def _fp8_table(exp_bits: int, man_bits: int, fn: bool) -> np.ndarray:
    """All 256 values of an fp8 format, from its bit fields."""
    bias = (1 << (exp_bits - 1)) - 1
    table = np.zeros(256)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        e = (byte >> man_bits) & ((1 << exp_bits) - 1)
        m = byte & ((1 << man_bits) - 1)
        if fn and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            table[byte] = math.nan                          # e4m3fn: only S.1111.111 is NaN
        elif not fn and e == (1 << exp_bits) - 1:
            table[byte] = sign * math.inf if m == 0 else math.nan   # e5m2: IEEE-like
        elif e == 0:
            table[byte] = sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            table[byte] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return table


FP8 = {"e4m3": _fp8_table(4, 3, True), "e5m2": _fp8_table(5, 2, False)}
ELEM_BYTES = {"bf16": 2, "fp16": 2, "e4m3": 1, "e5m2": 1}


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian bytes → float64 values."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if dtype == "bf16":
        return (raw.view("<u2").astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if dtype == "fp16":
        return raw.view("<f2").astype(np.float64)
    if dtype == "fp32":
        return raw.view("<f4").astype(np.float64)
    return FP8[dtype][raw]


def as_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


class Records:
    """Hand-decoded per-token records of a cache: slot → {segment: [copies, dim]}."""

    def __init__(self, desc: Desc, cache):
        self.desc = desc
        self.memo = {}
        if desc.separate:
            self.tensors = {name: as_bytes(t) for name, t in cache.items()}
            return
        self.bytes = as_bytes(cache).reshape(-1)
        self.layout, offset = [], 0
        for s in desc.segs:
            copies = 1 if s.shared else desc.hkv
            copy = s.dim * ELEM_BYTES[s.dtype] + (s.dim // s.group * 4 if s.group else 0)
            self.layout.append((s, offset, copy, copies))
            offset += copy * copies
        self.record = offset
        assert self.bytes.size % self.record == 0

    def __call__(self, slot: int) -> dict:
        if slot not in self.memo:
            self.memo[slot] = self._decode(slot)
        return self.memo[slot]

    def _decode(self, slot):
        desc, out = self.desc, {}
        if desc.separate:
            for s in desc.segs:
                copies = 1 if s.shared else desc.hkv
                raw = self.tensors[s.name].reshape(-1, copies, s.dim * ELEM_BYTES[s.dtype])[slot]
                vals = np.stack([decode(raw[c], s.dtype) for c in range(copies)])
                if s.group:
                    sraw = self.tensors[f"{s.name}_scale"].reshape(-1, copies, s.dim // s.group * 4)
                    scales = np.stack([decode(sraw[slot][c], "fp32") for c in range(copies)])
                    vals = vals * np.repeat(scales, s.group, axis=1)
                out[s.name] = vals
            return out
        rec = self.bytes[slot * self.record:(slot + 1) * self.record]
        for s, offset, copy, copies in self.layout:
            rows = []
            for c in range(copies):
                base = offset + c * copy
                nbytes = s.dim * ELEM_BYTES[s.dtype]
                vals = decode(rec[base:base + nbytes], s.dtype)
                if s.group:
                    scales = decode(rec[base + nbytes:base + copy], "fp32")
                    vals = vals * np.repeat(scales, s.group)
                rows.append(vals)
            out[s.name] = np.stack(rows)
        return out

    def key_value(self, slot: int, kv_head: int):
        rec = self(slot)

        def pick(parts):
            return np.concatenate([rec[n][0 if self.desc.seg(n).shared else kv_head][lo:hi]
                                   for n, lo, hi in parts])
        return pick(self.desc.key), pick(self.desc.value)


def naive(desc: Desc, q, cache, block_table=None, seqlens=None, indices=None, scale=None):
    """One query token, one head, one cache position at a time, in float64."""
    scale = desc.default_scale if scale is None else scale
    records = Records(desc, cache)
    q = q.double().numpy()
    b_n, s_q = q.shape[:2]
    out = np.zeros((b_n, s_q, desc.hq, desc.d_v))
    lse = np.full((b_n, desc.hq, s_q), -math.inf)
    group = desc.hq // desc.hkv
    for b in range(b_n):
        for t in range(s_q):
            slots = []
            if desc.topk:
                slots = [int(i) for i in indices[b, t] if int(i) != -1]
            else:
                seqlen = int(seqlens[b])
                for pos in range(seqlen):
                    if desc.causal and not pos < seqlen - s_q + t + 1:
                        continue
                    page = int(block_table[b, pos // desc.page])
                    slots.append(page * desc.page + pos % desc.page)
            if not slots:
                continue
            for h in range(desc.hq):
                scores, values = [], []
                for slot in slots:
                    k, v = records.key_value(slot, h // group)
                    scores.append(scale * float(np.dot(q[b, t, h], k)))
                    values.append(v)
                m = max(scores)
                weights = [math.exp(x - m) for x in scores]
                total = sum(weights)
                lse[b, h, t] = m + math.log(total)
                acc = np.zeros(desc.d_v)
                for w, v in zip(weights, values):
                    acc += w * v
                out[b, t, h] = acc / total
    return out, lse


# --- building poisoned caches ------------------------------------------------------------------


def poison(cache):
    """Every byte 0xFF: NaN in bf16, fp16, fp32, e4m3 and e5m2 alike."""
    for t in storage.cache_tensors(cache).values():
        t.view(torch.uint8).fill_(0xFF)


def random_values(desc: Desc, n: int, gen: torch.Generator) -> dict:
    """Segment values for n tokens; fp8 groups get very different magnitudes."""
    values = {}
    for s in desc.segs:
        shape = (n, s.dim) if s.shared else (n, desc.hkv, s.dim)
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if s.group:
            mag = 10.0 ** (torch.rand(*shape[:-1], s.dim // s.group, generator=gen,
                                      dtype=torch.float64) * 4 - 2)
            x = x * mag.repeat_interleave(s.group, dim=-1)
        values[s.name] = x
    return values


def dense_case(kernel, desc: Desc, seqlens, s_q, seed, extra_pages=2, permute=True):
    """q, a NaN-poisoned cache with the sequences' tokens written through a random
    (permuted) block table, block_table, seqlens."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    P = desc.page
    pages_of = [(n + P - 1) // P for n in seqlens]
    width = max(pages_of + [1]) + 1                      # one spare column
    num_pages = sum(pages_of) + extra_pages
    order = list(range(num_pages))
    if permute:
        rng.shuffle(order)
    used, spare = order[:sum(pages_of)], order[sum(pages_of):]
    block_table = torch.empty(len(seqlens), width, dtype=torch.int32)
    cursor = 0
    for b, n in enumerate(pages_of):
        block_table[b, :n] = torch.tensor(used[cursor:cursor + n], dtype=torch.int32)
        cursor += n
        for col in range(n, width):              # unused entries name NaN pages
            block_table[b, col] = rng.choice(spare) if spare else 0
    cache = kernel.new_cache(num_pages, device="cpu")
    poison(cache)
    slots = [int(block_table[b, pos // P]) * P + pos % P
             for b, n in enumerate(seqlens) for pos in range(n)]
    if slots:
        kernel.write_cache(cache, torch.tensor(slots), **random_values(desc, len(slots), gen))
    q = torch.randn(len(seqlens), s_q, desc.hq, desc.d_k, generator=gen, dtype=torch.float64)
    return q, cache, block_table, torch.tensor(seqlens, dtype=torch.int32)


def sparse_case(kernel, desc: Desc, counts, s_q, num_pages, seed):
    """counts[b][t] distinct random slots per query token at random positions of the
    top-k row, -1 elsewhere; every slot no index names stays NaN."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    total = num_pages * desc.page
    indices = torch.full((len(counts), s_q, desc.topk), -1, dtype=torch.int32)
    named = set()
    for b, row in enumerate(counts):
        for t in range(s_q):
            chosen = rng.sample(range(total), row[t])
            where = rng.sample(range(desc.topk), row[t])
            for w, slot in zip(where, chosen):
                indices[b, t, w] = slot
            named.update(chosen)
    cache = kernel.new_cache(num_pages, device="cpu")
    poison(cache)
    if named:
        slots = sorted(named)
        kernel.write_cache(cache, torch.tensor(slots), **random_values(desc, len(slots), gen))
    q = torch.randn(len(counts), s_q, desc.hq, desc.d_k, generator=gen, dtype=torch.float64)
    return q, cache, indices


def check_against_naive(desc, q, cache, block_table=None, seqlens=None, indices=None,
                        scale=None, kernel=None):
    kernel = kernel or attncc.compile(desc.text())
    out, lse = reference.attention(kernel.spec, q, cache, block_table, seqlens, indices,
                                   scale=scale, dtype=torch.float64)
    want_out, want_lse = naive(desc, q, cache, block_table, seqlens, indices, scale)
    assert out.dtype == lse.dtype == torch.float64
    assert tuple(out.shape) == want_out.shape == (q.shape[0], q.shape[1], desc.hq, desc.d_v)
    assert tuple(lse.shape) == want_lse.shape == (q.shape[0], desc.hq, q.shape[1])
    out, lse = out.numpy(), lse.numpy()
    assert np.isfinite(out).all(), "NaN/inf leaked into out"
    empty = np.isneginf(want_lse)
    np.testing.assert_array_equal(np.isneginf(lse), empty)
    assert not np.isnan(lse).any()
    np.testing.assert_allclose(lse[~empty], want_lse[~empty], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-10)
    # a query that sees nothing: out exactly 0
    empty_q = empty.transpose(0, 2, 1)  # [b, s_q, h]
    assert (out[empty_q] == 0).all()
    return out, lse


# --- every real example, tiny batch and length ----------------------------------------------


def test_example_descriptions_match_the_files():
    """The naive side's descriptions are of the same specs as the example files."""
    for name, desc in EXAMPLE_DESCS.items():
        spec = attncc.compile(EXAMPLES / f"{name}.attn").spec
        mine = attncc.compile(desc.text()).spec
        a, b = spec.canonical(), mine.canonical()
        a.pop("schedule"), b.pop("schedule")
        assert a == b, name


@pytest.mark.parametrize("name", ["mla", "gla2", "gta4", "gqa8", "mqa"])
def test_dense_example(name):
    desc = EXAMPLE_DESCS[name]
    kernel = attncc.compile(EXAMPLES / f"{name}.attn")
    P = desc.page
    seqlens = [P + 1, 0, 3] if P == 16 else [P + 1, 1]
    for s_q in range(1, desc.qlen + 1):
        q, cache, bt, sl = dense_case(kernel, desc, seqlens, s_q, seed=len(name) * 10 + s_q)
        out, lse = check_against_naive(desc, q, cache, bt, sl, kernel=kernel)
        if 0 in seqlens:
            b = seqlens.index(0)
            assert np.isneginf(lse[b]).all() and (out[b] == 0).all()


def test_sparse_example():
    desc = EXAMPLE_DESCS["mla_fp8_sparse"]
    kernel = attncc.compile(EXAMPLES / "mla_fp8_sparse.attn")
    q, cache, indices = sparse_case(kernel, desc, [[9, 0], [1, 20]], s_q=2, num_pages=3, seed=5)
    out, lse = check_against_naive(desc, q, cache, indices=indices, kernel=kernel)
    assert np.isneginf(lse[0, :, 1]).all() and (out[0, 1] == 0).all()
    assert np.isfinite(lse[1]).all()
    # s_q = 1, and seqlens (optional and unused) given
    q, cache, indices = sparse_case(kernel, desc, [[5]], s_q=1, num_pages=2, seed=6)
    out1, lse1 = check_against_naive(desc, q, cache, indices=indices, kernel=kernel)
    out2, lse2 = reference.attention(kernel.spec, q, cache, indices=indices,
                                     seqlens=torch.tensor([0], dtype=torch.int32),
                                     dtype=torch.float64)
    np.testing.assert_array_equal(out2.numpy(), out1)
    np.testing.assert_array_equal(lse2.numpy(), lse1)


# --- shrunken inline variants --------------------------------------------------------------


def small(name, **kw):
    """Small specs of each family, for many shapes."""
    base = {
        "mla": Desc("s_mla", 4, 1, 8, (Seg("latent", "bf16", 32), Seg("rope", "bf16", 8)),
                    (("latent", 0, 32), ("rope", 0, 8)), (("latent", 0, 32),),
                    qlen=3, causal=True, scale=0.2),
        "gla": Desc("s_gla", 6, 2, 8, (Seg("latent", "bf16", 16), Seg("rope", "bf16", 8, True)),
                    (("latent", 0, 16), ("rope", 0, 8)), (("latent", 0, 16),),
                    qlen=3, causal=True),
        "gta": Desc("s_gta", 8, 4, 8, (Seg("tied", "bf16", 16), Seg("rope", "bf16", 8, True)),
                    (("tied", 0, 8), ("rope", 0, 8)), (("tied", 0, 16),), qlen=2),
        "gqa": Desc("s_gqa", 4, 2, 8, (Seg("k", "bf16", 16), Seg("v", "bf16", 12)),
                    (("k", 0, 16),), (("v", 0, 12),), qlen=3, causal=True),
        "fp16": Desc("s_h", 4, 4, 8, (Seg("k", "fp16", 8), Seg("v", "fp16", 8)),
                     (("k", 0, 8),), (("v", 0, 8),), qlen=2, causal=True),
        "fp8": Desc("s_fp8", 4, 1, 8, (Seg("latent", "e4m3", 32, group=16), Seg("rope", "bf16", 8)),
                    (("latent", 0, 32), ("rope", 0, 8)), (("latent", 0, 32),), qlen=3, causal=True),
        "e5m2": Desc("s_e5m2", 4, 2, 8, (Seg("k", "e5m2", 128, group=64),
                                          Seg("v", "e5m2", 64, group=64), Seg("r", "bf16", 4, True)),
                     (("k", 64, 128), ("r", 0, 4)), (("v", 0, 64),), qlen=2, causal=True),
        # odd record: 5 fp8 bytes + 1 scale, shared 3 fp8 + 1 scale, 2 bf16 -> 17 bytes
        "odd": Desc("s_odd", 2, 1, 8, (Seg("a", "e4m3", 5, group=5), Seg("b", "e5m2", 3, True, 3),
                                        Seg("c", "bf16", 2)),
                    (("a", 1, 4), ("b", 0, 3), ("c", 1, 2)), (("a", 0, 5), ("c", 0, 2)), qlen=2,
                    causal=True),
    }[name]
    return replace(base, **kw)


FAMILIES = ["mla", "gla", "gta", "gqa", "fp16", "fp8", "e5m2", "odd"]


@pytest.mark.parametrize("separate", [False, True], ids=["packed", "separate"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("page", [1, 7, 64])
def test_dense_variants(family, page, separate):
    desc = small(family, page=page, separate=separate)
    kernel = attncc.compile(desc.text())
    assert kernel.spec.separate is separate
    P = page
    for s_q in range(1, desc.qlen + 1):
        seed = zlib.crc32(f"{family}{page}{s_q}".encode())
        # longer sequences first, then the edge lengths 0 and 1 on their own
        seqlens = sorted({P, P + 1, 2 * P + 3, 5} - {0, 1})
        q, cache, bt, sl = dense_case(kernel, desc, seqlens, s_q, seed=seed)
        check_against_naive(desc, q, cache, bt, sl, kernel=kernel)
        seqlens = [1, 0, P + 1]
        q, cache, bt, sl = dense_case(kernel, desc, seqlens, s_q, seed=seed + 1)
        out, lse = check_against_naive(desc, q, cache, bt, sl, kernel=kernel)
        assert np.isneginf(lse[1]).all() and (out[1] == 0).all()
        if desc.causal and s_q > 1:
            # seqlen 1: only the last query token sees the one position
            assert np.isneginf(lse[0, :, :-1]).all() and np.isfinite(lse[0, :, -1]).all()
        else:
            assert np.isfinite(lse[0]).all()


@pytest.mark.parametrize("family", ["gqa", "fp8", "odd"])
def test_dense_causal_every_length(family):
    """Every seqlen from 0 to 2P+1 with s_q = 3, one sequence each, pages permuted."""
    desc = small(family, page=4, qlen=3, causal=True)
    kernel = attncc.compile(desc.text())
    seqlens = list(range(0, 10))
    q, cache, bt, sl = dense_case(kernel, desc, seqlens, 3, seed=17, extra_pages=4)
    out, lse = check_against_naive(desc, q, cache, bt, sl, kernel=kernel)
    for b, n in enumerate(seqlens):
        for t in range(3):
            sees = max(0, n - 3 + t + 1)
            assert np.isneginf(lse[b, :, t]).all() == (sees == 0)


def test_causal_is_bottom_right_aligned():
    """Hand check of the causal rule: with seqlen 5 and s_q 3, token t sees 3 + t
    positions; the last query token equals plain attention over the whole sequence."""
    desc = small("gqa", page=2)
    kernel = attncc.compile(desc.text())
    q, cache, bt, sl = dense_case(kernel, desc, [5], 3, seed=3)
    out, lse = reference.attention(kernel.spec, q, cache, bt, sl, dtype=torch.float64)
    plain = attncc.compile(replace(desc, causal=False).text()).spec
    for t in range(3):
        o, l = reference.attention(plain, q[:, t:t + 1], cache, bt,
                                   torch.tensor([3 + t], dtype=torch.int32), dtype=torch.float64)
        torch.testing.assert_close(out[:, t:t + 1], o, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, :, t:t + 1], l, rtol=1e-12, atol=1e-12)


def test_non_causal_multi_token_queries_see_everything():
    desc = small("gta", page=7)
    assert desc.qlen == 2 and not desc.causal
    kernel = attncc.compile(desc.text())
    q, cache, bt, sl = dense_case(kernel, desc, [1, 8, 0], 2, seed=4)
    out, lse = check_against_naive(desc, q, cache, bt, sl, kernel=kernel)
    assert np.isfinite(lse[:2]).all() and np.isneginf(lse[2]).all()


@pytest.mark.parametrize("separate", [False, True], ids=["packed", "separate"])
@pytest.mark.parametrize("family", ["mla", "gla", "fp8", "e5m2", "odd"])
def test_sparse_variants(family, separate):
    desc = small(family, page=7, separate=separate, causal=False, topk=12)
    kernel = attncc.compile(desc.text())
    assert kernel.spec.sparse
    # full and partial rows first, then rows naming one token or none
    counts = [[12, 2, 7][:desc.qlen], [5, 9, 12][:desc.qlen]]
    q, cache, idx = sparse_case(kernel, desc, counts, desc.qlen, num_pages=4, seed=len(family))
    check_against_naive(desc, q, cache, indices=idx, kernel=kernel)
    counts = [[12, 0, 1][:desc.qlen], [5, 1, 12][:desc.qlen]]
    q, cache, idx = sparse_case(kernel, desc, counts, desc.qlen, num_pages=4, seed=len(family) + 1)
    out, lse = check_against_naive(desc, q, cache, indices=idx, kernel=kernel)
    assert np.isfinite(lse[0, :, 0]).all() and np.isneginf(lse[0, :, 1]).all()
    assert (out[0, 1] == 0).all()


def test_separate_fp8_reads_no_tokens():
    """Minimal case: a separate cache with an fp8 segment, a sequence of length 0."""
    desc = small("fp8", separate=True)
    kernel = attncc.compile(desc.text())
    cache = kernel.new_cache(1, device="cpu")
    got = storage.read(kernel.spec, cache, torch.zeros(0, dtype=torch.long))
    assert got["latent"].shape == (0, 1, 32) and got["rope"].shape == (0, 1, 8)
    q = torch.ones(1, 1, 4, 40, dtype=torch.bfloat16)
    out, lse = kernel(q, cache, torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_packed_fp8_scales_at_unaligned_offset_one_token():
    """Minimal case: a packed fp8 segment of 6 values (its fp32 scale at byte 6), one token."""
    kernel = attncc.compile("""
        attention o { heads q = 2, kv = 1
            cache paged(4) { a: e4m3[6] scale fp32 per 6  c: bf16[2] }
            key = a ++ c  value = a }""")
    cache = kernel.new_cache(1, device="cpu")
    a = torch.tensor([[[1.0, -2.0, 3.0, 0.5, 448.0, -7.0]]])
    kernel.write_cache(cache, torch.tensor([2]), a=a, c=torch.tensor([[[1.0, 2.0]]]))
    got = storage.read(kernel.spec, cache, torch.tensor([2]), torch.float64)
    assert torch.equal(got["a"], a.double())
    assert torch.equal(got["c"], torch.tensor([[[1.0, 2.0]]], dtype=torch.float64))


def test_scale_argument_overrides():
    desc = small("gla", page=7)
    kernel = attncc.compile(desc.text())
    q, cache, bt, sl = dense_case(kernel, desc, [9, 3], 2, seed=8)
    a, _ = check_against_naive(desc, q, cache, bt, sl, kernel=kernel, scale=0.37)
    b, _ = check_against_naive(desc, q, cache, bt, sl, kernel=kernel)
    assert not np.allclose(a, b)
    # the spec's scale is used when none is given
    c, _ = check_against_naive(replace(desc, scale=0.37, name="s_gla2"), q, cache, bt, sl)
    np.testing.assert_allclose(a, c, rtol=1e-13, atol=1e-13)


def test_reference_float32_close_to_float64():
    desc = small("fp8", page=7)
    kernel = attncc.compile(desc.text())
    q, cache, bt, sl = dense_case(kernel, desc, [15, 2], 3, seed=9)
    o64, l64 = reference.attention(kernel.spec, q, cache, bt, sl, dtype=torch.float64)
    o32, l32 = reference.attention(kernel.spec, q, cache, bt, sl)
    assert o32.dtype == l32.dtype == torch.float32
    # float32 rounding only: fp8 groups reach magnitudes of ~100, so scores are large
    torch.testing.assert_close(o32.double(), o64, rtol=1e-4, atol=1e-4 * float(o64.abs().max()))
    torch.testing.assert_close(l32.double(), l64, rtol=1e-4, atol=1e-4 * float(l64.abs().max()))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_specs(data):
    """Random small specs (heads, segments of every dtype, slices, page size, storage,
    causal) against the naive loop."""
    hkv = data.draw(st.sampled_from([1, 2, 3]))
    hq = hkv * data.draw(st.sampled_from([1, 2, 3]))
    elem = data.draw(st.sampled_from(["bf16", "fp16"]))
    nseg = data.draw(st.integers(1, 3))
    segs = []
    for i in range(nseg):
        dtype = data.draw(st.sampled_from([elem, "e4m3", "e5m2"]))
        group = data.draw(st.sampled_from([1, 2, 4])) if dtype.startswith("e") else 0
        dim = (group or 1) * data.draw(st.integers(1, 6))
        segs.append(Seg(f"s{i}", dtype, dim, data.draw(st.booleans()), group))

    def projection():
        parts = []
        for _ in range(data.draw(st.integers(1, 3))):
            s = data.draw(st.sampled_from(segs))
            lo = data.draw(st.integers(0, s.dim - 1))
            hi = data.draw(st.integers(lo + 1, s.dim))
            parts.append((s.name, lo, hi))
        return tuple(parts)

    sparse = data.draw(st.booleans())
    qlen = data.draw(st.integers(1, 3))
    desc = Desc("rnd", hq, hkv, data.draw(st.sampled_from([1, 2, 5, 8])), tuple(segs),
                projection(), projection(), qlen=qlen,
                causal=(not sparse) and data.draw(st.booleans()),
                topk=data.draw(st.integers(1, 6)) if sparse else 0,
                separate=data.draw(st.booleans()))
    kernel = attncc.compile(desc.text())
    s_q = data.draw(st.integers(1, qlen))
    seed = data.draw(st.integers(0, 10_000))
    if sparse:
        counts = [[data.draw(st.integers(0, desc.topk)) for _ in range(s_q)] for _ in range(2)]
        q, cache, idx = sparse_case(kernel, desc, counts, s_q, num_pages=max(2, 8 // desc.page), seed=seed)
        check_against_naive(desc, q, cache, indices=idx, kernel=kernel)
    else:
        seqlens = data.draw(st.lists(st.integers(0, 3 * desc.page + 1), min_size=1, max_size=3))
        q, cache, bt, sl = dense_case(kernel, desc, seqlens, s_q, seed=seed)
        check_against_naive(desc, q, cache, bt, sl, kernel=kernel)


# --- MLA: the absorbed form equals the non-absorbed one --------------------------------------

MLA4 = """
attention mla4 {
    heads q = 4, kv = 1
    cache paged(16) {
        latent: bf16[512]
        rope:   bf16[64]
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
}
"""


@pytest.mark.parametrize("s_q", [1, 2])
def test_mla_absorbed_equals_non_absorbed(s_q):
    gen = torch.Generator().manual_seed(11 + s_q)
    h, n = 4, 37
    kernel = attncc.compile(MLA4)
    w_uk = torch.randn(h, 128, 512, generator=gen, dtype=torch.float64) / math.sqrt(512)
    w_uv = torch.randn(h, 128, 512, generator=gen, dtype=torch.float64) / math.sqrt(512)
    latent = torch.randn(n, 512, generator=gen, dtype=torch.float64)
    rope = torch.randn(n, 64, generator=gen, dtype=torch.float64)
    q_nope = torch.randn(s_q, h, 128, generator=gen, dtype=torch.float64)
    q_rope = torch.randn(s_q, h, 64, generator=gen, dtype=torch.float64)
    scale = 1 / math.sqrt(192)

    # write into three permuted pages of a NaN-poisoned cache
    cache = kernel.new_cache(5, device="cpu")
    poison(cache)
    block_table = torch.tensor([[3, 0, 4]], dtype=torch.int32)
    pos = torch.arange(n)
    slots = block_table[0, pos // 16].long() * 16 + pos % 16
    kernel.write_cache(cache, slots, latent=latent[:, None], rope=rope[:, None])
    # the non-absorbed side uses the same bf16-rounded values the cache holds
    records = Records(replace(EXAMPLE_DESCS["mla"], hq=4, page=16), cache)
    c = torch.from_numpy(np.stack([records(int(x))["latent"][0] for x in slots]))
    r = torch.from_numpy(np.stack([records(int(x))["rope"][0] for x in slots]))
    assert (c - latent).abs().max() <= 2.0 ** -8 * latent.abs().max()
    assert (c != latent).any() and (c == c.to(torch.bfloat16).double()).all()

    # absorbed: q_abs = concat(W_UK[h]^T q_nope, q_rope), one 576-wide MQA head group
    q_abs = torch.cat([torch.einsum("hdc,shd->shc", w_uk, q_nope), q_rope], dim=-1)
    out_abs, lse_abs = reference.attention(
        kernel.spec, q_abs[None], cache, block_table, torch.tensor([n], dtype=torch.int32),
        scale=scale, dtype=torch.float64)
    assert out_abs.shape == (1, s_q, h, 512)

    # non-absorbed: standard MHA per head, 192-wide keys, 128-wide values
    for head in range(h):
        k = torch.cat([c @ w_uk[head].T, r], dim=-1)     # [n, 192]
        v = c @ w_uv[head].T                              # [n, 128]
        for t in range(s_q):
            visible = n - s_q + t + 1
            qt = torch.cat([q_nope[t, head], q_rope[t, head]])
            scores = (k[:visible] @ qt) * scale
            lse = torch.logsumexp(scores, 0)
            o = torch.softmax(scores, 0) @ v[:visible]
            torch.testing.assert_close(lse_abs[0, head, t], lse, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(w_uv[head] @ out_abs[0, t, head], o, rtol=1e-9, atol=1e-9)


# --- write_cache round trips -------------------------------------------------------------------


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even float32 → bf16, by hand on the bits; returns float64."""
    bits = x.float().numpy().view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return torch.from_numpy(rounded.astype(np.uint32).view(np.float32).astype(np.float64))


@pytest.mark.parametrize("separate", [False, True], ids=["packed", "separate"])
@pytest.mark.parametrize("name", ["mla", "gla2", "gta4", "gqa8"])
def test_write_cache_bf16_round_trip_is_exact(name, separate):
    desc = replace(EXAMPLE_DESCS[name], separate=separate)
    kernel = attncc.compile(desc.text())
    spec = kernel.spec
    gen = torch.Generator().manual_seed(1)
    cache = kernel.new_cache(3, device="cpu")
    poison(cache)
    slots = torch.tensor([0, desc.page - 1, desc.page + 2, 3 * desc.page - 1])
    values = {k: (v * 3).float() for k, v in random_values(desc, len(slots), gen).items()}
    kernel.write_cache(cache, slots, **values)
    back = storage.read(spec, cache, slots, torch.float64)
    records = Records(desc, cache)
    for s in desc.segs:
        want = round_bf16(values[s.name])
        want = want[:, None] if s.shared else want
        assert torch.equal(back[s.name], want), s.name
        hand = np.stack([records(int(slot))[s.name] for slot in slots])
        np.testing.assert_array_equal(hand, want.numpy())
    # bf16 inputs are stored bit for bit
    bf = {k: v.to(torch.bfloat16) for k, v in values.items()}
    kernel.write_cache(cache, slots, **bf)
    back = storage.read(spec, cache, slots, torch.float64)
    for s in desc.segs:
        want = bf[s.name].double()
        assert torch.equal(back[s.name], want[:, None] if s.shared else want)
    # and the keys/values the reference sees are the slices of them
    k, v = reference.keys_values(spec, cache, slots, torch.float64)
    for j in range(desc.hkv):
        for i in range(len(slots)):
            hk, hv = records.key_value(int(slots[i]), j)
            np.testing.assert_array_equal(k[i, j].numpy(), hk)
            np.testing.assert_array_equal(v[i, j].numpy(), hv)


def test_write_cache_only_touches_its_slots():
    desc = EXAMPLE_DESCS["gqa8"]
    kernel = attncc.compile(desc.text())
    cache = kernel.new_cache(2, device="cpu")
    poison(cache)
    gen = torch.Generator().manual_seed(2)
    kernel.write_cache(cache, torch.tensor([5, 17]), **random_values(desc, 2, gen))
    flat = cache.view(-1, cache.shape[-1])
    for slot in range(32):
        assert flat[slot].isnan().all() == (slot not in (5, 17))
        assert not flat[slot].isnan().any() == (slot in (5, 17))


@pytest.mark.parametrize("separate", [False, True], ids=["packed", "separate"])
def test_write_cache_fp8_e4m3(separate):
    desc = replace(EXAMPLE_DESCS["mla_fp8_sparse"], separate=separate)
    kernel = attncc.compile(desc.text())
    gen = torch.Generator().manual_seed(3)
    n = 6
    values = random_values(desc, n, gen)
    latent = values["latent"]                              # [n, 1, 512], float64
    latent[2, 0, 128:256] = 0.0                            # a zero group
    latent[3, 0, :] = torch.linspace(-1000, 1000, 512, dtype=torch.float64)
    latent[4, 0, 0:128] = 1e-3 * torch.randn(128, generator=gen, dtype=torch.float64)
    latent[4, 0, 5] = 7.0                                  # tiny values next to a big one
    cache = kernel.new_cache(2, device="cpu")
    poison(cache)
    slots = torch.tensor([0, 1, 63, 64, 100, 127])
    kernel.write_cache(cache, slots, **values)

    # scales: amax / 448 per group of 128, as fp32, in the contract's layout
    amax = latent.abs().unflatten(-1, (4, 128)).amax(-1)[:, 0]           # [n, 4]
    if separate:
        scales = cache["latent_scale"].view(-1, 1, 4)[slots, 0].double()
    else:
        raw = cache.view(-1, 656)[slots][:, 512:528].contiguous()
        scales = raw.view(torch.float32).double()                        # [n, 4]
    nonzero = amax > 0
    torch.testing.assert_close(scales[nonzero], (amax / 448)[nonzero], rtol=2e-7, atol=0)
    assert torch.isfinite(scales).all()

    back = storage.read(kernel.spec, cache, slots, torch.float64)["latent"]
    hand = np.stack([Records(desc, cache)(int(s))["latent"] for s in slots])
    np.testing.assert_array_equal(back.numpy(), hand)
    # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal spacing 2^-9 (in units
    # of the scale): |x - x̂| <= |x| / 16 + scale · 2^-10, loosened a little
    s = scales.repeat_interleave(128, dim=-1)[:, None]
    err = (back - latent).abs()
    assert (err <= 0.0625 * latent.abs() * (1 + 1e-6) + s * 2.0 ** -9).all()
    # the largest value of each group is exact up to fp32 rounding (it maps to ±448)
    big = latent.abs().unflatten(-1, (4, 128)).argmax(-1)
    for i in range(n):
        for g in range(4):
            if amax[i, g] > 0:
                j = g * 128 + int(big[i, 0, g])
                assert back[i, 0, j].item() == pytest.approx(latent[i, 0, j].item(), rel=1e-6)
    # a zero group comes back as zeros
    assert (back[2, 0, 128:256] == 0).all()
    assert (back[2, 0, :128] != 0).any()
    # the bf16 rope beside it is exact
    want = round_bf16(values["rope"].float())
    assert torch.equal(storage.read(kernel.spec, cache, slots, torch.float64)["rope"], want)


def test_write_cache_fp8_e5m2_shared_separate_and_packed():
    for separate in (False, True):
        desc = small("e5m2", separate=separate)
        kernel = attncc.compile(desc.text())
        gen = torch.Generator().manual_seed(4)
        values = random_values(desc, 5, gen)
        cache = kernel.new_cache(2, device="cpu")
        poison(cache)
        slots = torch.tensor([1, 2, 8, 9, 15])
        kernel.write_cache(cache, slots, **values)
        back = storage.read(kernel.spec, cache, slots, torch.float64)
        for name in ("k", "v"):
            x = values[name]
            amax = x.abs().unflatten(-1, (-1, 64)).amax(-1)
            s = (amax / 57344).repeat_interleave(64, dim=-1)
            # e5m2: 2 mantissa bits (relative error <= 2^-3), subnormal spacing 2^-16
            err = (back[name] - x).abs()
            assert (err <= 0.125 * x.abs() * (1 + 1e-6) + s * 2.0 ** -16).all(), name
            assert (err > 0).any()  # it really is quantized
        if separate:
            got = cache["k_scale"].view(-1, 2, 2)[slots].double()
            want = values["k"].abs().unflatten(-1, (2, 64)).amax(-1) / 57344
            torch.testing.assert_close(got, want, rtol=2e-7, atol=0)
