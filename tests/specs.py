"""Spec texts for tests beyond examples/: the extra grid of the CUDA path (issue 3)."""
import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def mla(page=64, heads=128, sq=2, causal=True, extra="", elem="bf16"):
    return f"""attention mla_p{page}_h{heads} {{
    heads q = {heads}, kv = 1
    cache paged({page}) {{
        latent: {elem}[512]
        rope:   {elem}[64]
    }}
    key = latent ++ rope
    value = latent
    query len <= {sq}{' causal' if causal else ''}
    scale 0.0721687836
}}
{extra}"""


def separate_kv(name, heads, kv=1, d_k=128, d_v=128, page=16, order="kv", sq=1, causal=False, separate=False,
                extra=""):
    """A GQA / MQA spec whose key and value are segments of their own (`order`: theirs in the record)."""
    segs = {"k": f"k: bf16[{d_k}]", "v": f"v: bf16[{d_v}]"}
    query = f"    query len <= {sq}{' causal' if causal else ''}\n" if sq > 1 or causal else ""
    return (f"attention {name} {{\n    heads q = {heads}, kv = {kv}\n    cache paged({page}){' separate' if separate else ''} "
            f"{{ {segs[order[0]]}  {segs[order[1]]} }}\n    key = k\n    value = v\n{query}}}\n{extra}")


def without_crossover(text: str, name: str) -> str:
    """The spec with its `crossover` schedule knob left out (and named `name`): the same
    attention, each CTA converting its tiles itself."""
    kept = [line for line in text.splitlines() if line.split("#")[0].strip() != "crossover"]
    return re.sub(r"^(attention|schedule) \w+", lambda m: f"{m[1]} {name}", "\n".join(kept), flags=re.M) + "\n"


def gla(name, heads, kv, page=64, latent=256, sq=2, causal=True, extra=""):
    """A GLA-shaped spec: a latent per kv head (key and value), one rope shared by them."""
    return f"""attention {name} {{
    heads q = {heads}, kv = {kv}
    cache paged({page}) {{ latent: bf16[{latent}]  rope: bf16[64] shared }}
    key = latent ++ rope
    value = latent
    query len <= {sq}{' causal' if causal else ''}
}}
{extra}"""


