#!/usr/bin/env bash
# One device call to verify and measure a fused decode launch (attn_decode_rope: RoPE and
# the KV append inside attention) against its rollback seam, on synthetic models only:
# kernel-check, the tuned table's exactness contract (experiments/table_exactness.py), tg128
# fused and MEMRA_FUSED_ROPE=0 in rounds
# (KC_ONLY=family limits kernel-check, SKIP_EXACT=1 skips the exactness run), and a per-kernel breakdown.
# Run on the device from the repository root (carry .whl and .synthtok):
#   source .whl/setup.sh && MEMRA_GIT_SHA=<sha> bash experiments/h200_fused.sh
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
START=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$OUT/fused.log"; }
source experiments/h200_common.sh
TOK=.synthtok/smollm2-tokenizer.gguf
synthtok "$TOK" || log "no $TOK (make it here: python3 -m memra synth $TOK --tokenizer-only)"
nice -n 15 python3 - "$TOK" llama-1b:Q4_0 smollm2-135m:Q4_1 gemma3-270m:Q4_K_M llama3-8b:Q4_K_M > "$OUT/synth.txt" 2>&1 <<'PY' &
import sys
from memra.tune.bench import synth_model
for spec in sys.argv[2:]:
    print(synth_model(*spec.split(":"), sys.argv[1]), flush=True)
PY
SYNTH=$!

log "kernel-check ${KC_ONLY:+--only $KC_ONLY}"
timeout 150 python3 -m memra kernel-check ${KC_ONLY:+--only $KC_ONLY} > "$OUT/kernel-check.txt" 2>&1; log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"
grep -v "^PASS" "$OUT/kernel-check.txt" | head -20 | tee -a "$OUT/fused.log"

if [ -z "${SKIP_EXACT:-}" ]; then
  log "table exactness"
  timeout 150 python3 experiments/table_exactness.py "$TOK" > "$OUT/table_exactness.jsonl" 2>> "$OUT/fused.log"
  log "table exactness rc=$?"; cat "$OUT/table_exactness.jsonl" >> "$OUT/fused.log"
fi

wait $SYNTH; log "synth done"
bench() {  # bench MODEL TAG [ENV...]
  local m=$1 tag=$2; shift 2
  env "$@" timeout 70 python3 -m memra bench "$m" -p 0 -n 128 -r 5 --synth-tokenizer $TOK \
    --out "$OUT/bench-fused.jsonl" --tag "$tag" >> "$OUT/fused.log" 2>&1; log "bench $m $tag rc=$?"
}
OFF="MEMRA_FUSED_ROPE=0"
for r in 1 2; do
  bench synth:llama-1b:Q4_0 fused MEMRA_X=1
  bench synth:llama-1b:Q4_0 unfused $OFF
done
for m in synth:smollm2-135m:Q4_1 synth:gemma3-270m:Q4_K_M synth:llama3-8b:Q4_K_M; do
  bench $m fused MEMRA_X=1
  bench $m unfused $OFF
done

breakdown llama-1b 90 "$OUT/fused.log" 60
log "done"
