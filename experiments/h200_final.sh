#!/usr/bin/env bash
# The session's closing device call: finish the H200 campaign (--resume measures only the
# jobs the first call's time limit cut), freeze the table again, then `memra bench` all six
# cells of issue 3's table with it (pp512 + tg128, -r 5), in one run. Run after the real
# models were shipped (experiments/ship_models.py), carrying .whl, .synthtok, ship-05:
#   bash .models/ship-05/take.sh && source .whl/setup.sh && MEMRA_GIT_SHA=<sha> bash experiments/h200_final.sh
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/final.log"; }
M=$HOME/.cache/memra/models; mkdir -p "$M"
ln -sf /root/models/smollm2.gguf "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
ln -sf /root/models/gemma3.gguf "$M/gemma-3-270m-q4_k_m.gguf"
TOK=.synthtok/smollm2-tokenizer.gguf
R=research/tune/h200-nvidia-h200.jsonl
SYN="synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0"
MODELS="$SYN smollm2-135m gemma3-270m"
nice -n 15 python3 - "$TOK" llama3-8b:Q4_K_M llama3-8b:Q4_0 llama3-8b:Q8_0 llama-1b:Q4_0 > "$OUT/synth.txt" 2>&1 <<'PY' &
import sys
from memra.bench import synth_model
for spec in sys.argv[2:]:
    print(synth_model(*spec.split(":"), sys.argv[1]), flush=True)
PY
SYNTH=$!
MARGS=""; for m in $MODELS; do MARGS="$MARGS -m $m"; done
log "tune run --resume ($(wc -l < $R) receipts before)"
timeout ${TUNE_LIMIT:-150} python3 -m memra tune run h200 $MARGS --out "$R" --resume > "$OUT/tune.txt" 2>&1
log "tune rc=$? ($(wc -l < $R) receipts after)"
DEV=$(python3 -c "from memra import cuda; print(cuda.gpu().info.name)")
timeout 60 python3 -m memra tune freeze "$R" --device "$DEV" >> "$OUT/tune.txt" 2>&1; log "freeze rc=$?"
cp "$R" "$OUT/"; cp tune/defaults/nvidia-h200.json "$OUT/"
wait $SYNTH; log "synth done"
for m in $MODELS; do
  timeout 70 python3 -m memra bench "$m" -p 512 -n 128 -r 5 --synth-tokenizer $TOK --out "$OUT/bench.jsonl" \
    --tag final-tuned >> "$OUT/final.log" 2>&1; log "bench $m rc=$?"
done
log "done"
