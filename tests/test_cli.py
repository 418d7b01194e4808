"""The `attncc` command line (DESIGN.md §4): `check` and `explain`."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from attncc.cli import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.attn"))

H200_BANDWIDTH = 4.2e12  # bytes/s
H200_FLOPS = 756e12      # FLOP/s

# First principles, from the example files as DESIGN.md §2 prints them:
# name -> (h_q, d_k, d_v, record bytes per token, topk)
FACTS = {
    "mla": (128, 512 + 64, 512, (512 + 64) * 2, 0),
    "mla_fp8_sparse": (128, 512 + 64, 512, 512 * 1 + (512 // 128) * 4 + 64 * 2, 2048),
    "gla2": (128, 256 + 64, 256, 2 * 256 * 2 + 64 * 2, 0),
    "gta4": (32, 64 + 64, 128, 4 * 128 * 2 + 64 * 2, 0),
    "gqa8": (32, 128, 128, 8 * (128 + 128) * 2, 0),
    "mqa": (32, 128, 128, (128 + 128) * 2, 0),
}
BAD_SPEC = "attention bad {\n    heads q = 0, kv = 1\n}\n"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def roofline(name, batch, seqlen, s_q):
    """bytes: the cache read once (or each query token's top-k) + q and out in bf16 + lse
    in fp32; FLOPs: QK and PV for every head and attended token."""
    h_q, d_k, d_v, record, topk = FACTS[name]
    attended = topk or seqlen
    cache_tokens = s_q * topk if topk else seqlen
    nbytes = batch * cache_tokens * record + batch * s_q * h_q * (d_k + d_v) * 2 \
        + batch * s_q * h_q * 4
    flops = 2 * batch * s_q * h_q * attended * (d_k + d_v)
    return nbytes, flops, max(nbytes / H200_BANDWIDTH, flops / H200_FLOPS)


def floor_line(out):
    m = re.search(r"^  floor (\d+\.\d) us \((memory|compute)-bound\)$", out, re.M)
    assert m, out
    return m[1], m[2]


# --- check -------------------------------------------------------------------------------------
def test_examples_are_the_documented_ones():
    assert set(EXAMPLES) == {f"{name}.attn" for name in FACTS}


@pytest.mark.parametrize("example", EXAMPLES)
def test_check_each_example(capsys, example):
    name = example.removesuffix(".attn")
    h_q, d_k, d_v, record, _ = FACTS[name]
    rc, out, err = run(capsys, "check", f"examples/{example}")
    assert rc == 0
    assert err == ""
    # the Hopper family takes groups of >= 64 query heads (MLA's and the sparse fp8's 128, GLA-2's 64)
    family = "hopper" if name in ("mla", "gla2", "mla_fp8_sparse") else "mma_sync"
    assert out == (f"examples/{example}: ok ({name}: d_k {d_k}, d_v {d_v}, {record} bytes/token; "
                   f"family {family})\n")


def test_check_all_examples_at_once(capsys):
    rc, out, err = run(capsys, "check", *(f"examples/{e}" for e in EXAMPLES))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"examples/{e}" for e in EXAMPLES]
    assert all(": ok (" in line for line in lines)


def test_check_bad_file(capsys, tmp_path):
    bad = tmp_path / "bad.attn"
    bad.write_text(BAD_SPEC)
    rc, out, err = run(capsys, "check", str(bad))
    assert rc == 1
    assert "ok" not in out
    assert err.startswith(f"{bad}:2:15: `heads q` must be at least 1\n"), err
    assert "        heads q = 0, kv = 1\n" in err
    assert "\n" + " " * (4 + 14) + "^\n" in err
    assert "Traceback" not in err


def test_check_several_files_one_bad(capsys, tmp_path):
    bad = tmp_path / "bad.attn"
    bad.write_text(BAD_SPEC)
    rc, out, err = run(capsys, "check", "examples/mla.attn", str(bad), "examples/gqa8.attn")
    assert rc == 1
    # the good ones are still reported, in order, after the bad one
    assert out.splitlines() == [
        "examples/mla.attn: ok (mla: d_k 576, d_v 512, 1152 bytes/token; family hopper)",
        "examples/gqa8.attn: ok (gqa8: d_k 128, d_v 128, 4096 bytes/token; family mma_sync)",
    ]
    assert err.startswith(f"{bad}:2:15: "), err
    assert "examples/" not in err


def test_check_two_bad_files_reports_both(capsys, tmp_path):
    first, second = tmp_path / "one.attn", tmp_path / "two.attn"
    first.write_text(BAD_SPEC)
    second.write_text("attention two {\n    heads q = 4, kv = 4\n    cache paged(16) {\n"
                      "        k: bf61[8]\n    }\n}\n")
    rc, out, err = run(capsys, "check", str(first), str(second))
    assert rc == 1 and out == ""
    assert f"{first}:2:15: " in err
    assert f"{second}:4:12: unknown dtype `bf61`" in err
    assert "did you mean `bf16`?" in err


def test_check_missing_file(capsys, tmp_path):
    missing = tmp_path / "missing.attn"
    rc, out, err = run(capsys, "check", str(missing))
    assert rc == 1 and out == ""
    assert "no such spec file" in err and str(missing) in err
    assert "Traceback" not in err


# --- explain -----------------------------------------------------------------------------------
def test_explain_mla(capsys):
    rc, out, err = run(capsys, "explain", "examples/mla.attn", "--batch", "128", "--seqlen", "8192")
    assert rc == 0 and err == ""
    assert "1152 bytes/token" in out
    assert "record: 1152 bytes/token" in out
    assert "intensity: 241.8 FLOPs/byte at s_q = 1" in out
    # 2*128*(576+512) FLOPs per token over 1152 bytes
    assert f"{2 * 128 * (576 + 512) / 1152:.1f}" == "241.8"
    assert "d_k = 576" in out and "d_v = 512" in out

    b, s_k, s_q, h_q = 128, 8192, 1, 128
    nbytes = b * s_k * 1152 + b * s_q * h_q * (576 + 512) * 2 + b * s_q * h_q * 4
    flops = 2 * b * s_q * h_q * s_k * (576 + 512)
    floor_us = max(nbytes / 4.2e12, flops / 756e12) * 1e6
    value, bound = floor_line(out)
    assert value == f"{floor_us:.1f}"
    assert float(value) == pytest.approx(floor_us, abs=0.05)
    assert bound == ("compute" if flops / 756e12 > nbytes / 4.2e12 else "memory")
    assert f"bytes moved {nbytes / 1e9:.3f} GB" in out
    assert f"FLOPs {flops / 1e9:.3f} GFLOP" in out
    assert "batch 128, seqlen 8192, s_q 1" in out


@pytest.mark.parametrize("name, batch, seqlen, s_q", [
    ("mla", 128, 8192, 1),
    ("mla", 128, 8192, 2),
    ("mla", 1, 4096, 1),
    ("gla2", 64, 16384, 2),
    ("gqa8", 16, 4096, 1),
    ("mqa", 32, 32768, 1),
    ("gta4", 8, 1000, 1),
])
def test_explain_floor_from_first_principles(capsys, name, batch, seqlen, s_q):
    rc, out, err = run(capsys, "explain", f"examples/{name}.attn", "--batch", str(batch),
                       "--seqlen", str(seqlen), "--sq", str(s_q))
    assert rc == 0 and err == ""
    h_q, d_k, d_v, record, _ = FACTS[name]
    assert f"record: {record} bytes/token" in out
    assert f"intensity: {2 * h_q * (d_k + d_v) / record:.1f} FLOPs/byte at s_q = 1" in out
    nbytes, flops, floor_s = roofline(name, batch, seqlen, s_q)
    value, bound = floor_line(out)
    assert value == f"{floor_s * 1e6:.1f}"
    assert bound == ("memory" if nbytes / H200_BANDWIDTH >= flops / H200_FLOPS else "compute")
    assert f"intensity {flops / nbytes:.1f} FLOPs/byte" in out


def test_explain_bounds_differ_between_mla_and_gqa(capsys):
    """MLA's 241.8 FLOPs/byte sits above the H200 ridge (180), GQA-8's 4 below it."""
    assert 756e12 / 4.2e12 == pytest.approx(180)
    _, out, _ = run(capsys, "explain", "examples/mla.attn", "--batch", "128", "--seqlen", "8192")
    assert floor_line(out)[1] == "compute"
    _, out, _ = run(capsys, "explain", "examples/gqa8.attn", "--batch", "128", "--seqlen", "8192")
    assert floor_line(out)[1] == "memory"


def test_explain_sparse_uses_topk_tokens(capsys):
    outs = []
    for seqlen in ("8192", "100000"):
        rc, out, err = run(capsys, "explain", "examples/mla_fp8_sparse.attn", "--batch", "4",
                           "--seqlen", seqlen)
        assert rc == 0 and err == ""
        outs.append(out)
    out = outs[0]
    assert "656 bytes/token" in out
    assert "top-2048 tokens" in out
    assert "seqlen 8192" not in out
    # the roofline does not depend on the sequence length: only the top-k are read
    roof = [o[o.index("roofline on"):] for o in outs]
    assert roof[0] == roof[1]
    b, topk, h_q = 4, 2048, 128
    nbytes = b * topk * 656 + b * h_q * (576 + 512) * 2 + b * h_q * 4
    flops = 2 * b * h_q * topk * (576 + 512)
    assert (nbytes, flops) == roofline("mla_fp8_sparse", 4, 8192, 1)[:2]
    value, _ = floor_line(out)
    assert value == f"{max(nbytes / 4.2e12, flops / 756e12) * 1e6:.1f}"
    assert f"bytes moved {nbytes / 1e6:.3f} MB" in out


def test_explain_sq_above_query_len_is_an_error(capsys):
    rc, out, err = run(capsys, "explain", "examples/mla.attn", "--sq", "3")
    assert rc != 0
    assert out == ""
    assert "s_q" in err and "2" in err
    assert err.startswith("attncc: error:"), err
    assert "Traceback" not in err


def test_explain_bad_spec_is_positioned(capsys, tmp_path):
    bad = tmp_path / "bad.attn"
    bad.write_text(BAD_SPEC)
    rc, out, err = run(capsys, "explain", str(bad))
    assert rc == 1 and out == ""
    assert err.startswith(f"{bad}:2:15: ")


# --- through a real process --------------------------------------------------------------------
def test_python_dash_m_check(tmp_path):
    bad = tmp_path / "bad.attn"
    bad.write_text(BAD_SPEC)
    proc = subprocess.run([sys.executable, "-m", "attncc.cli", "check", "examples/mla.attn",
                           str(bad)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "examples/mla.attn: ok (mla: d_k 576, d_v 512, 1152 bytes/token; family hopper)\n"
    notes, error = proc.stderr.split(f"{bad}:2:15: `heads q` must be at least 1")
    assert all(line.startswith("attncc: warning: ") for line in notes.splitlines()), notes
    assert "Traceback" not in proc.stderr


def test_python_dash_m_explain(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attncc.cli", "explain", "examples/mla.attn",
                           "--batch", "128", "--seqlen", "8192"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1152 bytes/token" in proc.stdout and "241.8" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "attncc.cli", "explain", "examples/mla.attn",
                           "--sq", "3"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "s_q" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# --- check runs the lowering; unwritable outputs; optional extras ---------------------------------

def test_check_refuses_a_schedule_that_compile_refuses(capsys, tmp_path):
    spec = tmp_path / "t.attn"
    spec.write_text("attention t {\n    heads q = 2, kv = 1\n    cache paged(4) { k: bf16[16] v: bf16[16] }\n"
                    "    key = k\n    value = v\n}\nschedule t {\n    tile q = 128, kv = 64\n}\n")
    rc, out, err = run(capsys, "check", str(spec))
    assert rc == 1 and "ok" not in out
    assert err.startswith(f"{spec}:8:5: ") and "tile q = 128" in err


def test_check_says_which_family_runs_a_spec_or_that_none_does(capsys, tmp_path):
    rc, out, _ = run(capsys, "check", "examples/gqa8.attn")
    assert rc == 0 and "family mma_sync" in out
    narrow = tmp_path / "narrow.attn"
    narrow.write_text("attention n {\n    heads q = 2, kv = 1\n    cache paged(4) { k: bf16[8] v: bf16[8] }\n"
                      "    key = k\n    value = v\n}\n")
    rc, out, _ = run(capsys, "check", str(narrow))
    assert rc == 0 and "CPU reference only" in out and "multiple of 16" in out


def test_compile_to_an_unwritable_directory_is_an_error_not_a_traceback(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc, out, err = run(capsys, "compile", "examples/gqa8.attn", "-o", str(blocker / "out"), "--no-build")
    assert rc == 1 and "Traceback" not in err
    assert err.startswith(f"attncc: error: cannot write the generated sources to {blocker / 'out'}")


def test_bench_plot_without_matplotlib_says_how_to_get_it(capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    rc, _, err = run(capsys, "bench", "examples/gqa8.attn", "--plot", "x.png")
    assert rc == 2 and "pip install 'attncc[plot]'" in err
