#!/usr/bin/env bash
# Issue 12's GPU evidence on the H200 (speculative decoding), in one or two device calls:
#   1. memra spec-check on SmolLM2 and Gemma-3 (the built-in prompts, K = 1..8, greedy and
#      seeded at temperature 0.8, 32 tokens; its own canary must turn red), then on the
#      input-grounded prompt set (research/spec-prompts/prompts.jsonl, --chat, 64 tokens)
#   2. memra spec-check --canary: the broken verifier must exit 1 (DIFFERENT)
#   3. plain vs --spec lookup decode tok/s on the prompt set (experiments/spec_bench.py:
#      interleaved A/B per prompt, REPS each, 256 tokens, greedy; every spec output compared
#      with plain's), JSONL receipts in $OUT/spec-bench.jsonl, one summary line per model
#   4. plain tg128 of both models (memra bench -p 0 -n 128), to compare with the last board:
#      speculation must not slow plain decode
#   5. (time allowing) trim acceptance on chat prompts: spec_bench --spec trim (K auto)
# Run from the repository root on the device, after the real models were shipped as for the
# runner (experiments/ship_models.py: bash .models/ship-NN/take.sh, one call per chunk, which
# leaves /root/models/{smollm2,gemma3}.gguf), carrying .whl, with the commit it runs:
#   source .whl/setup.sh && MEMRA_GIT_SHA=<sha of HEAD> bash experiments/h200_spec.sh
# STAGE=check (1, 2) and STAGE=bench (3, 4, 5) split it into two calls if one runs short.
# Afterwards, on the CPU machine: copy $OUT's *.jsonl and *.txt into
# research/<date>-spec/ and commit them with the figures quoted from the summary lines.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/h200-spec}; mkdir -p "$OUT"
START=$SECONDS
LOG="$OUT/spec.log"
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
left() { echo $((570 - (SECONDS - START))); }
source experiments/h200_common.sh
link_models "spec-check and the bench need it"
log "git ${MEMRA_GIT_SHA:-unknown}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
MODELS=${MODELS:-smollm2-135m gemma3-270m}
PROMPTS=research/spec-prompts/prompts.jsonl
STAGE=${STAGE:-all}

if [ "$STAGE" != bench ]; then
for m in $MODELS; do
  log "1a. spec-check $m (built-in prompts, K 1-8, greedy + seeded)"
  timeout 120 python3 -m memra spec-check "$m" --device gpu --spec lookup -n 32 --json \
    > "$OUT/spec-check-$m.txt" 2>&1
  log "spec-check $m rc=$? $(grep -E '^(ALL IDENTICAL|DIFFERENT|canary)' "$OUT/spec-check-$m.txt" | tr '\n' ' ')"
  log "1b. spec-check $m on the prompt set (--chat, 64 tokens)"
  timeout 150 python3 -m memra spec-check "$m" --device gpu --spec lookup --prompts $PROMPTS --chat -n 64 \
    > "$OUT/spec-check-set-$m.txt" 2>&1
  log "spec-check set $m rc=$? $(grep -E '^(ALL IDENTICAL|DIFFERENT|canary)' "$OUT/spec-check-set-$m.txt" | tr '\n' ' ')"
done
log "2. the canary (--canary must exit 1)"
timeout 60 python3 -m memra spec-check smollm2-135m --device gpu --spec lookup -n 32 --k 8 --canary \
  > "$OUT/spec-check-canary.txt" 2>&1
rc=$?; log "canary rc=$rc ($([ $rc = 1 ] && echo red, as it must be || echo NOT RED)) $(grep -E '^DIFFERENT' "$OUT/spec-check-canary.txt")"
fi
[ "$STAGE" = check ] && { log "done"; exit 0; }

for m in $MODELS; do
  T=$(left); [ "$T" -gt 200 ] && T=200
  log "3. spec_bench $m: plain vs --spec lookup, ${REPS:-3} reps, ${T}s"
  timeout "$T" python3 experiments/spec_bench.py "$m" --spec "${SPEC:-lookup}" --k "${K:-auto}" -n 256 \
    --reps "${REPS:-3}" --out "$OUT/spec-bench.jsonl" 2>> "$LOG"
  log "spec_bench $m rc=$?"
done
for m in $MODELS; do
  log "4. plain tg128 $m"
  timeout 60 python3 -m memra bench "$m" -p 0 -n 128 -r 5 --out "$OUT/bench-tg128.jsonl" >> "$LOG" 2>&1
  log "bench $m rc=$?"
done
T=$(($(left) - 5))
if [ "$T" -gt 60 ]; then
  log "5. trim acceptance (smollm2-135m, --spec trim, K auto), ${T}s"
  timeout "$T" python3 experiments/spec_bench.py smollm2-135m --spec trim --reps 1 -n 128 --limit 6 \
    --out "$OUT/spec-bench-trim.jsonl" 2>> "$LOG"
  log "trim rc=$?"
else
  log "5. skipped (no time left)"
fi
log "done"
