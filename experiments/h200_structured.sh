#!/usr/bin/env bash
# Issue 13's speed floor on the H200: constrained (nested JSON schema, the mask applied in
# the decode graph by kernels/mask.cu; arm json: the fill overlapped with the step's body and
# the pinned async upload, arm json-sync: the fill before the step, arm json-ff: json with
# forced tokens fast-forwarded, multi-token rows on the eager path) vs unconstrained decode
# tok/s at batch 1 and 16, on
# the synthetic llama3-8b Q4_K_M and on SmolLM2 (the real model when its alias is cached on
# the device, else the synthetic one at its shapes), interleaved A/B, 5 reps of 128 steps
# (experiments/structured_speed.py). First the mask kernel's kernel-check (checks, launch
# cases, canary) and the emulated-runner test. Run on the device from the repository root
# (carry .synthtok):
#   bash experiments/h200_structured.sh        # writes $OUT/structured.jsonl, $OUT/structured.log
set -u
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/structured.log"; }
source experiments/h200_common.sh
TOK=.synthtok/smollm2-tokenizer.gguf
synthtok "$TOK" || log "no $TOK (make it here: python3 -m memra synth $TOK --tokenizer-only)"
python3 -c "import llguidance" 2>/dev/null || pip install -q llguidance >> "$OUT/structured.log" 2>&1

log "kernel-check mask"
timeout 120 python3 -m memra kernel-check --only mask > "$OUT/kernel-check-mask.txt" 2>&1
log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check-mask.txt")"
grep -v "^PASS" "$OUT/kernel-check-mask.txt" | head -20 | tee -a "$OUT/structured.log"

log "host cost of the mask fill (llguidance's pool vs rows one by one) on this host's CPU"
timeout 300 python3 experiments/structured_host.py --tokenizer "$TOK" --steps 200 >> "$OUT/structured.log" 2>&1
log "structured_host rc=$?"

SMOL=synth:smollm2-135m:Q4_1
timeout 20 python3 -c "from memra.model.aliases import resolve; resolve('smollm2-135m')" > /dev/null 2>&1 && SMOL=smollm2-135m
for m in synth:llama3-8b:Q4_K_M "$SMOL"; do
  log "structured speed $m"
  timeout 560 python3 experiments/structured_speed.py --model "$m" --tokenizer-from "$TOK" --batch 1,16 \
    --steps "${STEPS:-128}" --reps "${REPS:-5}" --out "$OUT/structured.jsonl" >> "$OUT/structured.log" 2>&1
  log "structured speed $m rc=$?"
done
grep SUMMARY "$OUT/structured.log"
log "done"
