"""templates/include/attncc/hopper/wgmma.cuh, the first pieces of the Hopper family: its
warpgroup MMA and 128B-swizzled descriptors against torch, through tests/cpp/wgmma_tile.cu
(one warpgroup, D[64 x 256] = A[64 x 128] B, B K-major as S = Q K^T reads a KV tile and
N-major as O = P V does). The build is checked here (sm_90a, no spills, no serialized wgmma);
the products run on the device."""
import ctypes
import re
import subprocess
from pathlib import Path

import pytest
import torch

import attncc.build

ROOT = Path(__file__).resolve().parents[1]
M, N, K = 64, 256, 128
TILE_BYTES = K * 128  # an N-major B tile: K rows of 128 bytes


def _nvcc():
    try:
        return attncc.build.nvcc()
    except Exception:  # noqa: BLE001 - any failure to find the toolkit means skip
        return None


def _build(tmp_path_factory, source: str):
    if _nvcc() is None:
        pytest.skip("nvcc not found (CUDA toolkit needed)")
    lib = tmp_path_factory.mktemp("hopper") / (Path(source).stem + ".so")
    result = subprocess.run([str(_nvcc()), "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC",
                             "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                             "-I", str(ROOT / "templates" / "include"),
                             str(ROOT / "tests" / "cpp" / source), "-o", str(lib)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return lib, result.stderr


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return _build(tmp_path_factory, "wgmma_tile.cu")


@pytest.fixture(scope="module")
def decode_tile(tmp_path_factory):
    return _build(tmp_path_factory, "hopper_decode_tile.cu")


@pytest.mark.parametrize("which", ["library", "decode_tile"])
def test_builds_without_spills_or_serialized_wgmma(which, request):
    _, log = request.getfixturevalue(which)
    assert "spill stores" in log and not re.search(r"[1-9]\d* bytes (spill|stack)", log), log
    assert "C7515" not in log and "C7511" not in log, log
    assert "C7519" not in log, "a register an mma reads was written after its wgmma.fence"


gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                         reason="needs an sm_90 GPU")


def _run(library, a, b, trans_b, leading=0, stride=0):
    dll = ctypes.CDLL(str(library[0]))
    d = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    status = dll.attncc_test_wgmma(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                                   ctypes.c_void_p(d.data_ptr()), int(trans_b), leading, stride)
    assert status == 0, f"CUDA error {status}"
    return d


@pytest.mark.gpu
@gpu
def test_k_major_b_is_s_equals_q_k_transposed(library):
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    b = torch.randn(N, K, device="cuda", generator=gen).bfloat16()  # [tokens x d]: a KV tile
    d = _run(library, a, b, trans_b=False)
    torch.testing.assert_close(d, a.float() @ b.float().T, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@gpu
def test_n_major_b_is_o_equals_p_v(library):
    """B [K x N] rows along K (tokens), as the same staged KV tile serves O = P V. The header's
    descriptor (leading offset = one 64-column tile, stride = 8 rows) matches torch; the other
    reading of the PTX tables (leading = 8 rows, stride = one tile) is tried too and must not,
    so the test tells the two apart."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    b = torch.randn(K, N, device="cuda", generator=gen).bfloat16()
    want = a.float() @ b.float()
    torch.testing.assert_close(_run(library, a, b, trans_b=True), want, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(_run(library, a, b, trans_b=True, leading=TILE_BYTES, stride=1024), want,
                               rtol=1e-4, atol=1e-3)
    swapped = _run(library, a, b, trans_b=True, leading=1024, stride=TILE_BYTES)
    assert not torch.allclose(swapped, want, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@gpu
def test_s_then_p_v_with_p_in_registers(library):
    """The decode step's two products without the softmax: S = Q K^T from shared memory, then
    O = bf16(S) V with P straight from S's accumulators (mma_rs) and V N-major."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(64, 128, device="cuda", generator=gen).bfloat16()
    k = torch.randn(64, 128, device="cuda", generator=gen).bfloat16()
    v = torch.randn(64, 256, device="cuda", generator=gen).bfloat16()
    want = (q.float() @ k.float().T).bfloat16().float() @ v.float()
    dll = ctypes.CDLL(str(library[0]))
    o = torch.full((64, 256), float("nan"), dtype=torch.float32, device="cuda")
    status = dll.attncc_test_wgmma_qkv(*(ctypes.c_void_p(t.data_ptr()) for t in (q, k, v, o)))
    assert status == 0, f"CUDA error {status}"
    torch.testing.assert_close(o, want, rtol=2e-3, atol=2e-2)


def test_the_pipeline_primitives_build():
    if _nvcc() is None:
        pytest.skip("nvcc not found (CUDA toolkit needed)")
    result = subprocess.run([str(_nvcc()), "-std=c++17", "-c", "-gencode=arch=compute_90a,code=sm_90a",
                             "-I", str(ROOT / "templates" / "include"),
                             str(ROOT / "tests" / "cpp" / "hopper_barrier.cu"), "-o", "/dev/null"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("tokens", [300, 64, 1, 0])
def test_the_warp_specialized_decode_tile_matches_softmax_attention(decode_tile, tokens):
    """Producer warp group -> mbarriers -> consumer warp group (wgmma, online softmax): 64 rows
    of softmax(q k^T scale) v over `tokens` (a last partial tile; none: out 0, lse -inf)."""
    gen = torch.Generator(device="cuda").manual_seed(4 + tokens)
    q = torch.randn(64, 128, device="cuda", generator=gen).bfloat16()
    k = torch.randn(max(tokens, 1), 128, device="cuda", generator=gen).bfloat16()
    v = torch.randn(max(tokens, 1), 128, device="cuda", generator=gen).bfloat16()
    scale = 128 ** -0.5
    out = torch.full((64, 128), float("nan"), device="cuda")
    lse = torch.full((64,), float("nan"), device="cuda")
    dll = ctypes.CDLL(str(decode_tile[0]))
    status = dll.attncc_test_decode_tile(ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()),
                                         ctypes.c_void_p(v.data_ptr()), tokens, ctypes.c_float(scale),
                                         ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(lse.data_ptr()))
    assert status == 0, f"CUDA error {status}"
    if tokens == 0:
        assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())
        return
    s = (q.float() @ k.float().T) * scale
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=0, atol=1e-3)
    want = torch.softmax(s, -1) @ v.float()
    assert (out - want).norm() / want.norm() < 1e-2


def test_advanced_descriptors_are_the_descriptors_of_the_advanced_addresses(tmp_path):
    """desc_plus (a tile's descriptor built once, each k-step's its start field plus a constant)
    gives, bit for bit, desc_sw128 of the advanced address for every shared-memory address and
    offset up to 80 KB (multiples of 16), K-major (16, 1024) and N-major (a box apart, 1024); on
    the host, through tests/cpp/desc_probe.cu."""
    if _nvcc() is None:
        pytest.skip("nvcc not found (CUDA toolkit needed)")
    lib = tmp_path / "desc_probe.so"
    result = subprocess.run([str(_nvcc()), "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC",
                             "-I", str(ROOT / "templates" / "include"),
                             str(ROOT / "tests" / "cpp" / "desc_probe.cu"), "-o", str(lib)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    probe = ctypes.CDLL(str(lib))
    probe.probe_desc_mismatches.restype = ctypes.c_longlong
    probe.probe_desc_mismatches.argtypes = [ctypes.c_uint32] * 4
    probe.probe_desc_plus.restype = probe.probe_desc_sw128.restype = ctypes.c_uint64
    probe.probe_desc_plus.argtypes = [ctypes.c_uint64, ctypes.c_uint32]
    probe.probe_desc_sw128.argtypes = [ctypes.c_uint32] * 3
    smem = 227 * 1024  # an sm_90 CTA's shared memory
    for leading, stride in ((16, 1024), (8192, 1024), (4096, 1024)):
        assert probe.probe_desc_mismatches(smem, 80 * 1024, leading, stride) == 0, (leading, stride)
    # the fields: start address >> 4 in bits 0-13, leading and stride >> 4 at 16 and 32, 128B swizzle at 62
    d = probe.probe_desc_sw128(0x12400, 8192, 1024)
    assert d == (0x12400 >> 4) | (8192 >> 4) << 16 | (1024 >> 4) << 32 | 1 << 62
    assert probe.probe_desc_plus(d, 0x2020) == d + (0x2020 >> 4)