EXTRA = {
    "gqa4_d64": separate_kv("gqa4_d64", heads=16, kv=4, d_k=64, d_v=64, sq=3, causal=True),
    "mqa_d256": separate_kv("mqa_d256", heads=16, d_k=256, d_v=256, page=32),
    "gla4": gla("gla4", heads=64, kv=4, latent=128),
    "gta2_d256": """attention gta2_d256 {
    heads q = 16, kv = 2
    cache paged(16) { tied: bf16[256]  rope: bf16[128] shared }
    key = tied[0:128] ++ rope
    value = tied
}""",
    "mla_page1": mla(page=1, heads=16),
    "mla_page5": mla(page=5, heads=32),
    "mla_page16": mla(page=16, heads=64),
    "mla_page64_h16": mla(page=64, heads=16, sq=1, causal=False),
    # the Hopper family's grid: groups of >= 64 query heads at pages 1, 5, 16 (above), 64
    "mla_page1_h128": mla(page=1, heads=128),
    "mla_page5_h64": mla(page=5, heads=64),
    "mla_page64_h64": mla(page=64, heads=64, sq=1, causal=False),
    "mla_page32_h128": mla(page=32, heads=128),  # TMA tiles of two pages (page 16: four, mla_page16)
    # ... and GLA-shaped values on it: 256 wide (halves of 128) at page 5 (cp.async), 128 wide
    # (halves of 64) at page 64 (TMA); the rope shared by the kv heads
    "gla2_page5": gla("gla2_page5", heads=128, kv=2, page=5),
    "gla2_d128": gla("gla2_d128", heads=128, kv=2, latent=128, sq=1, causal=False),
    # values of <= 256 run stacked (128-row CTAs): a group of 96 gives row blocks of 96 rows
    # (s_q 1: each warp group its own rows, the second's 32 past the end masked) and, at s_q 2, 128
    # rows then 64 (that row block's groups alternate tiles and merge); the seesaw on them too
    # GLA-2 of a 512-wide latent, 48 query heads a kv head (mma_sync), s_q 2 causal: 64-row tiles
    # spill there, the lowering takes 32
    "gla2_w512_causal": gla("gla2_w512_causal", heads=96, kv=2, page=16, latent=512),
    "gla_g96": gla("gla_g96", heads=192, kv=2, page=16),
    "gla2_seesaw": gla("gla2_seesaw", heads=128, kv=2, extra="schedule gla2_seesaw {\n    seesaw\n}\n"),
    "mla_fp8_per64": """attention mla_fp8_per64 {
    heads q = 32, kv = 1
    cache paged(64) {
        latent: e4m3[512] scale fp32 per 64
        rope:   bf16[64]
    }
    key = latent ++ rope
    value = latent
    query len <= 2 causal
}""",
    # ... e5m2 per 32 at page 1, s_q 1 (mma_sync's 32-row fp8 tiles: 64 tokens spilled there)
    "mla_fp8_e5m2_h32": mla(page=1, heads=32, sq=1, causal=False).replace(
        "latent: bf16[512]", "latent: e5m2[512] scale fp32 per 32").replace("mla_p1_h32", "mla_fp8_e5m2_h32"),
    # ... and a 32-wide rope (d_k 544: no whole 64-column steps) at h_q 64 (64-row tiles)
    "mla_fp8_rope32": """attention mla_fp8_rope32 {
    heads q = 64, kv = 1
    cache paged(16) { latent: e5m2[512] scale fp32 per 64  rope: bf16[32] }
    key = latent ++ rope
    value = latent
}""",
    "mla_fp8_dense128": """attention mla_fp8_dense128 {
    heads q = 16, kv = 1
    cache paged(16) {
        latent: e4m3[512] scale fp32 per 128
        rope:   bf16[64]
    }
    key = latent ++ rope
    value = latent
}""",
    "sparse_bf16": """attention sparse_bf16 {
    heads q = 32, kv = 1
    cache paged(64) { latent: bf16[512]  rope: bf16[64] }
    key = latent ++ rope
    value = latent
    tokens topk 128
    query len <= 2
}""",
    "sparse_bf16_h128": """attention sparse_bf16_h128 {
    heads q = 128, kv = 1
    cache paged(64) { latent: bf16[512]  rope: bf16[64] }
    key = latent ++ rope
    value = latent
    tokens topk 200
    query len <= 2
}""",
    # fp8 and sparse on the Hopper family (groups of >= 64): the seesaw dequantizing e4m3 per 64
    # at page 1, the stacked schedule e5m2 per 32 at page 16 (a shared bf16 rope), sparse fp8 at
    # page 5 (examples/mla_fp8_sparse.attn: e4m3 per 128, page 64, h_q 128)
    "mla_fp8_page1_h64": mla(page=1, heads=64).replace("latent: bf16[512]", "latent: e4m3[512] scale fp32 per 64")
                                             .replace("mla_p1_h64", "mla_fp8_page1_h64"),
    # ... e4m3 per 32 at page 16 (a scale a 16-value chunk, copied beside it: the part kernels of
    # this path spilled at every page but 1 after adeea97, ptxas)
    "mla_fp8_per32_page16": mla(page=16, heads=64).replace("latent: bf16[512]", "latent: e4m3[512] scale fp32 per 32")
                                                .replace("mla_p16_h64", "mla_fp8_per32_page16"),
    # ... and dense e4m3 per 128 at page 16 (a scale a box pair: one scale word a token and
    # pair, produce.cuh's one_scale_a_pair)
    "mla_fp8_per128_h64": mla(page=16, heads=64).replace("latent: bf16[512]", "latent: e4m3[512] scale fp32 per 128")
                                                .replace("mla_p16_h64", "mla_fp8_per128_h64"),
    # ... at h_q 32 (mma_sync's 32-row tiles, 32 tokens: 64 spilled), s_q up to 4
    "mla_fp8_per128_h32": mla(page=16, heads=32, sq=4).replace("latent: bf16[512]", "latent: e4m3[512] scale fp32 per 128")
                                                      .replace("mla_p16_h32", "mla_fp8_per128_h32"),
    # ... and from a separate cache (latent, its fp32 scales, rope: three tensors), page 7:
    # mma_sync's (the Hopper family takes fp8 from one packed tensor), compute-bound
    "mla_fp8_separate_h64": """attention mla_fp8_separate_h64 {
    heads q = 64, kv = 1
    cache paged(7) separate { latent: e4m3[512] scale fp32 per 128  rope: bf16[64] }
    key = latent ++ rope
    value = latent
    query len <= 2 causal
}""",
    # ... GLA-2's the same way (mma_sync: 64-row tiles of 32 tokens; 64 spilled)
    "gla2_fp8_separate": """attention gla2_fp8_separate {
    heads q = 128, kv = 2
    cache paged(16) separate { latent: e4m3[256] scale fp32 per 64  rope: bf16[64] shared }
    key = latent ++ rope
    value = latent
    query len <= 2 causal
}""",
    "gla_fp8_e5m2": gla("gla_fp8_e5m2", heads=128, kv=2, page=16).replace(
        "latent: bf16[256]", "latent: e5m2[256] scale fp32 per 32"),
    # fp8 per 128 in a packed GLA record: a kv head's copy is 256 values and 2 scales, 264 bytes,
    # so head 1's bytes are 8 mod 16 into the record (raw chunks copied in 8-byte halves)
    "gla_fp8_per128": gla("gla_fp8_per128", heads=128, kv=2, page=3).replace(
        "latent: bf16[256]", "latent: e4m3[256] scale fp32 per 128"),
    "gla_fp8_per128_h16": gla("gla_fp8_per128_h16", heads=16, kv=2, page=64, sq=1, causal=False).replace(
        "latent: bf16[256]", "latent: e5m2[256] scale fp32 per 128"),
    "sparse_fp8_h64": """attention sparse_fp8_h64 {
    heads q = 64, kv = 1
    cache paged(5) {
        latent: e4m3[512] scale fp32 per 128
        rope:   bf16[64]
    }
    key = latent ++ rope
    value = latent
    tokens topk 100
    query len <= 2
}""",
    # crossover (2-CTA clusters sharing the fp8 conversion): dense at page 5 (cp.async, odd
    # pages), e4m3 per 64, causal s_q <= 2; the sparse example without it on both families
    "mla_fp8_crossover": mla(page=5, heads=128).replace("latent: bf16[512]", "latent: e4m3[512] scale fp32 per 64")
                                               .replace("mla_p5_h128", "mla_fp8_crossover")
                         + "schedule mla_fp8_crossover {\n    crossover\n}\n",
    "sparse_fp8_h128": without_crossover((EXAMPLES / "mla_fp8_sparse.attn").read_text(), "sparse_fp8_h128"),
    # sparse bf16 MLA from a separate latent and rope (FlashInfer's layout), h_q 64, page 3: the
    # Hopper family's part kernels spill there, mma_sync runs it
    "sparse_separate_h64": """attention sparse_separate_h64 {
    heads q = 64, kv = 1
    cache paged(3) separate { latent: bf16[512]  rope: bf16[64] }
    key = latent ++ rope
    value = latent
    tokens topk 200
    query len <= 2
}""",
    # `stages 3` on MLA h_q 128 (odd: the seesaw refuses it, mma_sync runs it): 8 warps over
    # 32-token tiles spilled with more than 2 stages, so the lowering takes 16-token tiles
    "mla_stages3": mla(page=1, heads=128).replace("mla_p1_h128", "mla_stages3") + "schedule mla_stages3 {\n    stages 3\n}\n",
    "gqa8_separate": separate_kv("gqa8_separate", heads=32, kv=8, sq=2, causal=True, separate=True),
    # key and value as segments of their own on the Hopper family's stacked schedule (the key's
    # boxes apart from the value's): MQA-256 at h_q 128 from separate tensors (one-page TMA tiles),
    # GQA d128 with a group of 64 at page 5 (cp.async; s_q 1 is the split mode, whose merge
    # outgrows the Q tile), the value first in the record at page 16 (four-page TMA tiles), and a
    # tied K = V at page 1, and GTA's key of two runs (the tied state's first half, the rope) at page 16
    "mqa256_h128": separate_kv("mqa256_h128", heads=128, d_k=256, d_v=256, page=64, sq=2, causal=True, separate=True),
    "gqa_g64_page5": separate_kv("gqa_g64_page5", heads=128, kv=2, page=5, sq=2, causal=True),
    "mqa_vfirst_page16": separate_kv("mqa_vfirst_page16", heads=64, d_v=64, order="vk"),
    "mqa_tied_page1": """attention mqa_tied_page1 {
    heads q = 64, kv = 1
    cache paged(1) { kv: bf16[128] }
    key = kv
    value = kv
    query len <= 3 causal
}""",
    "gta_g64_page16": """attention gta_g64_page16 {
    heads q = 128, kv = 2
    cache paged(16) { tied: bf16[128]  rope: bf16[64] shared }
    key = tied[0:64] ++ rope
    value = tied
    query len <= 2 causal
}""",
    "gla2_separate_fp16": """attention gla2_separate_fp16 {
    heads q = 32, kv = 2
    cache paged(7) separate { latent: fp16[256]  rope: fp16[64] shared }
    key = latent ++ rope
    value = latent
    query len <= 2 causal
}""",
    "fp8_separate_e5m2": """attention fp8_separate_e5m2 {
    heads q = 16, kv = 2
    cache paged(16) separate { c: e5m2[256] scale fp32 per 64  r: bf16[64] shared }
    key = c ++ r
    value = c
}""",
}


def all_specs() -> dict[str, str]:
    """Example files (as paths) and the extra grid (as text), by name."""
    specs = {p.stem: str(p) for p in sorted(EXAMPLES.glob("*.attn"))}
    specs.update(EXTRA)
    return specs
