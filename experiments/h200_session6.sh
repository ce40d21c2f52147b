#!/usr/bin/env bash
# Session 6 (2026-12-01) H200 calls, after the real models were shipped (experiments/ship_models.py:
# bash .models/ship-NN/take.sh, one call per chunk; this script's caller runs the last one).
#   STAGE=tune   the h200-gemm campaign (gemm.cu variant 7's candidates), memra tune freeze into
#                tune/defaults, memra tune show (stale entries), then kernel-check over the new
#                launch set with its receipt and --status
#   STAGE=bench  memra profile of the 8B decode step at 1 / 8 / 16 / 64 rows (8 rows also with
#                MEMRA_MVT=0), tg128 at 1..64 sequences on the 8B Q4_K_M and the 1B (8B at 8
#                rows also with MEMRA_MVT=0), pp512 through the GEMM (8B Q4_K_M, 1B, SmolLM2)
#   STAGE=final1 kernel-check with its receipt and --status, the batch-invariance receipt
#                (experiments/runner_invariance.py: SmolLM2, the 1B, the 8B Q4_K_M), tg128 at
#                1..64 sequences on the 8B Q4_K_M and the 1B, and at 2..5 with MEMRA_MVT=0
#   STAGE=final3 (after .models/smollm2-0{0,1}/take.sh) ncu of gemm.cu variant 7's 64-row glu
#                config, tg128 at batch 1 on the 8B Q4_0 / Q8_0 and SmolLM2 (issue 9's no-regression
#                list with final1's 8B Q4_K_M and 1B), memra profile of the 1B at 1 / 64 rows,
#                tests/test_structured_gpu.py, issue 13's structured speed again (json-ff through
#                verification graphs) and $EXTRA (a command line) if set
#   STAGE=final2 every GPU test, memra run gemma3-270m (the gates), memra profile of the 8B at
#                1 / 16 / 64 rows, pp512 (8B, 1B, SmolLM2), issue 13's structured speed (arms
#                free / json / json-sync / json-ff, the 8B and SmolLM2)
# Results tarred into $OUT/s6-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s6
# issue 13's structured speed (arms free / json / json-sync / json-ff) on the 8B and SmolLM2
structured_speed() {
  for m in synth:llama3-8b:Q4_K_M smollm2-135m; do
    timeout 150 python3 experiments/structured_speed.py --model $m --tokenizer-from $TOK --batch 1,16 --steps 128 --reps 5 \
      --out $R/structured.jsonl >> $R/structured.txt 2>&1
    log "structured $m rc=$? $(el)"
  done
  grep SUMMARY $R/structured.txt | tee -a $R/log.txt
}
if [ "$STAGE" = tune ]; then
  timeout 330 python3 -m memra tune run h200-gemm -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 \
    -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0 --out research/tune/h200-gemm-nvidia-h200.jsonl > $R/tune.txt 2>&1
  log "tune rc=$? $(tail -1 $R/tune.txt) $(el)"
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$? $(tail -1 $R/freeze.txt)"
  python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
  cp research/tune/h200-gemm-nvidia-h200.jsonl tune/defaults/nvidia-h200.json $R/
  kernel_check
elif [ "$STAGE" = final1 ]; then
  kernel_check
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    timeout 150 python3 -m memra bench $m -p 0 -n 128 -np 1,2,3,4,5,8,16,32,64 --synth-tokenizer $TOK --out $R/bench-np.jsonl > $R/bench-np-$(echo $m | tr : _).txt 2>&1
    log "bench np $m rc=$? $(el)"; grep -E "tg128" $R/bench-np-$(echo $m | tr : _).txt | tail -9 | tee -a $R/log.txt
  done
  MEMRA_MVT=0 timeout 60 python3 -m memra bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -np 2,3,4,5 --synth-tokenizer $TOK --tag MEMRA_MVT=0 --out $R/bench-np-mvt0.jsonl > $R/bench-mvt0.txt 2>&1
  log "bench mvt0 rc=$? $(el)"; grep tg128 $R/bench-mvt0.txt | tee -a $R/log.txt
  timeout $(( 560 - ($(date +%s) - T0) )) python3 experiments/runner_invariance.py $R/invariance.jsonl smollm2-135m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M > $R/invariance.txt 2>&1
  log "invariance rc=$? $(el)"; tail -5 $R/invariance.txt | tee -a $R/log.txt
