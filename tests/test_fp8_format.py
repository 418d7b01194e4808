"""FlashMLA's and vLLM's FP8 MLA token, byte for byte (CPU).

vLLM's `fp8_ds_mla` cache and FlashMLA's quantizer (its V32 sparse-decode token) store a
token in 656 bytes: 512 e4m3 values of the latent, then 4 little-endian fp32 scales (one
per 128 values, amax / 448), then the 64 bf16 values of the rope key. The bytes are laid out
here by hand (struct, not attncc); examples/mla_fp8_sparse.attn must read them as that
token, and attncc's write_cache must write the same bytes."""
from __future__ import annotations

import struct
import warnings
from pathlib import Path

import torch

import attncc
from attncc import reference, storage

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mla_fp8_sparse.attn"
TOKEN, LATENT, ROPE, GROUP = 656, 512, 64, 128


def example():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the example compiles without a warning
        return attncc.compile(EXAMPLE)


def bf16_bytes(x: float) -> bytes:
    """bf16 by round-to-nearest-even of the fp32 bits, little-endian."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", bits >> 16)


def e4m3_byte(x: float) -> int:
    return int(torch.tensor([x]).to(torch.float8_e4m3fn).view(torch.uint8))


def token_bytes(latent: list[float], rope: list[float]) -> tuple[bytes, list[float], list[float]]:
    """One token as the two systems lay it out; also what it decodes to."""
    out, scales, decoded = bytearray(), [], []
    for g in range(LATENT // GROUP):
        group = latent[g * GROUP:(g + 1) * GROUP]
        scale = struct.unpack("<f", struct.pack("<f", max(abs(v) for v in group) / 448.0))[0]
        scales.append(scale)
        for v in group:
            b = e4m3_byte(v / scale)
            out.append(b)
            decoded.append(float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * scale)
    out += struct.pack("<4f", *scales)
    for v in rope:
        out += bf16_bytes(v)
    rope_decoded = [float(torch.tensor([v]).to(torch.bfloat16).float()) for v in rope]
    assert len(out) == TOKEN
    return bytes(out), decoded, rope_decoded


def _tokens(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    latents = (torch.randn(n, LATENT, generator=gen) * torch.rand(n, 1, generator=gen) * 4).tolist()
    ropes = torch.randn(n, ROPE, generator=gen).tolist()
    return [token_bytes(lat, rp) for lat, rp in zip(latents, ropes)], latents, ropes


def test_the_example_is_the_656_byte_token():
    k = example()
    assert k.spec.record_bytes == TOKEN and k.spec.page_size == 64
    latent, rope = k.spec.segment("latent"), k.spec.segment("rope")
    assert (latent.offset, latent.values_bytes, latent.copy_bytes) == (0, 512, 528)
    assert rope.offset == 528 and rope.bytes == 128


def test_hand_laid_bytes_read_as_the_token():
    k = example()
    tokens, _, _ = _tokens(5)
    cache = k.new_cache(1, device="cpu")  # [1, 64, 656] uint8
    for slot, (raw, _, _) in enumerate(tokens):
        cache[0, slot] = torch.tensor(list(raw), dtype=torch.uint8)
    got = storage.read(k.spec, cache, torch.arange(5))
    for slot, (_, decoded, rope_decoded) in enumerate(tokens):
        assert torch.equal(got["latent"][slot, 0], torch.tensor(decoded))
        assert torch.equal(got["rope"][slot, 0], torch.tensor(rope_decoded))


def test_write_cache_writes_the_same_bytes():
    k = example()
    tokens, latents, ropes = _tokens(7, seed=3)
    cache = k.new_cache(1, device="cpu")
    k.write_cache(cache, torch.arange(7), latent=torch.tensor(latents)[:, None],
                  rope=torch.tensor(ropes)[:, None].to(torch.bfloat16))
    for slot, (raw, _, _) in enumerate(tokens):
        assert bytes(cache[0, slot].tolist()) == raw, slot


def test_attention_over_hand_laid_bytes_is_attention_over_the_decoded_values():
    k = example()
    tokens, _, _ = _tokens(40, seed=5)
    cache = k.new_cache(1, device="cpu")
    for slot, (raw, _, _) in enumerate(tokens):
        cache[0, slot] = torch.tensor(list(raw), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(1, 1, k.spec.heads_q, 576, generator=gen).to(torch.bfloat16)
    indices = torch.full((1, 1, k.spec.topk), -1, dtype=torch.int32)
    indices[0, 0, :40] = torch.randperm(40, generator=gen).int()
    out, lse = k(q, cache, indices=indices)
    keys = torch.tensor([d + r for _, d, r in tokens], dtype=torch.float64)           # [40, 576]
    scores = q[0, 0].double() @ keys.T * k.spec.softmax_scale                         # [h, 40]
    want = scores.softmax(-1) @ keys[:, :LATENT]
    assert ((out[0, 0].double() - want).norm() / want.norm()).item() < 1e-2
    assert torch.allclose(lse[0, :, 0].double(), torch.logsumexp(scores, -1), atol=1e-3)
    ref_out, _ = reference.attention(k.spec, q, cache, indices=indices, dtype=torch.float64)
    assert torch.allclose(ref_out[0, 0], want, rtol=1e-9, atol=1e-9)
