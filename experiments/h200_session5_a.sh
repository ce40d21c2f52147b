#!/usr/bin/env bash
# Session 5 (2026-12-01) H200 call A: gemm_check of the GEMM FULL instantiation, 8B profiles at 16/64 rows, kernel-check + receipt (STAGE=check of h200_gates.sh), every GPU test, gemma3 run. Needs the real models shipped (ship-00..05 first).
export PYTHONUNBUFFERED=1 COLUMNS=200
bash .models/ship-06/take.sh > /dev/null && echo models ok
S=$(date +%s); T0=$S
( python3 - .synthtok/smollm2-tokenizer.gguf llama3-8b:Q4_K_M llama-1b:Q4_0 > $OUT/synth.txt 2>&1 <<'PY'
import sys
from memra.tune.bench import synth_model
for spec in sys.argv[2:]:
    print(synth_model(*spec.split(":"), sys.argv[1]), flush=True)
PY
) &
timeout 170 python3 experiments/gemm_check.py --types Q4_K,Q6_K,Q4_0,Q8_0 --nbs 16,32,64 > $OUT/gemm-check.txt 2>&1; echo "gemm_check rc=$? $(grep -E 'passed' $OUT/gemm-check.txt | tail -1) $(( $(date +%s) - S ))s"; S=$(date +%s)
wait; F=/root/.cache/memra/synth/llama3-8b-Q4_K_M-smollm2-tokenizer.gguf
for r in 16 64; do timeout 60 python3 -m memra profile $F --rows $r --json > $OUT/profile-8b-r$r.json 2>/dev/null; done; echo "profiles $(( $(date +%s) - S ))s"; S=$(date +%s)
STAGE=check MEMRA_GIT_SHA=$MEMRA_GIT_SHA bash experiments/h200_gates.sh > /dev/null 2>&1; cp $OUT/gates.log $OUT/gates-check.log 2>/dev/null; grep -E "kernel-check rc|status rc|PASS lines" $OUT/gates.log; echo "gates $(( $(date +%s) - S ))s"; S=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > $OUT/gpu-tests.txt 2>&1; echo "gpu tests rc=$? $(tail -1 $OUT/gpu-tests.txt) $(( $(date +%s) - S ))s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head
timeout 60 python3 -m memra run gemma3-270m --prompt "The three primary colors are" -n 32 --temp 0 --device gpu > $OUT/run-gemma3.txt 2>&1; echo "gemma3 rc=$? $(grep -E '^gate ' $OUT/run-gemma3.txt | cut -c1-60 | tr '\n' ' ')"
echo total $(( $(date +%s) - T0 ))s
