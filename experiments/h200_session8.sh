#!/usr/bin/env bash
# Session 8 (2026-12-01) H200 calls, after the seven .models/ship-NN/take.sh calls (the last one
# carrying .whl and .synthtok); each call carries [".whl", ".llamacpp", ".synthtok"].
#   STAGE=kc       kernel-check over the launch set with the attn_fa family (MEMRA_ATTN=fa, its
#                  receipt copied to $OUT at once) while experiments/h200_serve.sh STAGE=build
#                  builds llama.cpp (llama-bench, llama-server) and the synthetic 8B / 1B, and the
#                  8B's Q4_0 and Q8_0 mixes are written
#   STAGE=evidence experiments/h200_serve.sh STAGE=evidence: tests/test_serve_gpu.py on SmolLM2,
#                  then `memra bench serve` of the 8B Q4_K_M against llama-server, c = 1, 8, 32, 64
#   STAGE=bench    `memra bench --vs llama.cpp` (pp512 + tg128, one run per model: SmolLM2,
#                  Gemma-3, the 1B Q4_0, the 8B Q4_K_M / Q4_0 / Q8_0; the 8B Q4_K_M also at depth
#                  4096), then pp512 + tg128 with MEMRA_ATTN=fa of SmolLM2, Gemma-3 and the 8B
#                  Q4_K_M, then every GPU test in the time left
# Results tarred into $OUT/s8-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s8
LB=/root/llama.cpp/build/bin/llama-bench
if [ "$STAGE" = kc ]; then
  ( OUT=$R STAGE=build bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  ( for q in Q4_0 Q8_0; do python3 -c "import sys; from memra.tune.bench import synth_model; synth_model('llama3-8b', sys.argv[1], sys.argv[2])" $q $TOK; done ) > $R/synth.txt 2>&1 &
  SYN=$!
  kernel_check
  grep -E "attn_fa" $R/kernel-check.txt | head -12 | tee -a $R/log.txt
  cp $R/kernel-check/nvidia-h200.json $R/kernel-check.txt $OUT/ 2>/dev/null
  wait $BUILD $SYN; log "serve build: $(tail -4 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  ls -la /root/llama.cpp/build/bin/ | grep llama | tee -a $R/log.txt
elif [ "$STAGE" = evidence ]; then
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
elif [ "$STAGE" = bench ]; then
  [ -x $LB ] || log "no llama-bench: STAGE=kc builds it"
  for m in smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0; do
    f=$(echo $m | tr : _)
    timeout 120 python3 -m memra bench $m -p 512 -n 128 --vs llama.cpp --llama-bench $LB --synth-tokenizer $TOK \
      --out $R/bench-vs.jsonl > $R/bench-$f.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-$f.txt | tail -5 | tee -a $R/log.txt
    cp $R/bench-vs.jsonl $OUT/ 2>/dev/null
  done
  timeout 150 python3 -m memra bench synth:llama3-8b:Q4_K_M -p 512 -n 128 -d 4096 --vs llama.cpp --llama-bench $LB \
    --synth-tokenizer $TOK --out $R/bench-vs.jsonl > $R/bench-8b-d4096.txt 2>&1
  log "bench 8B d4096 rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-8b-d4096.txt | tail -5 | tee -a $R/log.txt
  cp $R/bench-vs.jsonl $OUT/ 2>/dev/null
  for m in smollm2-135m gemma3-270m synth:llama3-8b:Q4_K_M; do
    f=$(echo $m | tr : _)
    MEMRA_ATTN=fa timeout 100 python3 -m memra bench $m -p 512 -n 128 --synth-tokenizer $TOK --tag MEMRA_ATTN=fa \
      --out $R/bench-fa.jsonl > $R/bench-fa-$f.txt 2>&1
    log "bench fa $m rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-fa-$f.txt | tail -3 | tee -a $R/log.txt
    cp $R/bench-fa.jsonl $OUT/ 2>/dev/null
  done
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
fi
tar czf $OUT/s8-$STAGE.tgz -C /tmp s8-$STAGE