elif [ "$STAGE" = final3 ]; then
  CASES="glu:64:2,1,2,4,2,3,1,2:Q4_K" OUT=$R timeout 90 bash experiments/h200_ncu.sh > $R/ncu.txt 2>&1; log "ncu rc=$? $(el)"
  for m in synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 smollm2-135m; do
    timeout 120 python3 -m memra bench $m -p 0 -n 128 --synth-tokenizer $TOK --out $R/bench-tg.jsonl > $R/bench-tg-$(echo $m | tr : _).txt 2>&1
    log "tg128 $m rc=$? $(el)"; grep tg128 $R/bench-tg-$(echo $m | tr : _).txt | tail -1 | tee -a $R/log.txt
  done
  for rows in 1 64; do
    timeout 60 python3 -m memra profile synth:llama-1b:Q4_0 --depth 64 --rows $rows --synth-tokenizer $TOK --json >> $R/profile-1b.jsonl 2>> $R/profile.err
    log "profile 1B rows $rows rc=$? $(el)"
  done
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_structured_gpu.py > $R/structured-gpu-tests.txt 2>&1
  log "structured gpu tests rc=$? $(tail -1 $R/structured-gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/structured-gpu-tests.txt | head | tee -a $R/log.txt
  structured_speed
  if [ -n "${EXTRA:-}" ]; then timeout 120 bash -c "$EXTRA" > $R/extra.txt 2>&1; log "extra rc=$? $(el)"; tail -5 $R/extra.txt | tee -a $R/log.txt; fi
elif [ "$STAGE" = final2 ]; then
  kernel_check
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
  timeout 60 python3 -m memra run gemma3-270m --prompt "The three primary colors are" -n 32 --temp 0 --device gpu > $R/run-gemma3.txt 2>&1
  log "run gemma3 rc=$? $(grep -E '^gate ' $R/run-gemma3.txt | tr '\n' ' ')"
  for rows in 1 16 64; do
    timeout 90 python3 -m memra profile synth:llama3-8b:Q4_K_M --depth 64 --rows $rows --synth-tokenizer $TOK --json >> $R/profile.jsonl 2>> $R/profile.err
    log "profile 8B rows $rows rc=$? $(el)"
  done
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 smollm2-135m; do
    timeout 60 python3 -m memra bench $m -p 512 -n 0 --synth-tokenizer $TOK --out $R/bench-pp512.jsonl > $R/bench-pp-$(echo $m | tr : _).txt 2>&1
    log "pp512 $m rc=$? $(el)"; grep pp512 $R/bench-pp-$(echo $m | tr : _).txt | tail -1 | tee -a $R/log.txt
  done
  python3 -c "import llguidance" 2>/dev/null || log "no llguidance"
  structured_speed
else
  for rows in 1 8 16 64; do
    timeout 90 python3 -m memra profile synth:llama3-8b:Q4_K_M --depth 64 --rows $rows --synth-tokenizer $TOK --json >> $R/profile.jsonl 2>> $R/profile.err
    log "profile 8B rows $rows rc=$? $(el)"
  done
  MEMRA_MVT=0 timeout 90 python3 -m memra profile synth:llama3-8b:Q4_K_M --depth 64 --rows 8 --synth-tokenizer $TOK --json >> $R/profile-mvt0.jsonl 2>> $R/profile.err
  log "profile 8B rows 8 MEMRA_MVT=0 rc=$? $(el)"
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    timeout 150 python3 -m memra bench $m -p 0 -n 128 -np 1,2,4,8,16,32,64 --synth-tokenizer $TOK --out $R/bench-np.jsonl > $R/bench-np-$(echo $m | tr : _).txt 2>&1
    log "bench np $m rc=$? $(el)"; grep -E "tg128|np" $R/bench-np-$(echo $m | tr : _).txt | tail -8 | tee -a $R/log.txt
  done
  MEMRA_MVT=0 timeout 60 python3 -m memra bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -np 1,8 --synth-tokenizer $TOK --tag MEMRA_MVT=0 --out $R/bench-np-mvt0.jsonl > $R/bench-mvt0.txt 2>&1
  log "bench mvt0 rc=$? $(el)"; tail -4 $R/bench-mvt0.txt | tee -a $R/log.txt
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 smollm2-135m; do
    timeout 60 python3 -m memra bench $m -p 512 -n 0 --synth-tokenizer $TOK --out $R/bench-pp512.jsonl > $R/bench-pp-$(echo $m | tr : _).txt 2>&1
    log "pp512 $m rc=$? $(el)"; tail -2 $R/bench-pp-$(echo $m | tr : _).txt | tee -a $R/log.txt
  done
fi
tar czf $OUT/s6-$STAGE.tgz -C $R .
