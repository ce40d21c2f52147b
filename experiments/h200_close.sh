#!/usr/bin/env bash
# A session's closing evidence on the H200 in two device calls, after the real models were
# shipped (experiments/ship_models.py; the last part travels with the first call):
#   STAGE=check  re-measure the campaign's stale jobs (--resume skips every job measured on
#                the current kernel source), freeze the table, kernel-check, the GPU tests,
#                `memra run gemma3-270m` (argmax gate, greedy tokens) — under 9 minutes
#   STAGE=bench  issue 3's six tg128/pp512 cells with the frozen table (-r 5, one run), and a
#                per-kernel breakdown of llama-1b
# Run on the device from the repository root, carrying .whl and .synthtok:
#   bash .models/ship-05/take.sh && source .whl/setup.sh && STAGE=check MEMRA_GIT_SHA=<sha> bash experiments/h200_close.sh
#   source .whl/setup.sh && STAGE=bench MEMRA_GIT_SHA=<sha> bash experiments/h200_close.sh
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
START=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$OUT/close-$STAGE.log"; }
source experiments/h200_common.sh
M=$HOME/.cache/memra/models; mkdir -p "$M"
ln -sf /root/models/smollm2.gguf "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
ln -sf /root/models/gemma3.gguf "$M/gemma-3-270m-q4_k_m.gguf"
TOK=.synthtok/smollm2-tokenizer.gguf
synthtok "$TOK" || log "no $TOK (make it here: python3 -m memra synth $TOK --tokenizer-only)"
R=research/tune/h200-nvidia-h200.jsonl
SYN="synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0"
MODELS="$SYN smollm2-135m gemma3-270m"
# the synthetic files, written once into $MEMRA_HOME/synth (kept while the machine stays warm)
synth() {
  nice -n 15 python3 - "$TOK" llama3-8b:Q4_K_M llama3-8b:Q4_0 llama3-8b:Q8_0 llama-1b:Q4_0 >> "$OUT/synth.txt" 2>&1 <<'PY'
import sys
from memra.tune.bench import synth_model
for spec in sys.argv[2:]:
    print(synth_model(*spec.split(":"), sys.argv[1]), flush=True)
PY
}

if [ "$STAGE" = check ]; then
  synth &  # for the bench stage, while this one runs
  MARGS=""; for m in $MODELS; do MARGS="$MARGS -m $m"; done
  log "tune run --resume ($(wc -l < $R) receipts before)"
  timeout 200 python3 -m memra tune run h200 $MARGS --out "$R" --resume > "$OUT/tune.txt" 2>&1
  log "tune rc=$? ($(wc -l < $R) receipts after)"
  DEV=$(python3 -c "from memra import cuda; print(cuda.gpu().info.name)")
  timeout 60 python3 -m memra tune freeze "$R" --device "$DEV" --out-dir tune/defaults >> "$OUT/tune.txt" 2>&1; log "freeze rc=$?"
  python3 -m memra tune show --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('stale', [len(t.get('stale') or []) for t in d['tables']])" | tee -a "$OUT/close-$STAGE.log"
  cp "$R" "$OUT/"; cp tune/defaults/nvidia-h200.json "$OUT/"
  log "kernel-check"
  timeout 160 python3 -m memra kernel-check > "$OUT/kernel-check.txt" 2>&1; log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"
  log "GPU tests"
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > "$OUT/gpu-tests.txt" 2>&1; log "gpu tests rc=$? $(tail -1 "$OUT/gpu-tests.txt")"
  log "memra run gemma3-270m"
  P="The three primary colors are"
  timeout 60 python3 -m memra run gemma3-270m --prompt "$P" -n 64 --temp 0 --device gpu > "$OUT/run-gemma3.txt" 2>&1
  timeout 60 python3 -m memra run gemma3-270m --prompt "$P" -n 64 --temp 0 --device gpu --json >> "$OUT/run-gemma3.txt" 2>&1
  log "run rc=$? $(grep -m1 -o 'argmax gate: [A-Z-]*' "$OUT/run-gemma3.txt")"
else
  synth
  log "synth done"
  for m in $MODELS; do
    timeout 70 python3 -m memra bench "$m" -p 512 -n 128 -r 5 --synth-tokenizer $TOK --out "$OUT/bench.jsonl" \
      --tag close-tuned >> "$OUT/close-$STAGE.log" 2>&1; log "bench $m rc=$?"
  done
  breakdown llama-1b 90 "$OUT/close-$STAGE.log" 20
fi
log "done"
