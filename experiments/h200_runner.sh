#!/usr/bin/env bash
# The runner issue's evidence on the H200 (issue 9), in stages of one device call each, after
# the real models were shipped (experiments/ship_models.py; /root/models/{smollm2,gemma3}.gguf):
#   STAGE=prep   (background, `setsid`, while the model parts travel) the synthetic models in
#                $MEMRA_HOME/synth and the kernel-check modules compiled for sm_90a
#   STAGE=check  kernel-check, experiments/gemm_check.py, the GPU tests (runner batch
#                invariance alone vs 63 co-runners, graph vs eager at every bucket, the
#                engine's greedy/gate tests), the invariance receipt, `memra run gemma3-270m`
#   STAGE=evidence  the synthetic models, kernel-check, the invariance receipt (SmolLM2, 1B),
#                `memra profile` of the 8B Q4_K_M and the 1B at 1 and 64 rows
#   STAGE=bench  tg128 of the five issue-9 models (no regression at batch 1), tg128 at
#                8/16/32/64 parallel sequences on 8B Q4_K_M and 1B
#   STAGE=tune   the campaign's stale jobs re-measured, the table frozen, `tune show`
# Run from the repository root on the device, carrying .whl and .synthtok:
#   source .whl/setup.sh && STAGE=check MEMRA_GIT_SHA=<sha> bash experiments/h200_runner.sh
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
START=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$OUT/runner-$STAGE.log"; }
source experiments/h200_common.sh
link_models
SYN="synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0"
R=research/tune/h200-nvidia-h200.jsonl
TOK=.synthtok/smollm2-tokenizer.gguf  # made here: python3 -m memra synth $TOK --tokenizer-only

case "$STAGE" in
prep)
  python3 - "$TOK" llama-1b:Q4_0 llama3-8b:Q4_K_M llama3-8b:Q4_0 llama3-8b:Q8_0 > /root/prep-synth.txt 2>&1 <<'PY'
import sys
from memra.tune.bench import synth_model
for spec in sys.argv[2:]:
    print(synth_model(*spec.split(":"), sys.argv[1]), flush=True)
PY
  python3 -m memra kernel-check --compile-only --arch sm_90a > /root/prep-compile.txt 2>&1
  echo done > /root/prep-done ;;
check)
  log "kernel-check"
  timeout 200 python3 -m memra kernel-check > "$OUT/kernel-check.txt" 2>&1; log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"
  grep -v "^PASS" "$OUT/kernel-check.txt" | head -30 | tee -a "$OUT/runner-$STAGE.log"
  log "gemm_check"
  timeout 240 python3 experiments/gemm_check.py > "$OUT/gemm-check.txt" 2>&1; log "gemm_check rc=$? $(tail -1 "$OUT/gemm-check.txt")"
  grep -E "FAIL|PASS [0-9]" "$OUT/gemm-check.txt" | head -20 | tee -a "$OUT/runner-$STAGE.log"
  log "GPU tests"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/ > "$OUT/gpu-tests.txt" 2>&1
  log "gpu tests rc=$? $(tail -1 "$OUT/gpu-tests.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.txt" | head | tee -a "$OUT/runner-$STAGE.log"
  log "invariance receipt"
  timeout 200 python3 experiments/runner_invariance.py "$OUT/invariance.jsonl" >> "$OUT/runner-$STAGE.log" 2>&1
  log "invariance rc=$?"
  log "memra run gemma3-270m"
  timeout 60 python3 -m memra run gemma3-270m --prompt "The three primary colors are" -n 64 --temp 0 --device gpu \
    > "$OUT/run-gemma3.txt" 2>&1; log "run rc=$? $(grep -m1 -o 'gate prefill=decode: [A-Z-]*' "$OUT/run-gemma3.txt")" ;;
bench)
  while [ ! -f /root/prep-done ]; do sleep 5; done
  BENCH=${BENCH:-python3 -m memra bench}
  for m in $SYN smollm2-135m; do
    timeout 90 $BENCH "$m" -p 0 -n 128 -r 5 --synth-tokenizer $TOK --out "$OUT/bench.jsonl" --tag runner-tg \
      >> "$OUT/runner-$STAGE.log" 2>&1; log "bench $m rc=$?"
  done
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    timeout 150 $BENCH "$m" -p 0 -n 128 -np 1,8,16,32,64 -r 3 --synth-tokenizer $TOK --out "$OUT/bench.jsonl" \
      --tag runner-np >> "$OUT/runner-$STAGE.log" 2>&1; log "bench -np $m rc=$?"
  done
  ;;
evidence)
  # synthetic models first (bench reuses them), then the checks that must hold at this commit
  python3 - "$TOK" llama-1b:Q4_0 llama3-8b:Q4_K_M llama3-8b:Q4_0 llama3-8b:Q8_0 >> "$OUT/runner-$STAGE.log" 2>&1 <<'PY'
import sys
from memra.tune.bench import synth_model
for spec in sys.argv[2:]:
    print(synth_model(*spec.split(":"), sys.argv[1]), flush=True)
PY
  log "synth done"; touch /root/prep-done
  timeout 150 python3 -m memra kernel-check > "$OUT/kernel-check.txt" 2>&1; log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"
  grep -v "^PASS" "$OUT/kernel-check.txt" | head -30 | tee -a "$OUT/runner-$STAGE.log"
  timeout 200 python3 experiments/runner_invariance.py "$OUT/invariance.jsonl" smollm2-135m synth:llama-1b:Q4_0 \
    >> "$OUT/runner-$STAGE.log" 2>&1; log "invariance rc=$?"
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    for rows in 1 64; do
      timeout 60 python3 -m memra profile "$m" --depth 64 --rows $rows --synth-tokenizer $TOK --json >> "$OUT/profile.jsonl" \
        2>> "$OUT/runner-$STAGE.log"; log "profile $m rows=$rows rc=$?"
    done
  done ;;
tune)
  MARGS=""; for m in ${TUNE_MODELS:-$SYN smollm2-135m gemma3-270m}; do MARGS="$MARGS -m $m"; done
  log "tune run --resume ($(wc -l < $R) receipts before)"
  timeout 330 python3 -m memra tune run h200 $MARGS --out "$R" --resume > "$OUT/tune.txt" 2>&1
  log "tune rc=$? ($(wc -l < $R) receipts after)"
  DEV=$(python3 -c "from memra.gpu import cuda; print(cuda.gpu().info.name)")
  timeout 60 python3 -m memra tune freeze "$R" --device "$DEV" --out-dir tune/defaults >> "$OUT/tune.txt" 2>&1; log "freeze rc=$?"
  python3 -m memra tune show --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('stale', [len(t.get('stale') or []) for t in d['tables']])" | tee -a "$OUT/runner-$STAGE.log"
  cp "$R" "$OUT/"; cp tune/defaults/nvidia-h200.json "$OUT/" ;;
esac
log "done"
