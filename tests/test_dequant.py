"""templates/include/attncc/core/dequant.cuh's dequant16 (what every fp8 run is staged by, on
both families), every fp8 byte at every kind of scale, bit for bit against torch (float8 ->
float, times the fp32 scale, one rounding to the element type), through
tests/cpp/dequant_probe.cu: normal and subnormal values, NaN (e4m3) and inf (e5m2) bytes beside
ordinary ones, scales from denormal to inf and NaN, both element types. (A faster form must pass
this unchanged: an integer e4m3 path tried in session 21 did, and was slower.) The build is
checked here; the values on the device."""
import ctypes
import re
import subprocess
from pathlib import Path

import pytest
import torch

import attncc.build

ROOT = Path(__file__).resolve().parents[1]
FP8 = {"e4m3": (0, torch.float8_e4m3fn), "e5m2": (1, torch.float8_e5m2)}
ELEM = {"bf16": (0, torch.bfloat16), "fp16": (1, torch.float16)}
# scales: ordinary, exact powers of two, just under 256 and past it, tiny (products in the
# denormals), zero and negative zero, huge, inf and NaN
SCALES = [1.0, 0.0123, 3.0e-3, 0.5, 2.0 ** -20, 255.99998, 256.0, 1.0e4, 3.0e38, 1.0e-38, 1.0e-44, 0.0, -0.0,
          -0.75, float("inf"), float("nan")]


def _build(tmp_path_factory):
    try:
        nvcc = attncc.build.nvcc()
    except Exception:  # noqa: BLE001 - any failure to find the toolkit means skip
        pytest.skip("nvcc not found (CUDA toolkit needed)")
    lib = tmp_path_factory.mktemp("dequant") / "dequant_probe.so"
    result = subprocess.run([str(nvcc), "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC",
                             "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                             "-I", str(ROOT / "templates" / "include"),
                             str(ROOT / "tests" / "cpp" / "dequant_probe.cu"), "-o", str(lib)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return lib, result.stderr


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return _build(tmp_path_factory)


def test_builds_without_spills(probe):
    _, log = probe
    assert "spill stores" in log and not re.search(r"[1-9]\d* bytes (spill|stack)", log), log


def _expected(raw: torch.Tensor, scales: torch.Tensor, fp8, elem) -> torch.Tensor:
    values = raw.view(fp8).float().view(-1, 16)
    return (values * scales[:, None]).to(elem).view(-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("fp8_name", sorted(FP8))
@pytest.mark.parametrize("elem_name", sorted(ELEM))
def test_every_byte_at_every_scale_is_exact(probe, fp8_name, elem_name):
    lib = ctypes.CDLL(str(probe[0]))
    code, fp8 = FP8[fp8_name]
    elem_code, elem = ELEM[elem_name]
    every = torch.arange(256, dtype=torch.uint8)
    # each scale over all 256 bytes in 16 chunks, and the bytes again with a NaN (e5m2: inf)
    # byte in every chunk
    spoiled = every.view(16, 16).clone()
    spoiled[:, 5] = 0x7F if fp8_name == "e4m3" else 0x7C
    raw = torch.cat([torch.cat([every, spoiled.view(-1)]) for _ in SCALES])
    scales = torch.tensor(SCALES, dtype=torch.float32).repeat_interleave(32)
    out = torch.full((raw.numel(),), float("nan"), dtype=elem, device="cuda")  # poisoned
    raw_d, scales_d = raw.cuda(), scales.cuda()
    status = lib.attncc_dequant_probe(code, elem_code, ctypes.c_void_p(raw_d.data_ptr()),
                                      ctypes.c_void_p(scales_d.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                      raw.numel() // 16)
    assert status == 0
    torch.cuda.synchronize()
    want = _expected(raw, scales, fp8, elem)
    got = out.cpu()
    nan_w, nan_g = want.isnan(), got.isnan()
    assert torch.equal(nan_w, nan_g), f"NaN where {torch.nonzero(nan_w != nan_g)[:8].flatten().tolist()}"
    diff = (got.view(torch.int16) != want.view(torch.int16)) & ~nan_w  # bits: -0.0 is not 0.0
    where = torch.nonzero(diff).flatten()[:8].tolist()
    assert not diff.any(), [(i, int(raw[i]), float(scales[i // 16]), float(got[i]), float(want[i])) for i in where]
