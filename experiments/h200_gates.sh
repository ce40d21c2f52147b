#!/usr/bin/env bash
# Issue 16's GPU evidence on the H200, in one device call (< 10 min):
#   1. memra kernel-check over the enumerated launch set, its receipt written to
#      $OUT/kernel-check/nvidia-h200.json (commit it as research/kernel-check/nvidia-h200.json)
#   2. memra kernel-check --status --json against that receipt (must say "current": true)
#   3. the GPU tests this issue rewrote (tests/test_gpu_engine.py: teacher-forced bounds per
#      position, both gates), with -s so each test prints its measured |Δ log-prob| lines
#   4. memra run gemma3-270m --device gpu: both gate lines printed, exit 0
#   5. the teacher-forced noise on the GPU (experiments/gate_noise.py, q8 path, the two real
#      models, 80 positions) against memra.gpu.gate.TF_BOUND, as far as the time allows
# Run from the repository root on the device, after the real models were shipped as for the
# runner (experiments/ship_models.py: bash .models/ship-NN/take.sh, one call per chunk, which
# leaves /root/models/{smollm2,gemma3}.gguf), carrying .whl, with the commit it runs:
#   source .whl/setup.sh && MEMRA_GIT_SHA=<sha of HEAD> bash experiments/h200_gates.sh
# kernel-check comes first (up to 7 min); the rest gets what remains of 9.5 min. Should the
# call run short, STAGE=check (steps 1-2) and STAGE=tests (steps 3-5) split it in two calls.
# Afterwards, on the CPU machine:
#   mkdir -p research/kernel-check && cp <files_at>/kernel-check/nvidia-h200.json research/kernel-check/
#   python3 -m memra kernel-check --status     # current, at the same kernel sources
#   git add research/kernel-check/nvidia-h200.json && git commit
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/h200-gates}; mkdir -p "$OUT/kernel-check"
START=$SECONDS
LOG="$OUT/gates.log"
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
left() { echo $((560 - (SECONDS - START))); }
source experiments/h200_common.sh
link_models "kernel-check will FAIL on its launch set"
log "git ${MEMRA_GIT_SHA:-unknown}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"

STAGE=${STAGE:-all}  # all | check (1, 2) | tests (3, 4, 5): the two halves as separate calls if need be
if [ "$STAGE" != tests ]; then
log "1. kernel-check (launch set + receipt)"
timeout 420 python3 -m memra kernel-check --out "$OUT/kernel-check/" > "$OUT/kernel-check.txt" 2>&1
log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"
grep -E "^(FAIL|NOTE)|^launch set|^device|receipt:" "$OUT/kernel-check.txt" | head -40 | tee -a "$LOG"
grep -c "^PASS" "$OUT/kernel-check.txt" | sed 's/^/PASS lines: /' | tee -a "$LOG"

log "2. kernel-check --status --json"
timeout 90 python3 -m memra kernel-check --status --json --out "$OUT/kernel-check/nvidia-h200.json" \
  > "$OUT/kernel-check-status.json" 2>> "$LOG"
log "status rc=$? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('device', 'current', 'stale', 'sources_hash')}, len(d['uncovered']), 'uncovered;', d['reason'])" "$OUT/kernel-check-status.json" 2>&1)"

fi
[ "$STAGE" = check ] && { log "done"; exit 0; }
log "3. GPU tests (tests/test_gpu_engine.py)"
T=$(left); [ "$T" -gt 330 ] && T=330
timeout "$T" python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_gpu_engine.py > "$OUT/gpu-tests.txt" 2>&1
log "gpu tests rc=$? $(tail -1 "$OUT/gpu-tests.txt")"
grep -E "^gate |^(FAILED|ERROR)" "$OUT/gpu-tests.txt" | head -30 | tee -a "$LOG"

log "4. memra run gemma3-270m --device gpu"
timeout 60 python3 -m memra run gemma3-270m --prompt "The three primary colors are" -n 32 --temp 0 --device gpu \
  > "$OUT/run-gemma3.txt" 2>&1
log "run rc=$? $(grep -E '^gate ' "$OUT/run-gemma3.txt" | tr '\n' ' ')"

T=$(($(left) - 5))
if [ "$T" -gt 40 ]; then
  log "5. teacher-forced noise on the GPU (q8 path, 80 positions), ${T}s"
  timeout "$T" python3 experiments/gate_noise.py --positions 80 --out "$OUT/gate-noise-h200-q8-80pos.jsonl" \
    smollm2-135m gemma3-270m > "$OUT/gate-noise.txt" 2>&1
  log "gate_noise rc=$? $(tail -1 "$OUT/gate-noise.txt" | cut -c1-300)"
else
  log "5. skipped (no time left)"
fi
log "done"
