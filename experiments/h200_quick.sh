#!/usr/bin/env bash
# One device call to check kernel changes without the real models: kernel-check, the GPU
# op tests, tg128/pp512 of issue 3's six cells on synthetic models (SmolLM2/Gemma-3 at their
# shapes and quant mixes), and per-kernel breakdowns at a 64-token context. Run on the
# device from the repository root (carry .whl and .synthtok):
#   source .whl/setup.sh && MEMRA_GIT_SHA=<sha> bash experiments/h200_quick.sh
set -u
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/quick.log"; }
source experiments/h200_common.sh
TOK=.synthtok/smollm2-tokenizer.gguf
synthtok "$TOK" || log "no $TOK (make it here: python3 -m memra synth $TOK --tokenizer-only)"

log "kernel-check"
timeout 150 python3 -m memra kernel-check > "$OUT/kernel-check.txt" 2>&1; log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"
grep -v "^PASS" "$OUT/kernel-check.txt" | head -20 | tee -a "$OUT/quick.log"

log "GPU op tests"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_ops.py tests/test_gpu_matvec.py > "$OUT/gpu-tests.txt" 2>&1
log "gpu op tests rc=$? $(tail -1 "$OUT/gpu-tests.txt")"

log "bench"
[ -n "${SKIP_BENCH:-}" ] || for m in synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0 synth:smollm2-135m:Q4_1 synth:gemma3-270m:Q4_K_M; do
  timeout 70 python3 -m memra bench "$m" -p 512 -n 128 -r ${REPS:-3} --synth-tokenizer $TOK --out "$OUT/bench.jsonl" \
    --tag "${TAG:-quick}" >> "$OUT/quick.log" 2>&1; log "bench $m rc=$?"
done

breakdown "${BD_ONLY:-smollm2-135m,gemma3-270m,llama-1b,llama3-8b}" "${BD_LIMIT:-150}" "$OUT/quick.log" 80
log "done"
