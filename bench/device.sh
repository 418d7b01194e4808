#!/usr/bin/env bash
# One device call, by stage: bash bench/device.sh STAGE...   (stages: launcher tests det ab sanitize initcheck host bench peers table sparse split)
# Run from the repo root on the GPU machine with `.whl` (lark) carried, `.attncc_cache` if the
# libraries were prebuilt here (C-ABI libraries do not depend on the Python version), and for
# `ab` the `.ab` folder that bench/ab_build.py filled (old_*.so and new_*.so).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 ATTNCC_CACHE_DIR=${ATTNCC_CACHE_DIR:-$PWD/.attncc_cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
for stage in "$@"; do
  case $stage in
  launcher)
    echo "== the compiled launcher (attncc/launcher.py), built for this torch and Python"
    python3 -c "import sysconfig, os, shutil; i = sysconfig.get_paths()['include']; print('Python.h:', os.path.exists(i + '/Python.h'), 'c++:', shutil.which('c++'))"
    /usr/bin/time -f "launcher build %e s" python3 -c "import attncc.launcher as l; print(l.build())" 2>&1 | tail -3 ;;
  tests)
    # every id of the GPU suite, dealt round-robin to JOBS processes side by side (one process
    # takes ~2x the 420 s a stage can give it; the JIT cache's file locks serialize the builds)
    jobs=${JOBS:-5}
    echo "== GPU tests (every test marked gpu), $jobs processes"
    python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/ 2>/dev/null | grep '::' > "$OUT/gpu_ids.txt"
    echo "$(wc -l < "$OUT/gpu_ids.txt") tests"
    for i in $(seq 0 $((jobs - 1))); do
      awk -v n="$jobs" -v i="$i" 'NR % n == i' "$OUT/gpu_ids.txt" > "$OUT/gpu_ids_$i.txt"
      mapfile -t ids < "$OUT/gpu_ids_$i.txt"  # ids as words, unglobbed ([params])
      timeout ${TESTS_TIMEOUT:-480} python3 -m pytest -q -p no:cacheprovider "${ids[@]}" > "$OUT/gpu_tests_$i.log" 2>&1 &
    done
    wait
    for i in $(seq 0 $((jobs - 1))); do echo "process $i: $(tail -1 "$OUT/gpu_tests_$i.log")"; done
    grep -h '^FAILED\|^ERROR' "$OUT"/gpu_tests_*.log | head -30
    python3 -m attncc.cli test examples/mla_fp8_sparse.attn --trials 4 2>&1 | tail -2 ;;
  det)
    # bench/determinism.py, each shape in its own process (a launch failure ends the context):
    # the stacked split mode (GLA-2 s_q 1: session 35's race) on the shapes that showed it, the
    # rows mode (s_q 2) as a control, and a seesaw (MLA) shape
    echo "== determinism: three identical calls, bit for bit, and against the reference"
    for c in "examples/gla2.attn --sq 1" "examples/gla2.attn --sq 1 --splits 1" "examples/gla2.attn --sq 1 --splits 2" \
             "examples/gla2.attn --sq 1 --batch 16 --splits 4" "examples/gla2.attn --sq 1 --batch 16" \
             "examples/gla2.attn --sq 1 --batch 64" "examples/gla2.attn --sq 1 --batch 8 --seqlen 32768" \
             "examples/gla2.attn --sq 2" "examples/mla.attn --heads 128 --sq 2 --batch 64"; do
      # shellcheck disable=SC2086
      timeout 120 python3 bench/determinism.py $c 2>&1 | tail -1
    done | tee "$OUT/determinism.log" ;;
  ab)
    echo "== same-process A/B, .ab/${AB_A:-old}_* vs .ab/${AB_B:-new}_*"
    for c in "mla examples/mla.attn --heads 128 --sq 2 --seqlen 8192" "mla examples/mla.attn --heads 128 --sq 1 --seqlen 8192" \
             "mla_h64 examples/mla.attn --heads 64 --sq 2 --seqlen 8192" "mla examples/mla.attn --heads 128 --seqlen 32768 --batch 1" \
             "mla examples/mla.attn --heads 128 --seqlen 32768 --batch 8" "mla_h16 examples/mla.attn --heads 16 --sq 1 --seqlen 32768" \
             "gla2 examples/gla2.attn --heads 128 --sq 2 --seqlen 8192" "gla2 examples/gla2.attn --heads 128 --sq 1 --seqlen 8192" \
             "gla2 examples/gla2.attn --heads 128 --sq 2 --seqlen 32768 --batch 8" \
             "mla_p1 examples/mla.attn --heads 128 --page 1 --sq 2 --seqlen 8192" \
             "mla_p1 examples/mla.attn --heads 128 --page 1 --sq 1 --seqlen 8192" \
             "gla2_p1 examples/gla2.attn --heads 128 --page 1 --sq 2 --seqlen 8192" \
             "sparse_fp8 bench/sparse_fp8.attn --heads 128 --sq 2 --seqlen 32768" \
             "sparse_fp8 bench/sparse_fp8.attn --heads 128 --sq 1 --seqlen 32768" \
             "sparse_fp8_h64 bench/sparse_fp8.attn --heads 64 --sq 2 --seqlen 32768"; do
      set -- $c; n=$1; shift
      a=.ab/${AB_A:-old}_$n.so b=.ab/${AB_B:-new}_$n.so
      [ -f "$a" ] && [ -f "$b" ] || { echo "$n: skipped (no $a or $b: bench/ab_build.py --only)"; continue; }
      timeout 150 python3 bench/ab.py "$1" "$a" "$b" --rounds 21 "${@:2}" 2>&1 | tail -1
    done | tee "$OUT/ab.log" ;;
  sanitize)
    echo "== compute-sanitizer over every spec (racecheck, memcheck, synccheck: ~90 s on the H200)"
    python3 bench/sanitize.py --tools ${SANITIZE_TOOLS:-racecheck,memcheck,synccheck} --jobs 4 \
      --deadline ${SANITIZE_TIMEOUT:-150} --log "$OUT" ${SANITIZE_ARGS:-} 2>&1 | tee "$OUT/sanitize.log" | tail -30 ;;
  initcheck)
    # the slowest tool: fewer cases (--quick), 8 processes, its own time limit; logs written as it runs
    echo "== initcheck over every spec, --quick"
    python3 bench/sanitize.py --tools initcheck --quick --jobs 8 --deadline ${INITCHECK_TIMEOUT:-300} --log "$OUT" \
      ${SANITIZE_ARGS:-} 2>&1 | tee "$OUT/initcheck.log" | tail -30 ;;
  host)
    echo "== host time of eager calls; eager against graph replay"
    for c in "--batch 1 --seqlen 32768" "--batch 128 --sq 2 --seqlen 8192"; do
      python3 bench/host_profile.py examples/mla.attn $c 2>&1 | tee -a "$OUT/host_profile.log" | tail -16
    done
    python3 bench/host_profile.py examples/gqa8.attn --batch 32 --seqlen 4096 2>&1 | tail -4
    python3 -m attncc.cli bench examples/mla.attn --batch 1,8,128 --heads 128 --sq 1 --seqlen 32768 --page 64 2>&1 | tail -5
    timeout 200 python3 examples/deepseek_decode.py --layers 8 --steps 4 2>&1 | tail -8 ;;
  bench)
    echo "== bench"
    python3 -m attncc.cli bench examples/mla.attn --json "$OUT/bench_mla.json" 2>&1 | tee "$OUT/bench_mla.log" | tail -32
    python3 -m attncc.cli bench examples/gla2.attn --heads 128 --sq 2 --seqlen 8192 --page 64,1 2>&1 | tail -3
    python3 -m attncc.cli bench examples/gqa8.attn --heads 32 --sq 1 --seqlen 8192 --page 16 2>&1 | tail -2
    python3 bench/host_profile.py examples/mla.attn --batch 1 --seqlen 32768 2>&1 | tail -7 ;;
  peers)
    # `../shared/tools/peers-prepare` put FlashMLA's and FA3's sources and sidebyside.py into .peers/
    # (carry it): attncc and the peers (PEERS, default flashmla; fa3 is GLA's) on identical
    # inputs, one reference, CUDA-graph replay (SBS_ARGS: --only ...); the builds side by side
    peers=${PEERS:-flashmla}; path=$PYTHONPATH
    echo "== side by side with $peers (.peers/sidebyside.py --graph)"
    case ,$peers, in *,flashmla,*) [ -d /tmp/peers/FlashMLA ] || MAX_JOBS=${MAX_JOBS:-8} bash .peers/build-flashmla.sh 2>&1 | tail -2 & ;; esac
    case ,$peers, in *,fa3,*) [ -d /tmp/peers/fa/hopper ] || MAX_JOBS=${MAX_JOBS:-8} bash .peers/build-fa3.sh 2>&1 | tail -2 & ;; esac
    wait
    case ,$peers, in *,flashmla,*) path=$path:/tmp/peers/FlashMLA ;; esac
    case ,$peers, in *,fa3,*) path=$path:/tmp/peers/fa/hopper ;; esac
    PYTHONPATH=$path timeout ${SBS_TIMEOUT:-300} python3 .peers/sidebyside.py --graph \
      --systems attncc,$peers --json "$OUT/sidebyside.json" ${SBS_ARGS:-} 2>&1 | tee "$OUT/sidebyside.log" | tail -40 ;;
  table)
    # issue 10's FlashMLA table (PEERS.md's twelve rows: sidebyside's MLA configurations and the
    # --extra rows of bench/flashmla_table.args) and the page 1 / 16 rows, beside FlashMLA
    SBS_ARGS="--check-batches 4 $(tr '\n' ' ' < bench/flashmla_table.args)" PEERS=flashmla SBS_TIMEOUT=${SBS_TIMEOUT:-300} \
      bash "$0" peers ;;
  sparse)
    # FP8 sparse MLA beside FlashMLA (.peers/sparse_fp8.py: b = 128, topk 2048, graph replay), the issue's three rows
    echo "== sparse fp8 beside FlashMLA"
    [ -d /tmp/peers/FlashMLA ] || MAX_JOBS=${MAX_JOBS:-14} bash .peers/build-flashmla.sh 2>&1 | tail -2
    for c in "--hq 128 --sq 2" "--hq 128 --sq 1" "--hq 64 --sq 2"; do
      # shellcheck disable=SC2086
      PYTHONPATH=$PYTHONPATH:/tmp/peers/FlashMLA timeout 200 python3 .peers/sparse_fp8.py $c 2>&1 | tail -3
    done | tee "$OUT/sparse_fp8.log" ;;
  split)
    # one call kernel by kernel beside FlashMLA (bench/kernel_split.py, eager under torch.profiler):
    # dense MLA where b = 8 and b = 1 trail (decode or combine), and the sparse fp8 call
    echo "== kernel split beside FlashMLA"
    [ -d /tmp/peers/FlashMLA ] || MAX_JOBS=${MAX_JOBS:-14} bash .peers/build-flashmla.sh 2>&1 | tail -2
    for c in "--dense --b 8 --sq 1 --sk 32768" "--dense --b 1 --sq 1 --sk 32768" "--dense --b 128 --sq 2 --sk 8192" \
             "--b 128 --hq 128 --sq 2"; do
      # shellcheck disable=SC2086
      PYTHONPATH=$PYTHONPATH:/tmp/peers/FlashMLA timeout 200 python3 bench/kernel_split.py $c 2>&1 | tail -8
    done | tee "$OUT/kernel_split.log" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
