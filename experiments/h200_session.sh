#!/usr/bin/env bash
# One device call for a whole session's GPU evidence (after the real models were shipped
# with experiments/ship_models.py): kernel-check, the GPU tests, the Gemma-3 argmax gate and
# greedy tokens against the CPU reference, the tg128/pp512 cells of issue 3's table, and a
# per-kernel breakdown of one decode step (SKIP_BENCH=1: only the checks and the run). Every step has its own time limit; results land
# in $OUT (at most 8 files). Run on the device, from the repository root:
#   bash .models/ship-05/take.sh && source .whl/setup.sh && MEMRA_GIT_SHA=<sha> bash experiments/h200_session.sh
set -u
export PYTHONUNBUFFERED=1
M=$HOME/.cache/memra/models; mkdir -p "$M"
ln -sf /root/models/smollm2.gguf "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
ln -sf /root/models/gemma3.gguf "$M/gemma-3-270m-q4_k_m.gguf"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }

log "kernel-check"
timeout 150 python3 -m memra kernel-check > "$OUT/kernel-check.txt" 2>&1; log "kernel-check rc=$? $(tail -1 "$OUT/kernel-check.txt")"

log "GPU tests"
timeout ${GPU_TESTS_LIMIT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > "$OUT/gpu-tests.txt" 2>&1; log "gpu tests rc=$? $(tail -1 "$OUT/gpu-tests.txt")"

log "memra run gemma3-270m on the GPU"
P="The three primary colors are"
timeout 60 python3 -m memra run gemma3-270m --prompt "$P" -n 64 --temp 0 --device gpu > "$OUT/run-gemma3.txt" 2>&1
timeout 60 python3 -m memra run gemma3-270m --prompt "$P" -n 64 --temp 0 --device gpu --json >> "$OUT/run-gemma3.txt" 2>&1
log "run rc=$? $(grep -m1 -o 'argmax gate: [A-Z-]*' "$OUT/run-gemma3.txt")"

[ -n "${SKIP_BENCH:-}" ] && { log "bench and breakdown skipped (SKIP_BENCH)"; log "done"; exit 0; }
log "bench"
B="python3 -m memra bench -p 512 -n 128 -r 5 --out $OUT/bench.jsonl --tag session-h200"
for m in synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0 smollm2-135m gemma3-270m; do
  timeout 60 $B "$m" >> "$OUT/session.log" 2>&1; log "bench $m rc=$?"
done

log "per-kernel breakdown"
timeout 100 python3 experiments/gpu_engine_check.py run --steps bench --limits bench=95 --bench-budget 80 \
  --only-bench llama3-8b,smollm2-135m --configs q8:pdl --breakdown > /dev/null 2>&1
log "breakdown rc=$?"
python3 experiments/gpu_engine_check.py table 2>&1 | tail -40
log "done"
