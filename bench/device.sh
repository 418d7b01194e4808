#!/usr/bin/env bash
# One device call: GPU tests, JIT timings, benchmarks. Run from the repo root on the GPU
# machine with `.whl` (lark) carried, and `.attncc_cache` carried if libraries were
# prebuilt here (C-ABI libraries do not depend on the Python version).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 ATTNCC_CACHE_DIR=${ATTNCC_CACHE_DIR:-$PWD/.attncc_cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== cold JIT build of one spec (empty cache), then a second process loading it"
python3 - <<'PY' 2>&1 | tee "$OUT/jit.log"
import os, subprocess, sys, tempfile, time
cold = tempfile.mkdtemp()
code = ("import time, warnings; warnings.simplefilter('ignore'); import torch, attncc; t = time.time(); "
        "k = attncc.compile('examples/mla.attn'); k.build(); print(f'{time.time() - t:.3f}')")
env = dict(os.environ, ATTNCC_CACHE_DIR=cold)
first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
print("cold build (compile + nvcc + load):", first.stdout.strip(), "s;", first.stderr.strip().splitlines()[-1:])
print("second process (compile + cached load):", second.stdout.strip(), "s")
PY

echo "== GPU tests"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -25

echo "== bench"
python3 -m attncc.cli bench examples/mla.attn --json "$OUT/bench_mla.json" --plot "$OUT/bench_mla.png" 2>&1 | tee "$OUT/bench_mla.log" | tail -32
python3 -m attncc.cli bench examples/gla2.attn --heads 128 --sq 2 --seqlen 8192 --page 64,1 --json "$OUT/bench_gla2.json" 2>&1 | tail -3 | tee "$OUT/bench_gla2.log"
python3 -m attncc.cli test examples/mla_fp8_sparse.attn --trials 4 2>&1 | tail -2 | tee "$OUT/cli_test.log"
python3 -m attncc.cli bench examples/gqa8.attn --heads 32 --sq 1 --seqlen 8192 --page 16 --json "$OUT/bench_gqa8.json" 2>&1 | tail -2 | tee "$OUT/bench_gqa8.log"
